"""Soak test of ``sinkwindow serve`` on 127.0.0.1: does its memory stay flat under churn and faults?

    python benchmarks/serve_soak.py --out benchmarks/results/DATE-serve-soak-smollm2

It starts ``sinkwindow serve`` (``--model``, ``--method``, ``--threads``, ``--max-sessions`` and any
``--server-flag``) as a subprocess on a free loopback port, then drives it with ``--workers``
steady clients and, every ``--burst-every`` seconds, a burst of ``--burst`` concurrent streams of
which half close their connection after two chunks. The steady clients mix (``MIX``):

- ``session``: a short prompt on a session id drawn from a pool of ``--sessions`` ids, more than
  the server keeps (``--max-sessions``), so sessions churn through eviction;
- ``long_session``: the next turn of one conversation (id ``soak-long``), many turns long; when its
  positions run out (400 ``context_length_exceeded``) the client deletes it and starts again;
- ``plain``: a short prompt, no session; ``long_prompt``: ``--long-prompt-tokens`` tokens, no
  session (a prompt the size full attention is run at);
- ``bad``: a request the server must refuse with a 4xx (bad JSON, an unknown model, a negative
  ``max_tokens``, no such route).

Every ``--sample`` seconds it records the server's RSS (psutil) and its ``/health`` answer (every
numeric key, so the pool's counts appear as soon as the server reports them). The drive ends at
``--requests`` requests or ``--duration`` seconds, whichever comes first; every request has a
timeout (``--request-timeout``). The verdict (:func:`summarize`): no request hung, no 5xx and no
broken connection, every bad request got a 4xx and every good one 200 (or 429 busy / 409 session
busy, counted), the server answers afterwards, and **RSS after the warm-up (the first
``--warmup`` seconds) stays under the warm-up's peak + max(``--margin-mib`` MiB,
``--margin-frac`` of it)** (64 MiB or 10 % by default).

On a shared machine a leaking server must not take the others down: once its RSS passes
``--max-rss-mib`` the drive stops (the soak fails, ``rss_capped`` says when).

Writes ``OUT/samples.jsonl`` (RSS and /health over time), ``OUT/requests.jsonl`` (one row per
request), ``OUT/summary.json`` and ``OUT/rss.png``, and prints a compact table and the verdict.
Only the loopback address is ever used (``serve_client.HOST``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import random
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_client import Served, call, stream  # noqa: E402

logger = logging.getLogger("serve_soak")
MiB = 2**20
# Steady clients' request kinds and their weights.
MIX = {"session": 0.62, "long_session": 0.15, "plain": 0.1, "long_prompt": 0.03, "bad": 0.1}
LONG_ID = "soak-long"
# A good request may be refused while the server is full: that is its answer, not a failure.
REFUSALS = {409, 429}


@dataclass
class SoakConfig:
    """One soak's settings (see the module's docstring)."""

    model: str = "smollm2-135m"
    method: str = "swa:1024:4"
    threads: int = 1
    requests: int = 3000
    duration_s: float = 600.0
    warmup_s: float = 120.0
    sessions: int = 300
    max_sessions: int = 64
    workers: int = 4
    burst: int = 16
    burst_every_s: float = 45.0
    prompt_tokens: int = 24
    long_prompt_tokens: int = 3000
    max_tokens: int = 4
    burst_max_tokens: int = 12
    vocab: int = 40000
    request_timeout_s: float = 300.0
    sample_s: float = 0.5
    margin_mib: float = 64.0
    margin_frac: float = 0.10
    max_rss_mib: float = 8192.0
    server_flags: list[str] = field(default_factory=list)
    served_name: str | None = None
    seed: int = 0


def prompt_ids(n: int, seed: int, vocab: int) -> list[int]:
    """``n`` reproducible token ids in ``[1, vocab)`` (ids, not text: the load is the model's)."""
    rng = random.Random(seed)
    return [rng.randrange(1, vocab) for _ in range(n)]


def _bad(kind: int, cfg: SoakConfig) -> tuple[str, str, dict | bytes]:
    """The ``kind``-th of four requests every server must refuse with a 4xx."""
    name = cfg.served_name or cfg.model
    return [
        ("POST", "/v1/completions", b"{not json"),
        ("POST", "/v1/completions", {"model": "no-such-model", "prompt": [1, 2], "max_tokens": 2}),
        ("POST", "/v1/completions", {"model": name, "prompt": [1, 2], "max_tokens": -1}),
        ("POST", "/v1/no-such-route", {"model": name}),
    ][kind % 4]


class Soak:
    """The drive: steady workers, bursts and a sampler against one running server."""

    def __init__(self, served: Served, cfg: SoakConfig, out: Path | None = None):
        self.served, self.cfg, self.out = served, cfg, out
        self.rss_capped: float | None = None
        self.killed = False  # by the RSS guard
        self.port = served.port
        self.requests: list[dict] = []
        self.samples: list[dict] = []
        self.restarts = 0
        self._lock = threading.Lock()
        self._sent = 0
        self._in_use: set[str] = set()
        self._stop = threading.Event()  # no new requests
        self._done = threading.Event()  # every request has ended: stop sampling
        self.t0 = time.monotonic()
        self.deadline = self.t0 + cfg.duration_s

    def _take(self) -> int | None:
        """The next request's number, or ``None`` once the count or the time is spent."""
        with self._lock:
            if self._sent >= self.cfg.requests or time.monotonic() >= self.deadline:
                self._stop.set()
                return None
            self._sent += 1
            return self._sent

    def _session_id(self, rng: random.Random, long: bool = False) -> str | None:
        """A session id no other client of ours holds now (``None``: all the ones tried are busy)."""
        with self._lock:
            for _ in range(8):
                sid = LONG_ID if long else f"soak-{rng.randrange(self.cfg.sessions)}"
                if sid not in self._in_use:
                    self._in_use.add(sid)
                    return sid
        return None

    def _body(self, n: int, tokens: int, max_tokens: int, sid: str | None) -> dict:
        body = {"model": self.cfg.served_name or self.cfg.model, "max_tokens": max_tokens, "temperature": 0,
                "prompt": prompt_ids(tokens, self.cfg.seed * 1_000_003 + n, self.cfg.vocab)}  # fmt: skip
        return body if sid is None else {**body, "session_id": sid}

    def _record(self, n: int, kind: str, t: float, res: dict) -> None:
        extra = res.pop("sinkwindow", None) or {}
        res["evicted"] = len(extra.get("evicted_sessions") or [])
        with self._lock:
            self.requests.append({"n": n, "kind": kind, "t": round(t - self.t0, 3), **res})

    def _good(self, n: int, kind: str, rng: random.Random, drop_after: int | None = None) -> None:
        cfg = self.cfg
        sid = None if kind in ("plain", "long_prompt") else self._session_id(rng, kind == "long_session")
        if sid is None and kind in ("session", "long_session"):
            kind = "plain"  # every id tried was in use by another of our clients
        tokens = cfg.long_prompt_tokens if kind == "long_prompt" else cfg.prompt_tokens
        max_tokens = cfg.burst_max_tokens if kind.startswith("burst") else cfg.max_tokens
        t = time.monotonic()
        try:
            res = stream(self.port, self._body(n, tokens, max_tokens, sid), timeout=cfg.request_timeout_s,
                         drop_after=drop_after)  # fmt: skip
            if sid is not None and res["status"] == 400 and res["error"] == "context_length_exceeded":
                # The conversation ran out of positions: what a client does is start it again.
                call(self.port, "DELETE", f"/v1/sessions/{sid}", timeout=cfg.request_timeout_s)
                with self._lock:
                    self.restarts += 1
                res["restarted"] = True
        finally:
            if sid is not None:
                with self._lock:
                    self._in_use.discard(sid)
        self._record(n, kind, t, res)

    def _bad_request(self, n: int) -> None:
        method, path, body = _bad(n, self.cfg)
        t = time.monotonic()
        res = {"status": None, "hung": False, "error": None, "dropped": False, "tokens": 0, "ttft_s": None}
        try:
            res["status"], _ = call(self.port, method, path, body, timeout=self.cfg.request_timeout_s)
        except TimeoutError:
            res["hung"] = True
        except OSError as err:
            res["error"] = type(err).__name__
        res["latency_s"] = time.monotonic() - t
        self._record(n, "bad", t, res)

    def _worker(self, i: int) -> None:
        rng = random.Random(self.cfg.seed * 7919 + i)
        kinds, weights = list(MIX), list(MIX.values())
        while (n := self._take()) is not None:
            kind = rng.choices(kinds, weights)[0]
            if kind == "bad":
                self._bad_request(n)
            else:
                self._good(n, kind, rng)

    def _burst(self, k: int) -> None:
        """``--burst`` streams at once; every other one drops its connection after two chunks."""
        rng = random.Random(self.cfg.seed * 104729 + k)
        jobs = [(n, i % 2 == 1) for i in range(self.cfg.burst) if (n := self._take()) is not None]
        with ThreadPoolExecutor(max(len(jobs), 1)) as pool:
            for n, drop in jobs:
                pool.submit(self._good, n, "burst_drop" if drop else "burst", rng, 2 if drop else None)

    def _bursts(self) -> None:
        # The first burst lands inside the warm-up, so the warm-up level has seen one.
        when, k = self.t0 + min(self.cfg.warmup_s / 2, self.cfg.burst_every_s), 0
        while not self._stop.wait(max(0.0, when - time.monotonic())):
            self._burst(k)
            when, k = when + self.cfg.burst_every_s, k + 1

    def _sampler(self) -> None:
        while True:
            t = time.monotonic()
            row = {"t": round(t - self.t0, 3), "rss": self.served.rss()}
            try:
                status, health = call(self.port, "GET", "/health", timeout=5)
                row["health_status"] = status
                row.update({f"health.{k}": v for k, v in _numeric(health or {}).items()})
            except OSError as err:
                row["health_status"] = type(err).__name__
            self.samples.append(row)
            if self.out is not None:  # as it goes: a run stopped from outside keeps its samples
                with (self.out / "samples.jsonl").open("a") as f:
                    f.write(json.dumps(row) + "\n")
            if row["rss"] > self.cfg.max_rss_mib * MiB and self.rss_capped is None:
                self.rss_capped = row["t"]
                with self._lock:
                    self.deadline = time.monotonic()  # no new requests; running ones end within their timeout
            if row["rss"] > 1.25 * self.cfg.max_rss_mib * MiB and self.served.proc.poll() is None:
                logger.warning("the server's RSS passed 1.25 x --max-rss-mib while winding down: killed")
                self.served.proc.kill()  # the machine's other users come first
                self.killed = True
            if self._done.wait(max(0.0, self.cfg.sample_s - (time.monotonic() - t))):
                return

    def run(self) -> None:
        threads = [
            threading.Thread(target=self._sampler, daemon=True),
            threading.Thread(target=self._bursts, daemon=True),
        ]
        threads += [threading.Thread(target=self._worker, args=(i,), daemon=True) for i in range(self.cfg.workers)]  # fmt: skip
        for th in threads:
            th.start()
        # Bounded: each worker's last request ends within its timeout after the deadline.
        for th in threads[1:]:
            th.join(self.cfg.duration_s + 2 * self.cfg.request_timeout_s + 60)
        self._stop.set()
        self._done.set()
        threads[0].join(self.cfg.sample_s + 10)
        self.wall_s = time.monotonic() - self.t0


def _numeric(d: dict, prefix: str = "") -> dict:
    """The numbers in a (nested) JSON object, keys joined with dots: /health's counts, whatever they are."""
    out = {}
    for k, v in d.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, int | float):
            out[prefix + k] = v
        elif isinstance(v, dict):
            out.update(_numeric(v, f"{prefix}{k}."))
    return out


