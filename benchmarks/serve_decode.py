"""Decode speed of the serving engine at one request: tokens/s of ``full`` against ``swa:W:S``.

    OMP_NUM_THREADS=1 python benchmarks/serve_decode.py --model smollm2-135m --methods full swa:1024:4

Per method it loads the model and starts an ``Engine`` in-process (no HTTP); then ``--repeats``
rounds each run one greedy request per method, one at a time, the methods interleaved (so a busy
machine slows them alike): a ``--prompt-tokens`` prompt, then ``--max-tokens`` tokens. Decode
tokens/s is (tokens - 1) over the time from the first token to the last (the prefill excluded);
the median over rounds is printed per method as one JSON line, with the engine's stats (pool use,
when the engine has a pool) and the load average. One torch thread unless ``--threads``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time


def _one(engine, job_cls, prompt: list[int], max_tokens: int) -> float:
    stamps: list[float] = []
    done = threading.Event()

    def emit(ev):
        if ev[0] == "token":
            stamps.append(time.perf_counter())
        else:
            done.set()

    engine.submit(job_cls(prompt=prompt, max_new_tokens=max_tokens, emit=emit))
    done.wait()
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--methods", nargs="+", default=["full", "swa:1024:4"])
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import torch

    import sinkwindow
    from sinkwindow.serve.engine import Engine, Job

    torch.set_num_threads(args.threads)
    engines, prompts = {}, {}
    for method in args.methods:
        model, tok = sinkwindow.load(args.model, method=method)
        text = " ".join(["The quick brown fox jumps over the lazy dog."] * 64)
        prompts[method] = tok(text).input_ids[: args.prompt_tokens]
        engines[method] = Engine(model).start()
    speeds = {m: [] for m in args.methods}
    try:
        for m in args.methods:
            _one(engines[m], Job, prompts[m], 4)  # warm-up
        for _ in range(args.repeats):
            for m in args.methods:
                speeds[m].append(_one(engines[m], Job, prompts[m], args.max_tokens))
        for m in args.methods:
            row = {"method": m, "decode_tok_s": round(statistics.median(speeds[m]), 2),
                   "runs": [round(x, 2) for x in speeds[m]], "prompt_tokens": len(prompts[m]),
                   "max_tokens": args.max_tokens, "threads": args.threads, "loadavg": os.getloadavg()[0],
                   "stats": engines[m].stats()}  # fmt: skip
            print(json.dumps(row), flush=True)
    finally:
        for e in engines.values():
            e.stop()


if __name__ == "__main__":
    main()
