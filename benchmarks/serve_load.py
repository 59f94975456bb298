"""Load benchmark of ``sinkwindow serve`` on 127.0.0.1: latency and throughput under concurrency, one
session's memory over a long stream, and how many 8K-token sessions a KV budget holds.

    python benchmarks/serve_load.py --out benchmarks/results/serve-load-smollm2

Per method (default ``full`` and ``swa:1024:4``) it starts ``sinkwindow serve`` as a subprocess and:

1. **load**: for each concurrency c (1, 2, 4, 8, 16), ``--rounds`` × c streamed completions of a
   ``--prompt-tokens`` prompt and ``--max-tokens`` greedy tokens, c at a time: requests/s, completion
   tokens/s, p50/p95 latency (request to last token) and time to first token;
2. **session**: one session fed ``--chunk-tokens`` tokens per request (and 1 generated) until
   ``--session-tokens`` (a model with absolute positions stops at its limit: full attention at 8K
   on SmolLM2, so the SWA side runs ``:cache`` positions to go past it), recording the server's RSS
   and the session's KV bytes after each request;
3. **budget**: the KV bytes of one 8,192-token session (measured in 2), and how many such sessions
   ``--kv-budget`` holds.

Every measurement is a JSON line of ``OUT/serve_load.jsonl`` as it finishes (with the method, the
settings and the machine's load average), and the summary is printed as a Markdown table. The
server runs with ``--threads`` torch threads; numbers from one run compare methods, not machines.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

GiB = 2**30


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _call(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request(
        method,
        path,
        body=None if body is None else json.dumps(body),
        headers={"Content-Type": "application/json"},
    )
    r = conn.getresponse()
    out = (r.status, json.loads(r.read() or b"null"))
    conn.close()
    return out


def _stream(port: int, body: dict) -> dict:
    """One streamed completion: latency to the last token, time to the first, tokens."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("POST", "/v1/completions", body=json.dumps({**body, "stream": True}),
                 headers={"Content-Type": "application/json"})  # fmt: skip
    r = conn.getresponse()
    first, ids = None, []
    for line in r:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if first is None and chunk.get("choices") and chunk["choices"][0].get("text"):
            first = time.perf_counter() - t0
        if "sinkwindow" in chunk:
            ids = chunk["sinkwindow"]["token_ids"]
    conn.close()
    return {"latency_s": time.perf_counter() - t0, "ttft_s": first, "tokens": len(ids), "status": r.status}


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Served:
    def __init__(self, model: str, method: str, threads: int, max_active: int):
        self.port = _free_port()
        cmd = [sys.executable, "-m", "sinkwindow.cli", "serve", "--model", model, "--method", method,
               "--port", str(self.port), "--threads", str(threads), "--max-active", str(max_active),
               "--max-queue", "256", "--max-sessions", "4"]  # fmt: skip
        from sinkwindow.runs.provenance import source_commit

        self.commit = source_commit()  # the code the server imports now, at its start
        self.proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 600
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server for {method} exited with {self.proc.returncode}")
            try:
                if _call(self.port, "GET", "/health")[1]["status"] == "ok":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server did not start in 10 minutes")
            time.sleep(0.5)

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


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


def _prompt_ids(n: int, seed: int, vocab: int = 40000) -> list[int]:
    # Token ids, not text: the load is the model's, not the tokenizer's. A fixed LCG keeps them reproducible.
    x, out = seed + 1, []
    for _ in range(n):
        x = (1103515245 * x + 12345) % 2**31
        out.append(100 + x % vocab)
    return out


def load(served: Served, method: str, args, out: Path) -> None:
    for c in args.concurrency:
        n = args.rounds * c
        bodies = [{"model": args.model, "prompt": _prompt_ids(args.prompt_tokens, i), "max_tokens": args.max_tokens,
                   "temperature": 0} for i in range(n)]  # fmt: skip
        t0 = time.perf_counter()
        with ThreadPoolExecutor(c) as pool:
            results = list(pool.map(lambda b: _stream(served.port, b), bodies))
        wall = time.perf_counter() - t0
        lat = sorted(r["latency_s"] for r in results)
        ttft = sorted(r["ttft_s"] for r in results if r["ttft_s"] is not None)
        tokens = sum(r["tokens"] for r in results)
        _write(out, {
            "part": "load", "method": method, "concurrency": c, "requests": n, "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens, "wall_s": round(wall, 3), "requests_per_s": round(n / wall, 3),
            "completion_tokens_per_s": round(tokens / wall, 2),
            "latency_p50_s": round(statistics.median(lat), 3), "latency_p95_s": round(lat[math.ceil(0.95 * len(lat)) - 1], 3),
            "ttft_p50_s": round(statistics.median(ttft), 3) if ttft else None,
            "errors": sum(r["status"] != 200 for r in results), "threads": args.threads,
            "server": _call(served.port, "GET", "/health")[1], "server_commit": served.commit,
        })  # fmt: skip