def _pct(xs: list[float], q: float) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    return None if not xs else round(xs[max(0, math.ceil(q * len(xs)) - 1)], 4)


def rss_verdict(samples: list[dict], cfg: SoakConfig, capped: float | None = None) -> dict:
    """The memory check: the peak after the warm-up against the warm-up's peak plus the margin
    (failed outright where the RSS passed ``max_rss_mib`` at ``capped`` seconds)."""
    warm = [s["rss"] for s in samples if s["t"] <= cfg.warmup_s and s["rss"]]
    after = [(s["t"], s["rss"]) for s in samples if s["t"] > cfg.warmup_s and s["rss"]]
    if capped is not None:
        return {"rss_ok": False, "rss_capped_at_s": capped, "rss_first": samples[0]["rss"],
                "rss_peak": max(s["rss"] for s in samples), "rss_note": f"RSS passed --max-rss-mib {cfg.max_rss_mib:g} "
                f"at {capped:.0f} s ({'in' if capped <= cfg.warmup_s else 'after'} the warm-up): stopped"}  # fmt: skip
    if not warm or not after:
        return {"rss_ok": False, "rss_note": "no samples on one side of the warm-up: run longer"}
    level = max(warm)
    limit = level + max(cfg.margin_mib * MiB, cfg.margin_frac * level)
    peak = max(r for _, r in after)
    # Least-squares slope after the warm-up: how fast it grows, in MiB a minute.
    mt, mr = statistics.fmean(t for t, _ in after), statistics.fmean(r for _, r in after)
    var = sum((t - mt) ** 2 for t, _ in after)
    slope = sum((t - mt) * (r - mr) for t, r in after) / var * 60 / MiB if var else 0.0
    return {"rss_ok": peak <= limit, "rss_warmup_peak": level, "rss_limit": int(limit), "rss_after_peak": peak,
            "rss_end": after[-1][1], "rss_first": warm[0], "rss_slope_mib_per_min": round(slope, 2),
            "margin": f"+max({cfg.margin_mib:g} MiB, {cfg.margin_frac:.0%})"}  # fmt: skip


