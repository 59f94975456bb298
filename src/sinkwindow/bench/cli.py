"""``sinkwindow bench``: decode throughput, prefill time and memory against context length.

    sinkwindow bench --quick
    sinkwindow bench --model synthetic --methods full,swa:64:4,swa:512:4 --contexts 1K,8K,64K,256K --steps 32
    sinkwindow bench --model smollm2-135m --methods full,peer:static-full,swa:64:0,peer:mistral-sw:64 --contexts 2K,8K
    sinkwindow bench --report-only --out runs/bench     # rebuild bench.md / plots from bench.jsonl
    sinkwindow bench --quick --out runs/bench           # again: resumes, measuring only missing cells
    sinkwindow bench --quick --out runs/bench --new-run # start over (old files to previous-<time>/)

Peers, other implementations timed in the same run, are named in --methods beside the specs:
peer:static-full (full attention in transformers' preallocated StaticCache; decode step compiled on
CUDA, eager on CPU; :compiled / :eager to choose) and peer:mistral-sw:W (transformers' own sliding
window: the Llama-family model's weights in MistralForCausalLM with sliding_window = W, stock cache).

Writes ``DIR/bench.jsonl`` (one row per measurement), ``DIR/meta.json``, ``DIR/bench.md``,
``DIR/targets.json`` and PNG plots; prints one progress line per row and ends stdout with a
single JSON line summarising the run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..cli import args as cli_args
from ..cli import errors as cli_errors
from ..models import resolve
from .peers import PEER_HELP, is_peer, parse_peer

__all__ = ["register", "build_parser", "main", "parse_contexts"]


def parse_contexts(text: str) -> tuple[int, ...]:
    """``"1024,8K,256k"`` -> ``(1024, 8192, 262144)`` (k = 1024, M = 1024**2); ``"none"`` -> ``()``.

    An empty string is refused: "no cells" is said with ``none``, never by accident.
    """
    text = str(text).strip()
    if text.lower() == "none":
        return ()
    if not text:
        raise argparse.ArgumentTypeError("no contexts given: list some (e.g. 1K,8K) or say none")
    out = []
    for part in text.split(","):
        try:
            value = cli_args.parse_size(part)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"bad context {part.strip()!r}: use integers like 1024, 8K, 256K ({cli_args.SIZE_HELP})"
            ) from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"contexts must be positive, got {part.strip()!r}")
        out.append(value)
    return tuple(out)


def _peer_name(text: str) -> str | None:
    """``--methods`` items that name a peer (``bench.peers``); ``None`` for a method spec."""
    if not is_peer(text):
        return None
    try:
        return parse_peer(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _names(text: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in str(text).split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"give model names separated by single commas, e.g. synthetic,smollm2-135m; got {text!r}"
        )
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The efficiency benchmark's flags, by group (one function each)."""
    _add_grid_flags(p)
    _add_cap_flags(p)
    _add_device_flags(p)
    _add_synthetic_flags(p)
    _add_output_flags(p)


def _add_grid_flags(p: argparse.ArgumentParser) -> None:
    """The grid: model, methods, contexts, steps."""
    g = p.add_argument_group("grid")
    g.add_argument(
        "--model",
        type=_names,
        default=None,
        help="comma list: synthetic, smollm2-135m, hub ids, folders (default: synthetic,smollm2-135m)",
    )
    cli_args.add_methods(
        g,
        None,
        help="method specs and peers, comma-separated and/or repeated (default: full,swa:64:4,swa:512:4,linear,"
        f"lolcats:64); peers: {PEER_HELP}",
        other=_peer_name,
    )
    g.add_argument(
        "--contexts",
        type=parse_contexts,
        default=None,
        help=f"decode contexts, e.g. 1K,8K,64K; {cli_args.SIZE_HELP} (default: 32 and 128..256K, powers of 2)",
    )
    g.add_argument(
        "--prefill-contexts",
        type=parse_contexts,
        default=None,
        help="prefill contexts, or 'none' (default: 1K..32K)",
    )
    g.add_argument(
        "--steps",
        type=cli_args.integer(1, what="--steps"),
        default=None,
        help="timed decode steps per cell (default: 32)",
    )
    g.add_argument(
        "--warmup",
        type=cli_args.integer(0, what="--warmup"),
        default=None,
        help="untimed decode steps first (default: 4)",
    )
    # Not add_chunk_size: its "(default: ...)" would print None, the value --quick and the config fill in.
    g.add_argument(
        "--chunk-size",
        type=cli_args.integer(1, what="--chunk-size"),
        default=None,
        help="prefill chunk for SWA, tokens (default: 512)",
    )
    g.add_argument(
        "--real-prefill-max",
        type=cli_args.size(0, what="--real-prefill-max"),
        default=None,
        help="decode cells up to this context prefill for real; longer ones fill the cache state directly (default: 4096)",
    )
    g.add_argument("--quick", action="store_true", help="a grid that finishes in a few minutes on 2 cores")