def session(served: Served, method: str, limit: int, args, out: Path) -> None:
    fed, k = 0, 0
    # Until the stream reaches the limit: the last request is cut to fit (full attention's positions).
    while fed < limit - 2:
        chunk = min(args.chunk_tokens, limit - fed - 2)
        t0 = time.perf_counter()
        status, reply = _call(served.port, "POST", "/v1/completions", {
            "model": args.model, "prompt": _prompt_ids(chunk, 1000 + k), "max_tokens": 1,
            "temperature": 0, "session_id": "long",
        })  # fmt: skip
        if status != 200:
            _write(out, {"part": "session", "method": method, "error": reply})
            return
        info = reply["sinkwindow"]["session"]
        fed, k = info["tokens"], k + 1
        _write(out, {"part": "session", "method": method, "session_tokens": fed, "kv_cache_bytes": info["kv_cache_bytes"],
                     "server_rss_bytes": _rss(served.proc.pid), "request_s": round(time.perf_counter() - t0, 3),
                     "chunk_tokens": args.chunk_tokens, "threads": args.threads,
                     "server_commit": served.commit})  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--methods", default="full,swa:1024:4")
    p.add_argument("--concurrency", default="1,2,4,8,16", type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--rounds", type=int, default=2, help="requests per concurrency level = rounds × c")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--session-tokens", type=int, default=100_000)
    p.add_argument("--chunk-tokens", type=int, default=2000)
    p.add_argument("--kv-budget-gib", type=float, default=4.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--parts", default="load,session")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    parts = set(args.parts.split(","))
    for method in args.methods.split(","):
        if "load" in parts:
            served = Served(args.model, method, args.threads, max(args.concurrency))
            try:
                load(served, method, args, args.out)
            finally:
                served.close()
        if "session" in parts:
            # Past the model's positions a session needs positions inside the cache (:cache).
            long_method = method if method == "full" or method.endswith(":cache") else method + ":cache"
            served = Served(args.model, long_method, args.threads, 1)
            try:
                limit = args.session_tokens if long_method != "full" else min(args.session_tokens, 8192)
                session(served, long_method, limit, args, args.out)
            finally:
                served.close()
    rows = [json.loads(x) for x in (args.out / "serve_load.jsonl").read_text().splitlines()]
    print(
        "\n| method | concurrency | req/s | tok/s | p50 s | p95 s | TTFT p50 s |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    for r in rows:
        if r["part"] == "load":
            print(f"| {r['method']} | {r['concurrency']} | {r['requests_per_s']} | {r['completion_tokens_per_s']} | "
                  f"{r['latency_p50_s']} | {r['latency_p95_s']} | {r['ttft_p50_s']} |")  # fmt: skip
    budget = int(args.kv_budget_gib * GiB)
    print(
        "\n| method | session tokens | KV bytes | server RSS | 8K sessions in budget |\n|---|---:|---:|---:|---:|"
    )
    for method in {r["method"] for r in rows if r["part"] == "session" and "kv_cache_bytes" in r}:
        mine = [r for r in rows if r["part"] == "session" and r["method"] == method and "kv_cache_bytes" in r]
        at8k = min(
            (r for r in mine if r["session_tokens"] >= 7 * 1024),
            key=lambda r: r["session_tokens"],
            default=mine[-1],
        )
        per8k = (
            at8k["kv_cache_bytes"] * 8192 / at8k["session_tokens"]
            if method == "full"
            else at8k["kv_cache_bytes"]
        )
        last = mine[-1]
        print(f"| {method} | {last['session_tokens']} | {last['kv_cache_bytes']} | {last['server_rss_bytes']} | "
              f"{int(budget // per8k)} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
