"""Stream 100K tokens through SmolLM2 one token at a time with a bounded cache, past its 8K context.

StreamingLLM's claim, measured with sinkwindow's runtime: with positions re-assigned inside the cache
(``swa:W:S:cache``) every forward sees at most W keys at positions below W, so a stream can run far
past the model's trained context (SmolLM2: 8,192) in constant memory. The stream is Paul Graham's
essays (the NIAH haystack), repeated as needed, fed teacher-forced one token per forward (true decode
steps through the bounded cache); we record the next-token loss, time per token, the cache's bytes,
the process's resident memory and the largest position id the model ever received.

    python benchmarks/stream_100k.py                       # 100K tokens, swa:256:4:cache
    python benchmarks/stream_100k.py --tokens 10000 --method swa:64:4:cache
    python benchmarks/stream_100k.py --resume              # continue an interrupted run

Writes ``<out>/<method>.json`` (the summary plus per-window rows, refreshed at every checkpoint) and
``<out>/<method>.ckpt`` (cache and progress: ``--resume`` continues it, also to a larger ``--tokens``);
the last stdout line is the summary as one JSON document.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import resource
import sys
import time
from pathlib import Path

import torch
import transformers

import sinkwindow
from sinkwindow.runtime.cache import SinkWindowCache
from sinkwindow.runtime.capability import text_config


def stream_tokens(tokenizer, n: int) -> torch.Tensor:
    """``[n + 1]`` token ids of the essays, repeated until long enough (BOS first when there is one)."""
    from sinkwindow.eval.generators.haystack import essay_text

    ids = tokenizer(essay_text(), add_special_tokens=False).input_ids
    reps = math.ceil((n + 1) / len(ids))
    out = (ids * reps)[: n + 1]
    if tokenizer.bos_token_id is not None:
        out = [tokenizer.bos_token_id, *out[:n]]
    return torch.tensor(out, dtype=torch.long)


def rss_mb() -> float:
    """Peak resident memory of this process so far (MB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if platform.system() != "Darwin" else peak / 2**20


def current_rss_mb() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize() / 2**20
    except OSError:
        return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument(
        "--method", default="swa:256:4:cache", help="a windowed spec; cache mode to pass the context"
    )
    p.add_argument("--tokens", type=int, default=100_000, help="stream length (default: %(default)s)")
    p.add_argument("--report-every", type=int, default=1000, help="tokens per reported window")
    p.add_argument("--checkpoint-every", type=int, default=5000, help="tokens between checkpoints")
    p.add_argument("--out", default="runs/stream_100k")
    p.add_argument("--resume", action="store_true", help="continue from <out>/<method>.ckpt")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = sinkwindow.parse_spec(args.method)
    if not spec.is_windowed:
        p.error("--method must be swa:W:S[:cache] or evict:W:S[:cache]: the point is a bounded cache")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = str(spec).replace(":", "_")
    json_path, ckpt_path = out / f"{stem}.json", out / f"{stem}.ckpt"

    model, tok = sinkwindow.load(args.model)
    model.eval()
    sinkwindow.apply(model, spec)
    limit = getattr(text_config(model), "max_position_embeddings", None)
    ids = stream_tokens(tok, args.tokens)

    # The largest position id any forward received, read where the model turns positions into RoPE.
    max_pos = {"value": -1}

    def watch_positions(module, args_, kwargs):
        pos = kwargs.get("position_ids", args_[1] if len(args_) > 1 else None)
        if pos is not None:
            max_pos["value"] = max(max_pos["value"], int(pos.max()))

    rotary = next(m for name, m in model.named_modules() if name.endswith("rotary_emb"))
    rotary.register_forward_pre_hook(watch_positions, with_kwargs=True)

    cache: SinkWindowCache = sinkwindow.make_cache(model)
    rows: list[dict] = []
    done, nll_total = 0, 0.0
    if args.resume and ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False)
        if state["method"] != str(spec) or state["done"] > args.tokens:
            p.error(
                f"{ckpt_path} is {state['method']} at {state['done']} tokens; cannot resume to {args.tokens}"
            )
        cache.load_state_dict(state["cache"])
        done, nll_total, rows = state["done"], state["nll_total"], state["rows"]
        max_pos["value"] = state["max_pos"]
        print(f"resuming at token {done:,}", flush=True)

    print(
        f"{args.model} {spec}: {args.tokens:,} tokens one at a time (context limit {limit}), "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads",
        flush=True,
    )
    t_start = time.perf_counter()
    first_token = done
    cache_bytes: set[int] = set()

    def summarize(step: int) -> dict:
        def ppl(selected: list[dict]) -> float | None:
            n = sum(r["window_tokens"] for r in selected)
            return math.exp(sum(r["window_nll_sum"] for r in selected) / n) if n else None

        inside = [r for r in rows if limit is None or r["tokens"] <= limit]
        past = [r for r in rows if limit is not None and r["tokens"] - r["window_tokens"] >= limit]
        summary = {
            "benchmark": "stream_100k",
            "model": args.model,
            "method": str(spec),
            "tokens": step,
            "tokens_target": args.tokens,
            "context_limit": limit,
            "ppl": math.exp(nll_total / step) if step else None,
            "ppl_within_context": ppl(inside),
            "ppl_past_context": ppl(past),
            "ms_per_token_median": sorted(r["ms_per_token"] for r in rows)[len(rows) // 2] if rows else None,
            "tokens_this_run": step - first_token,
            "seconds_this_run": time.perf_counter() - t_start,
            "cache_bytes_after_warmup": sorted(cache_bytes),
            "constant_memory": len(cache_bytes) <= 1,
            "peak_rss_mb": rss_mb(),
            "max_position_id": max_pos["value"],
            "versions": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "sinkwindow": sinkwindow.__version__,
                "python": sys.version.split()[0],
            },
            "threads": torch.get_num_threads(),
        }
        json_path.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2))
        return summary

    def checkpoint(step: int) -> None:
        state = {
            "method": str(spec),
            "done": step,
            "nll_total": nll_total,
            "rows": rows,
            "max_pos": max_pos["value"],
            "cache": cache.state_dict(),
        }
        torch.save(state, ckpt_path.with_suffix(".tmp"))
        ckpt_path.with_suffix(".tmp").replace(ckpt_path)  # never leave a half-written checkpoint

    window_nll, window_n, t_window = 0.0, 0, time.perf_counter()
    with torch.no_grad():
        for t in range(done, args.tokens):
            logits = model(ids[None, t : t + 1], cache=cache, use_cache=True).logits
            nll = -float(torch.log_softmax(logits[0, -1].float(), dim=-1)[ids[t + 1]])
            nll_total += nll
            window_nll += nll
            window_n += 1
            if t >= spec.window:
                cache_bytes.add(cache.nbytes())
            step = t + 1
            if step % args.report_every == 0 or step == args.tokens:
                dt = time.perf_counter() - t_window
                row = {
                    "tokens": step,
                    "window_tokens": window_n,
                    "window_nll_sum": window_nll,
                    "window_ppl": math.exp(window_nll / window_n),
                    "ms_per_token": dt / window_n * 1e3,
                    "cache_bytes": cache.nbytes(),
                    "persisted_keys": max(cache.persisted_lengths()),
                    "rss_mb": current_rss_mb(),
                    "max_position_id": max_pos["value"],
                }
                rows.append(row)
                print(
                    f"{step:>7,} tok  ppl(last {window_n}) {row['window_ppl']:7.2f}  {row['ms_per_token']:6.1f} ms/tok  "
                    f"cache {row['cache_bytes'] / 2**20:5.2f} MiB ({row['persisted_keys']} keys/layer)  "
                    f"rss {row['rss_mb']:6.0f} MB  max pos {row['max_position_id']}",
                    flush=True,
                )
                window_nll, window_n, t_window = 0.0, 0, time.perf_counter()
            if step % args.checkpoint_every == 0 or step == args.tokens:
                checkpoint(step)
                summarize(step)

    summary = summarize(args.tokens)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
