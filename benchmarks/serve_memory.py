"""The serving engine's memory under session churn and bursts (issue 60's measurements), in-process.

    OMP_NUM_THREADS=1 python benchmarks/serve_memory.py --model smollm2-135m --method swa:1024:4 --kv-budget 1GiB

Starts an ``Engine`` (no HTTP) and prints one JSON line per phase with the process's RSS and the KV
pool's use (``engine.stats()``): after start; after ``--sessions`` one-token sessions; after
``--churn`` distinct session ids (``--max-sessions`` kept); after a burst of ``--burst`` concurrent
requests (a ``--prompt-tokens`` prompt, ``--max-tokens`` tokens each); after deleting every session.
"""

from __future__ import annotations

import argparse
import json
import threading
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--method", default="swa:1024:4")
    p.add_argument("--kv-budget", default="1GiB")
    p.add_argument("--max-sessions", type=int, default=64)
    p.add_argument("--sessions", type=int, default=60)
    p.add_argument("--churn", type=int, default=800)
    p.add_argument("--burst", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()

    import psutil
    import torch

    import sinkwindow
    from sinkwindow.cli.args import byte_size
    from sinkwindow.serve.engine import Engine, Job
    from sinkwindow.serve.sessions import SessionStore

    torch.set_num_threads(1)
    proc = psutil.Process()
    model, tok = sinkwindow.load(args.model, method=args.method)
    rss0 = proc.memory_info().rss
    engine = Engine(model, kv_budget=byte_size(args.kv_budget), sessions=SessionStore(args.max_sessions),
                    max_active=args.burst).start()  # fmt: skip

    def report(phase: str, **extra) -> None:
        s = engine.stats()
        row = {"phase": phase, "rss_mib": round(proc.memory_info().rss / 2**20), "rss_before_pool_mib": round(rss0 / 2**20),
               "sessions": s["sessions"], **{k: v for k, v in s.items() if k.startswith("pool_")}, **extra}  # fmt: skip
        print(json.dumps(row), flush=True)

    def run(jobs: list[Job]) -> None:
        left = threading.Semaphore(0)
        for job in jobs:
            job.emit = lambda ev: ev[0] in ("done", "error") and left.release()
            engine.submit(job)
        for _ in jobs:
            left.acquire()

    try:
        report("start", note=engine.pool_note)
        for i in range(args.sessions):
            run([Job(prompt=[tok.bos_token_id or 1], max_new_tokens=1, session=f"one-{i}")])
        report(f"{args.sessions} one-token sessions")
        t0 = time.perf_counter()
        for i in range(args.churn):
            run([Job(prompt=tok(f"hello {i}").input_ids, max_new_tokens=1, session=f"churn-{i}")])
        report(f"{args.churn} distinct session ids", seconds=round(time.perf_counter() - t0, 1))
        text = " ".join(["The quick brown fox jumps over the lazy dog."] * 64)
        prompt = tok(text).input_ids[: args.prompt_tokens]
        run([Job(prompt=prompt, max_new_tokens=args.max_tokens) for _ in range(args.burst)])
        report(f"burst of {args.burst} requests")
        for row in engine.sessions.rows():
            engine.sessions.drop(row["id"])
        report("every session deleted")
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