def _add_cap_flags(p: argparse.ArgumentParser) -> None:
    """Caps that end a measurement with a note instead of a crash."""
    c = p.add_argument_group("caps (say so in the output instead of crashing)")
    c.add_argument(
        "--time-cap",
        type=cli_args.real(0, what="--time-cap"),
        default=None,
        help="skip cells predicted to take longer, seconds (default: 300)",
    )
    c.add_argument(
        "--mem-budget-gib",
        type=cli_args.real(0, what="--mem-budget-gib"),
        default=None,
        help="skip cells whose cache is projected above this (default: 8 GiB, at most 40%% of available RAM; 80%% of free GPU memory on CUDA)",
    )


def _add_device_flags(p: argparse.ArgumentParser) -> None:
    """Where and how it runs: device, dtype, threads, bandwidth."""
    d = p.add_argument_group("device")
    d.add_argument(
        "--device",
        type=cli_args.device,
        default=None,
        help="auto (cuda if present), cpu, cuda[:i] (default: auto)",
    )
    cli_args.add_dtype(d, None, auto=True, shown="float32 on CPU, bfloat16 on CUDA")
    cli_args.add_threads(d, help=cli_args.THREADS_HELP)
    d.add_argument(
        "--bandwidth-mib",
        type=cli_args.integer(0, what="--bandwidth-mib"),
        default=None,
        help="bandwidth buffer for the roofline, 0 to skip (default: 1024)",
    )


def _add_synthetic_flags(p: argparse.ArgumentParser) -> None:
    """The synthetic model's shape (paper §4.3 defaults)."""
    s = p.add_argument_group("synthetic model (paper §4.3 defaults)")
    s.add_argument("--layers", type=cli_args.integer(1, what="--layers"), default=4)
    s.add_argument("--hidden", type=cli_args.integer(1, what="--hidden"), default=1024)
    s.add_argument("--heads", type=cli_args.integer(1, what="--heads"), default=16)
    s.add_argument(
        "--kv-heads", type=cli_args.integer(1, what="--kv-heads"), default=None, help="default: = heads"
    )
    s.add_argument(
        "--intermediate",
        type=cli_args.integer(1, what="--intermediate"),
        default=None,
        help="default: 8/3 x hidden rounded to 256",
    )
    s.add_argument("--vocab", type=cli_args.integer(2, what="--vocab"), default=32000)


def _add_output_flags(p: argparse.ArgumentParser) -> None:
    """The run folder and what goes in it."""
    o = p.add_argument_group("output")
    cli_args.add_out(
        o, "runs/bench", help="output folder; a re-run with the same settings measures only the missing cells"
    )
    cli_args.add_new_run(o, other=_peer_name)
    cli_args.add_seed(o, 0)
    o.add_argument("--no-plots", action="store_true")
    o.add_argument(
        "--report-only", action="store_true", help="rebuild the report from DIR/bench.jsonl without measuring"
    )


def config_from_args(args: argparse.Namespace):
    """``BenchConfig`` from parsed arguments (``--quick`` sets the defaults that were not given)."""
    from .suite import BenchConfig
    from .synthetic import SyntheticConfig

    synthetic = SyntheticConfig(
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        kv_heads=args.kv_heads,
        intermediate=args.intermediate,
        vocab=args.vocab,
        seed=args.seed,
    )
    given = {
        "models": args.model,
        "methods": args.methods,
        "contexts": args.contexts,
        "prefill_contexts": args.prefill_contexts,
        "steps": args.steps,
        "warmup": args.warmup,
        "chunk_size": args.chunk_size,
        "real_prefill_max": args.real_prefill_max,
        "time_cap_s": args.time_cap,
        "mem_budget_gib": args.mem_budget_gib,
        "device": args.device,
        "dtype": args.dtype,
        "threads": args.threads,
        "bandwidth_mib": args.bandwidth_mib,
    }
    given = {k: v for k, v in given.items() if v is not None}
    common = dict(synthetic=synthetic, seed=args.seed, out=args.out, plots=not args.no_plots)
    if args.quick:
        return BenchConfig.quick(**given, **common)
    return BenchConfig(**given, **common)