def summarize(
    soak: Soak, answers_after: bool, health: dict | None = None, sessions: dict | None = None
) -> dict:
    """Counts, throughput, latency and the verdict of one soak."""
    cfg, reqs = soak.cfg, soak.requests
    bad = [r for r in reqs if r["kind"] == "bad"]
    good = [r for r in reqs if r["kind"] != "bad"]
    ok = [r for r in good if r["status"] == 200 and not r["dropped"] and not r["hung"] and r["latency_s"]]
    statuses: dict[str, int] = {}
    for r in reqs:
        key = str(r["status"]) if r["status"] is not None else (r["error"] or "none")
        statuses[key] = statuses.get(key, 0) + 1
    problems = {
        "hung": sum(r["hung"] for r in reqs),
        "server_errors_5xx": sum((r["status"] or 0) >= 500 for r in reqs),
        "broken_connections": sum((r["status"] is None or r["error"] == "incomplete") and not r["hung"] for r in reqs),
        "bad_not_4xx": sum(not (400 <= (r["status"] or 0) < 500) for r in bad),
        "good_refused_unexpectedly": sum(
            r["status"] not in (200, *REFUSALS) and not r.get("restarted") and r["status"] is not None for r in good
        ),
    }  # fmt: skip
    tokens = sum(r["tokens"] for r in ok)
    out = {
        "config": dataclasses.asdict(cfg), "wall_s": round(soak.wall_s, 2), "requests": len(reqs),
        "by_kind": {k: sum(r["kind"] == k for r in reqs) for k in sorted({r["kind"] for r in reqs})},
        "statuses": statuses, "refused_409_429": sum(r["status"] in REFUSALS for r in good),
        "session_restarts": soak.restarts, "evictions_reported": sum(r.get("evicted", 0) for r in reqs),
        "dropped": sum(r["dropped"] for r in reqs), "completed": len(ok),
        "requests_per_s": round(len(ok) / soak.wall_s, 3), "completion_tokens_per_s": round(tokens / soak.wall_s, 3),
        "ttft_p50_s": _pct([r["ttft_s"] for r in ok], 0.5), "ttft_p95_s": _pct([r["ttft_s"] for r in ok], 0.95),
        "latency_p50_s": _pct([r["latency_s"] for r in ok], 0.5), "latency_p95_s": _pct([r["latency_s"] for r in ok], 0.95),
        "long_prompt_latency_p50_s": _pct([r["latency_s"] for r in ok if r["kind"] == "long_prompt"], 0.5),
        "long_session_turns": sum(r["kind"] == "long_session" and r["status"] == 200 for r in reqs),
        "answers_after": answers_after, "server_killed_by_rss_guard": soak.killed, **problems, **rss_verdict(soak.samples, cfg, soak.rss_capped),
    }  # fmt: skip
    out["health_end"], out["sessions_end"] = health, sessions
    out["faults_ok"] = answers_after and not any(problems.values())
    out["pass"] = out["faults_ok"] and out["rss_ok"]
    return out


