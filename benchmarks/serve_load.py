"""Load benchmark of ``sinkwindow serve`` beside ``transformers serve`` on 127.0.0.1: latency and
throughput under concurrency, one session's memory over a long stream, and how many 8K-token
contexts each server holds in one memory budget, measured live.

    python benchmarks/serve_load.py --out benchmarks/results/serve-load-smollm2

Per server (``--methods``: sinkwindow methods such as ``full`` and ``swa:1024:4``, and
``transformers``: ``transformers serve`` on the same model folder, full attention, continuous
batching, on the CPU) it starts the server as a subprocess with ``--threads`` torch threads and:

1. **load**: for each concurrency c (1, 2, 4, 8, 16), ``--rounds`` × c streamed completions of a
   ``--prompt-tokens`` text prompt (the same texts for every server: ``transformers serve`` takes
   no token ids) and ``--max-tokens`` greedy tokens, c at a time: requests/s, completion tokens/s,
   p50/p95 latency (request to last token), time to first token, and the server's RSS (peak
   during the level, sampled every 0.5 s);
2. **session** (sinkwindow only: ``transformers serve`` keeps nothing between requests): one
   session fed ``--chunk-tokens`` tokens per request (and 1 generated) until ``--session-tokens``
   (a model with absolute positions stops at its limit: full attention at 8K on SmolLM2, so the
   SWA side runs ``:cache`` positions to go past it), recording the server's RSS and the
   session's KV bytes after each request;
3. **budget**: ``--budget-tokens``-token contexts created one after another until the server
   refuses one or its RSS passes its idle RSS + ``--budget-gib`` (or ``--budget-max`` contexts or
   ``--budget-time`` seconds): for sinkwindow each context is a session (kept between requests,
   counted live from ``/v1/sessions``), for ``transformers serve``, which has no sessions, a streamed
   request held open after its first token (read to its end in the background: it counts while its
   server is still generating it, and it ends after ``--budget-hold-tokens``, so this count is a
   lower bound of what its cache could hold). The count is what fitted, not a division.

Every measurement is a JSON line of ``OUT/serve_load.jsonl`` as it finishes (with the server, the
settings and the machine's load average), and the summary is printed as Markdown tables. Numbers
from one run compare servers, not machines. Only the loopback address is ever used.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_client import Held, Served, call, stream  # noqa: E402

GiB = 2**30
PEER = "transformers"  # the --methods entry that runs `transformers serve` on the same model


def model_folder(model: str) -> str:
    """The Hugging Face folder of ``model`` (a packaged name's de-quantised cache), for ``transformers serve``."""
    from sinkwindow.models.loading import cache_root, looks_like_path, resolve_gguf

    if looks_like_path(model):
        return str(Path(model).resolve())
    pattern = f"{resolve_gguf(model).stem}-*"
    found = sorted((cache_root() / "converted").glob(pattern))
    if not found:
        import sinkwindow

        sinkwindow.load(model)  # de-quantises it into the cache once
        found = sorted((cache_root() / "converted").glob(pattern))
    return str(found[-1])


def text_prompt(tok, n: int, seed: int) -> str:
    """A reproducible text of ``n`` tokens (re-encoded: what both servers' tokenizers see)."""
    x, ids = seed + 1, []
    lo, hi = min(100, len(tok) // 2), min(len(tok), 40100)  # past the special tokens at the start
    for _ in range(n):
        # A fixed LCG keeps the texts reproducible.
        x = (1103515245 * x + 12345) % 2**31
        ids.append(lo + x % (hi - lo))
    for _ in range(4):  # decode and re-encode until the count is stable at n
        ids = tok(tok.decode(ids), add_special_tokens=False).input_ids[:n]
    return tok.decode(ids)


def start(method: str, args, out: Path, max_active: int, max_sessions: int) -> Served:
    if method == PEER:
        # Its paged cache is sized as a fraction of the machine's free memory (0.8-0.9 by default):
        # bounded here, the machine is shared.
        flags = ["--cb-max-memory-percent", str(args.peer_cache_fraction)]
        served = Served.transformers(args.folder, args.threads, flags, log=out / "transformers-serve.log")
        served.name = args.folder
    else:
        flags = ["--max-active", str(max_active), "--max-queue", "256", "--max-sessions", str(max_sessions)]
        served = Served.sinkwindow(args.model, method, args.threads, flags, log=out / "sinkwindow-serve.log")
        served.name = args.model
    from sinkwindow.runs.provenance import source_commit

    served.commit = source_commit()  # the code the server imports now, at its start
    return served


def _write(out: Path, row: dict) -> None:
    from sinkwindow.runs.provenance import source_commit

    row = {
        **row,
        "loadavg": os.getloadavg()[0],
        "commit": source_commit(),
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    with (out / "serve_load.jsonl").open("a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


class _PeakRSS:
    """The server's peak RSS while the ``with`` block runs, sampled every 0.5 s; past ``cap`` bytes
    the server is killed (its requests fail and are counted as errors): the machine is shared."""

    def __init__(self, served: Served, cap: float):
        self.served, self.peak, self.cap, self._stop = served, served.rss(), cap, threading.Event()

    def _run(self):
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, self.served.rss())
            if self.peak > self.cap and self.served.proc.poll() is None:
                self.served.proc.kill()

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        self.peak = max(self.peak, self.served.rss())


def _health(served: Served) -> dict | None:
    try:
        return call(served.port, "GET", "/health", timeout=60)[1]
    except OSError:
        return None  # it has gone (killed over --max-rss-gib)


def load(served: Served, method: str, args, tok, out: Path) -> None:
    # One request first, not counted: the first forward pays for lazy initialisation.
    stream(served.port, {"model": served.name, "prompt": text_prompt(tok, args.prompt_tokens, 99), "max_tokens": 2,
                         "temperature": 0}, timeout=3600)  # fmt: skip
    for c in args.concurrency:
        n = args.rounds * c
        bodies = [{"model": served.name, "prompt": text_prompt(tok, args.prompt_tokens, i), "max_tokens": args.max_tokens,
                   "temperature": 0} for i in range(n)]  # fmt: skip
        t0 = time.perf_counter()
        with _PeakRSS(served, args.max_rss_gib * GiB) as peak, ThreadPoolExecutor(c) as pool:
            results = list(pool.map(lambda b: stream(served.port, b, timeout=3600), bodies))
        wall = time.perf_counter() - t0
        done = [r for r in results if r["status"] == 200 and r["latency_s"] is not None]
        lat = sorted(r["latency_s"] for r in done) or [math.nan]
        ttft = sorted(r["ttft_s"] for r in done if r["ttft_s"] is not None)
        tokens = sum(r["tokens"] for r in done)
        _write(out, {
            "part": "load", "method": method, "concurrency": c, "requests": n, "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens, "wall_s": round(wall, 3), "requests_per_s": round(len(done) / wall, 3),
            "completion_tokens_per_s": round(tokens / wall, 2), "completion_tokens": tokens,
            "latency_p50_s": round(statistics.median(lat), 3), "latency_p95_s": round(lat[math.ceil(0.95 * len(lat)) - 1], 3),
            "ttft_p50_s": round(statistics.median(ttft), 3) if ttft else None,
            "ttft_p95_s": round(ttft[math.ceil(0.95 * len(ttft)) - 1], 3) if ttft else None,
            "server_rss_peak_bytes": peak.peak, "errors": len(results) - len(done), "threads": args.threads,
            "server": _health(served), "server_commit": served.commit,
        })  # fmt: skip


def session(served: Served, method: str, limit: int, args, tok, out: Path) -> None:
    fed, k = 0, 0
    # Until the stream reaches the limit: the last request is cut to fit (full attention's positions).
    while fed < limit - 2:
        chunk = min(args.chunk_tokens, limit - fed - 2)
        t0 = time.perf_counter()
        status, reply = call(served.port, "POST", "/v1/completions", {
            "model": served.name, "prompt": text_prompt(tok, chunk, 1000 + k), "max_tokens": 1,
            "temperature": 0, "session_id": "long",
        }, timeout=3600)  # fmt: skip
        if status != 200:
            _write(out, {"part": "session", "method": method, "error": reply})
            return
        info = reply["sinkwindow"]["session"]
        fed, k = info["tokens"], k + 1
        _write(out, {"part": "session", "method": method, "session_tokens": fed, "kv_cache_bytes": info["kv_cache_bytes"],
                     "server_rss_bytes": served.rss(), "request_s": round(time.perf_counter() - t0, 3),
                     "chunk_tokens": args.chunk_tokens, "threads": args.threads,
                     "server_commit": served.commit})  # fmt: skip


def _held(served: Served, method: str, args) -> int:
    """Contexts the server holds now: sinkwindow's sessions of the budget's length (from /v1/sessions)."""
    rows = call(served.port, "GET", "/v1/sessions", timeout=60)[1]["data"]
    return sum(r["id"].startswith("budget-") and r["tokens"] >= 0.9 * args.budget_tokens for r in rows)


def budget(served: Served, method: str, args, tok, out: Path) -> None:
    """Create ``--budget-tokens``-token contexts until a refusal, the RSS budget, the count or the time."""
    base = served.rss()
    limit, t_end = base + args.budget_gib * GiB, time.monotonic() + args.budget_time
    conns, held, stop = [], 0, f"--budget-max {args.budget_max}"
    try:
        for k in range(args.budget_max):
            if time.monotonic() > t_end:
                stop = f"--budget-time {args.budget_time:g} s"
                break
            body = {
                "model": served.name,
                "prompt": text_prompt(tok, args.budget_tokens, 5000 + k),
                "temperature": 0,
            }
            t0 = time.perf_counter()
            wait = (
                t_end - time.monotonic() + 60
            )  # a context that is not there by the time limit does not count
            if method == PEER:
                conns.append(Held(served.port, {**body, "max_tokens": args.budget_hold_tokens}, timeout=wait))
                # Held streams end once they have generated their tokens: count those still running.
                status, now = conns[-1].status, sum(h.alive for h in conns)
            else:
                try:
                    status, _ = call(served.port, "POST", "/v1/completions",
                                     {**body, "max_tokens": 1, "session_id": f"budget-{k}"}, timeout=wait)  # fmt: skip
                except TimeoutError:
                    status = None
                now = _held(served, method, args) if status == 200 else held
            rss = served.rss()
            _write(out, {"part": "budget-step", "method": method, "context": k + 1, "status": status, "held": now,
                         "server_rss_bytes": rss, "seconds": round(time.perf_counter() - t0, 2)})  # fmt: skip
            if status != 200:
                stop = "no answer by --budget-time + 60 s" if status is None else f"refused ({status})"
                break
            if rss > limit:
                stop = "RSS over the budget"
                break
            held = max(held, now)
    finally:
        for conn in conns:
            conn.close()
    _write(out, {"part": "budget", "method": method, "held": held, "stopped_by": stop, "budget_tokens": args.budget_tokens,
                 "budget_bytes": int(args.budget_gib * GiB), "idle_rss_bytes": base, "threads": args.threads,
                 "server_commit": served.commit})  # fmt: skip


def _run(method: str, args, tok) -> None:
    parts = set(args.parts.split(","))
    if "load" in parts:
        served = start(method, args, args.out, max(args.concurrency), 4)
        try:
            load(served, method, args, tok, args.out)
        finally:
            served.close()
    if "session" in parts and method != PEER:
        # Past the model's positions a session needs positions inside the cache (:cache).
        long_method = method if method == "full" or method.endswith(":cache") else method + ":cache"
        served = start(long_method, args, args.out, 1, 4)
        try:
            limit = args.session_tokens if long_method != "full" else min(args.session_tokens, 8192)
            session(served, long_method, limit, args, tok, args.out)
        finally:
            served.close()
    if "budget" in parts:
        served = start(method, args, args.out, max(args.concurrency), args.budget_max + 1)
        try:
            budget(served, method, args, tok, args.out)
        finally:
            served.close()


def report(rows: list[dict], args) -> str:
    """The run's Markdown tables: load, the long session, the contexts held in the budget."""
    mib = lambda b: f"{b / 2**20:,.0f}"  # noqa: E731
    out = ["| server | concurrency | req/s | tok/s | p50 s | p95 s | TTFT p50 s | TTFT p95 s | peak RSS MiB |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in (r for r in rows if r["part"] == "load"):
        out.append(f"| {r['method']} | {r['concurrency']} | {r['requests_per_s']} | {r['completion_tokens_per_s']} | "
                   f"{r['latency_p50_s']} | {r['latency_p95_s']} | {r['ttft_p50_s']} | {r.get('ttft_p95_s')} | "
                   f"{mib(r['server_rss_peak_bytes']) if 'server_rss_peak_bytes' in r else ''} |")  # fmt: skip
    out += ["", "| server | session tokens | KV bytes | server RSS MiB |", "|---|---:|---:|---:|"]
    for method in sorted({r["method"] for r in rows if r["part"] == "session" and "kv_cache_bytes" in r}):
        last = [
            r for r in rows if r["part"] == "session" and r["method"] == method and "kv_cache_bytes" in r
        ][-1]
        out.append(
            f"| {method} | {last['session_tokens']} | {last['kv_cache_bytes']} | {mib(last['server_rss_bytes'])} |"
        )
    out += ["", f"| server | {args.budget_tokens}-token contexts held | stopped by | idle RSS MiB | budget MiB |",
            "|---|---:|---|---:|---:|"]  # fmt: skip
    for r in (r for r in rows if r["part"] == "budget"):
        out.append(
            f"| {r['method']} | {r['held']} | {r['stopped_by']} | {mib(r['idle_rss_bytes'])} | {mib(r['budget_bytes'])} |"
        )
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--methods", default=f"full,swa:1024:4,{PEER}",
                   help=f"sinkwindow methods, and {PEER!r} for `transformers serve` (default: %(default)s)")  # fmt: skip
    p.add_argument("--concurrency", default="1,2,4,8,16", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--rounds", type=int, default=2, help="requests per concurrency level = rounds × c")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--session-tokens", type=int, default=100_000)
    p.add_argument("--chunk-tokens", type=int, default=2000)
    p.add_argument(
        "--budget-gib", type=float, default=4.0, help="RSS over the idle server's the contexts may take"
    )
    p.add_argument(
        "--budget-tokens", type=int, default=8000, help="tokens of each context (8K: under SmolLM2's 8,192)"
    )
    p.add_argument("--budget-max", type=int, default=64, help="contexts tried at most")
    p.add_argument(
        "--budget-time", type=float, default=3600.0, help="seconds the budget part may take at most"
    )
    p.add_argument("--budget-hold-tokens", type=int, default=150,
                   help=f"max_tokens of {PEER}'s held requests (they end after that many)")  # fmt: skip
    p.add_argument("--peer-cache-fraction", type=float, default=0.2,
                   help=f"{PEER}'s --cb-max-memory-percent: its paged cache's share of free memory")  # fmt: skip
    p.add_argument("--max-rss-gib", type=float, default=10.0, help="a server past this RSS is killed")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--parts", default="load,session,budget")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer

    args.folder = model_folder(args.model)
    tok = AutoTokenizer.from_pretrained(args.folder)
    for method in args.methods.split(","):
        _run(method, args, tok)
    rows = [json.loads(x) for x in (args.out / "serve_load.jsonl").read_text().splitlines()]
    print("\n" + report(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