def _progress(row: dict) -> None:
    where = f"{row['model']:<14} {row['kind']:<7} {row['method']:<11} {row['context']:>7}"
    if row["status"] != "ok":
        print(f"{where}  skipped: {row['reason']}", flush=True)
        return
    if row["kind"] == "decode":
        roof = f"  roofline x{row['roofline_ratio']:.2f}" if row.get("roofline_ratio") else ""
        print(
            f"{where}  {row['ms_per_token']:8.2f} ms/tok {row['tokens_per_s']:8.1f} tok/s  "
            f"KV {row['kv_bytes'] / 2**20:9.2f} MiB  peak RSS {row['peak_rss_bytes'] / 2**30:5.2f} GiB  "
            f"fill {row['fill']} {row['fill_s']:.1f}s{roof}",
            flush=True,
        )
    elif row["kind"] == "paired":
        print(
            f"{where}  {row['ms_per_token']:8.2f} ms/tok vs {row['ms_per_token_baseline']:.2f} for {row['baseline']}, "
            f"alternating steps: ratio {row['ratio']:.3f}",
            flush=True,
        )
    else:
        print(
            f"{where}  {row['prefill_s']:8.2f} s      {row['tokens_per_s']:8.0f} tok/s  "
            f"KV {row['kv_bytes'] / 2**20:9.2f} MiB  peak RSS {row['peak_rss_bytes'] / 2**30:5.2f} GiB",
            flush=True,
        )


def _check_models_and_device(args: argparse.Namespace) -> None:
    """Typos fail now, in one line: a device this machine lacks, a model path that does not exist.
    (A packaged model that is not installed is skipped with a warning, so one bench can span models.)"""
    from ..models.loading import looks_like_path

    if args.device is not None:
        resolve.resolve_device(args.device)
    for name in args.model or []:
        path = Path(name).expanduser()
        if looks_like_path(name) and not path.exists():
            raise FileNotFoundError(f"--model {name}: no model folder or file at {path}")


def _cmd_bench(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .report import write_report
    from .rows import load_rows
    from .suite import run_bench

    if args.report_only:
        if not (Path(args.out) / "bench.jsonl").is_file():
            raise FileNotFoundError(
                f"--report-only: no bench.jsonl in {args.out}; measure first with sinkwindow bench --out {args.out}"
            )
        rows = load_rows(Path(args.out))
        plots = not args.no_plots
    else:
        config = config_from_args(args)
        _check_models_and_device(args)
        rows = run_bench(config, on_row=_progress, new_run=args.new_run, redo=args.redo)
        plots = config.plots
    result = write_report(rows, args.out, plots=plots)
    print()
    checks = json.loads((Path(args.out) / "targets.json").read_text())
    fastest = {t["name"]: t for t in checks["min_step"] or []}
    for t in checks["median_step"]:
        ok = {True: "ok  ", False: "MISS", None: "n/a "}[t["ok"]]
        line = f"[{ok}] {t['name']}: {json.dumps(t['value'])}  ({t['goal']}; {t['detail']})"
        if t["name"] in fastest and fastest[t["name"]]["ok"] is not None:
            line += f"  [fastest step: {json.dumps(fastest[t['name']]['value'])}]"
        print(line)
    print(f"report: {Path(args.out) / 'bench.md'}")
    print(json.dumps(result))
    return 0


def register(subparsers) -> None:
    """Add the ``bench`` subcommand to the ``sinkwindow`` CLI."""
    p = subparsers.add_parser(
        "bench",
        help="decode throughput, prefill time and memory against context length (paper §4.3)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(p)
    p.set_defaults(func=_cmd_bench)


def build_parser() -> argparse.ArgumentParser:
    """A standalone parser (for ``benchmarks/bench_efficiency.py``)."""
    p = argparse.ArgumentParser(
        prog="bench_efficiency", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    """The standalone command's exit code; user errors print one line (``--debug``: the traceback)."""
    import logging

    argv = list(sys.argv[1:] if argv is None else argv)

    def run() -> int:
        parser = build_parser()
        cli_args.add_global_flags(parser)
        args = parser.parse_args(argv)
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="%(levelname)s %(name)s: %(message)s",
        )
        return _cmd_bench(args)

    return cli_errors.run_reporting_errors(run, prog="bench_efficiency", debug=cli_errors.wants_debug(argv))


if __name__ == "__main__":
    sys.exit(main())