def soak(cfg: SoakConfig, out: Path | None = None) -> tuple[dict, list[dict]]:
    """Start the server, drive it, check it still answers, stop it: the summary and the samples
    (and the files in ``out``)."""
    if out is not None:
        (out / "samples.jsonl").unlink(missing_ok=True)  # written as it goes, appended to
    flags = ["--max-sessions", str(cfg.max_sessions), "--max-active", str(cfg.burst), *cfg.server_flags]
    if cfg.served_name:
        flags += ["--served-model-name", cfg.served_name]
    served = Served.sinkwindow(cfg.model, cfg.method, cfg.threads, flags,
                               log=None if out is None else out / "server.log")  # fmt: skip
    try:
        run = Soak(served, cfg, out)
        run.run()
        summary = summarize(run, *_after(served, run))
    finally:
        served.close()
    if out is not None:
        _write(out, run, summary)
    return summary, run.samples


def _after(served: Served, run: Soak) -> tuple[bool, dict | None, dict | None]:
    """Whether the server still answers a request after the soak, its /health and its /v1/sessions."""
    if served.proc.poll() is not None:
        return False, None, None  # it died (or the RSS guard killed it)
    after = stream(
        served.port, run._body(0, run.cfg.prompt_tokens, 2, None), timeout=run.cfg.request_timeout_s
    )
    try:
        health = call(served.port, "GET", "/health", timeout=30)
        sessions = call(served.port, "GET", "/v1/sessions", timeout=30)[1]
    except OSError:
        return False, None, None
    return after["status"] == 200 and after["tokens"] > 0 and health[0] == 200, health[1], sessions


def _write(out: Path, run: Soak, summary: dict) -> None:
    from sinkwindow.runs.provenance import source_commit

    summary["commit"] = source_commit()
    summary["written"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (out / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run.requests))
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    plot(run.samples, summary, out / "rss.png")


def plot(samples: list[dict], summary: dict, path: Path) -> None:
    """RSS (and the pool's use, where /health reports it) over time, with the warm-up and the limit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    alive = [s for s in samples if s["rss"]]  # 0: the server had gone
    ax.plot([s["t"] for s in alive], [s["rss"] / MiB for s in alive], label="server RSS")
    if summary.get("rss_capped_at_s") is not None:
        ax.axhline(summary["config"]["max_rss_mib"], color="black", ls="--", label="--max-rss-mib: stopped")
    if "rss_limit" in summary:
        ax.axhline(summary["rss_limit"] / MiB, color="red", ls="--", label=f"limit ({summary['margin']})")
        ax.axvline(summary["config"]["warmup_s"], color="gray", ls=":", label="end of warm-up")
    pool = _pool_keys(samples)
    if pool:
        twin = ax.twinx()
        for k in pool:
            twin.plot([s["t"] for s in samples], [s.get(k) for s in samples], ls="-.", lw=0.8, label=k)
        twin.set_ylabel("pool (as /health reports it)")
        twin.legend(loc="lower right", fontsize=7)
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_title(
        f"{summary['config']['model']} {summary['config']['method']}: {'PASS' if summary['pass'] else 'FAIL'}"
    )
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pool_keys(samples: list[dict]) -> list[str]:
    """The /health counts of KV memory in use that changed during the soak (``pool_blocks_used``...)."""
    keys = sorted({k for s in samples for k in s if k.startswith("health.")})
    pool = [
        k
        for k in keys
        if any(w in k for w in ("pool", "block", "kv")) and len({s.get(k) for s in samples}) > 1
    ]
    used = [k for k in pool if "used" in k and "bytes" not in k]
    return used or pool


def table(samples: list[dict], rows: int = 12) -> str:
    """RSS over time in ``rows`` lines, with the /health counts that changed."""
    keys = [k for k in sorted({k for s in samples for k in s if k.startswith("health.")})
            if len({s.get(k) for s in samples}) > 1]  # fmt: skip
    step = max(1, len(samples) // rows)
    picked = [samples[i] for i in sorted({*range(0, len(samples), step), len(samples) - 1})]
    head = "| t s | RSS MiB | " + " | ".join(k.removeprefix("health.") for k in keys) + " |"
    lines = [head, "|" + "---:|" * (2 + len(keys))]
    for s in picked:
        vals = " | ".join(str(s.get(k, "")) for k in keys)
        lines.append(f"| {s['t']:.0f} | {s['rss'] / MiB:.0f} | {vals} |")
    return "\n".join(lines)


def _args(argv: list[str] | None) -> tuple[SoakConfig, Path]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = SoakConfig()
    for f in dataclasses.fields(SoakConfig):
        if f.name in ("server_flags",):
            continue
        name = "--" + f.name.removesuffix("_s").replace("_", "-")
        kind = type(getattr(d, f.name)) if getattr(d, f.name) is not None else str
        p.add_argument(name, dest=f.name, type=kind, default=getattr(d, f.name))
    p.add_argument("--server-flag", dest="server_flags", action="append", default=[],
                   help="a flag passed to sinkwindow serve as is, e.g. --server-flag=--kv-budget=1GiB (repeatable)")  # fmt: skip
    p.add_argument("--out", type=Path, required=True)
    ns = vars(p.parse_args(argv))
    out = ns.pop("out")
    return SoakConfig(**ns), out


def main(argv: list[str] | None = None) -> int:
    cfg, out = _args(argv)
    out.mkdir(parents=True, exist_ok=True)
    s, samples = soak(cfg, out)
    print(table(samples))
    keys = ("requests", "completed", "wall_s", "requests_per_s", "completion_tokens_per_s", "ttft_p50_s", "ttft_p95_s",
            "latency_p50_s", "latency_p95_s", "evictions_reported", "session_restarts", "refused_409_429", "dropped",
            "statuses", "hung", "server_errors_5xx", "broken_connections", "bad_not_4xx", "rss_first",
            "rss_warmup_peak", "rss_limit", "rss_after_peak", "rss_end", "rss_slope_mib_per_min", "margin",
            "rss_peak", "rss_capped_at_s", "rss_note")  # fmt: skip
    print("\n" + "\n".join(f"{k}: {s.get(k)}" for k in keys))
    print(f"\nfaults: {'ok' if s['faults_ok'] else 'FAIL'}; RSS: {'ok' if s['rss_ok'] else 'FAIL'}; "
          f"soak: {'PASS' if s['pass'] else 'FAIL'}")  # fmt: skip
    print(
        json.dumps(
            {k: s.get(k) for k in ("pass", "faults_ok", "rss_ok", "requests", "rss_slope_mib_per_min")}
        )
    )
    return 0 if s["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
