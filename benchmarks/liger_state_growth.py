"""``liger:256``'s GLA state size against position, beside each chunk's perplexity, in one run.

    python benchmarks/liger_state_growth.py --context 4096 --chunk 512 --windows 1 --threads 2 \\
        --out benchmarks/out/liger_state_growth.json

Liger's gate is g = logsigmoid(k) / 16 per key channel: a channel whose pre-RoPE key is large and
positive decays by exp(g) ≈ 1 per token, and its GLA state S (no normaliser, unlike Hedgehog's
z) grows with every token it sees. The script scores essay windows with ``token_nll`` (chunked ``prefill``)
through one cache, and after each chunk records that chunk's perplexity and, per layer,
the Frobenius norm of S over all its heads.
Prints a table (perplexity, then S's norm for a few layers) and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

import sinkwindow
from sinkwindow.eval.perplexity import essay_token_windows, token_nll
from sinkwindow.linear.adapters import file_sha256, shipped_adapter


def _state_norms(cache) -> list[float]:
    """Per layer ||S||_F of a Liger cache (one sequence), 0.0 for a layer with no state."""
    norms = []
    for layer in cache.layers:
        S = getattr(layer, "S", None)
        norms.append(0.0 if S is None else float(S.float().norm()))
    return norms


def measure(model, ids: torch.Tensor, chunk: int) -> dict:
    """Chunk-by-chunk perplexity and per-layer state norms of one window ``ids`` [1, n]."""
    cache = sinkwindow.make_cache(model)
    chunks = []  # (start, end, norms) per chunk, the norms read right after the chunk's forward
    nll = token_nll(
        model,
        ids,
        chunk_size=chunk,
        cache=cache,
        on_chunk=lambda start, logits: chunks.append((start, start + logits.shape[1], _state_norms(cache))),
    )
    rows = []
    for start, end, norms in chunks:
        scored = nll[start:end]  # the last token predicts nothing
        if scored.numel():
            rows.append(
                {"start": start, "end": end, "ppl": math.exp(float(scored.mean())), "state_norm": norms}
            )
    return {"chunks": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--method", default="liger:256")
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--chunk", type=int, default=512)
    p.add_argument("--windows", type=int, default=1)
    p.add_argument("--layers", type=int, nargs="+", default=[0, 10, 20, 29], help="layers to print")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="benchmarks/out/liger_state_growth.json")
    args = p.parse_args(argv)
    if min(args.context, args.chunk, args.windows, args.threads) < 1:
        raise SystemExit("error: --context, --chunk, --windows and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    model, tok = sinkwindow.load(args.model, method=args.method)
    adapter = shipped_adapter(args.model, args.method)
    windows = essay_token_windows(tok, args.context, args.windows)
    results = []
    with torch.no_grad():
        for w in windows:
            results.append(measure(model, w.reshape(1, -1), args.chunk))
    n_layers = len(results[0]["chunks"][0]["state_norm"])
    layers = [i for i in args.layers if 0 <= i < n_layers]
    print(
        f"{args.model} {args.method}: {len(results)} window(s) of {args.context} tokens, chunks of {args.chunk}"
    )
    print("tokens        ppl(mean over windows)  " + "  ".join(f"||S|| L{i}" for i in layers))
    for c in range(len(results[0]["chunks"])):
        rows = [r["chunks"][c] for r in results]
        ppl = sum(r["ppl"] for r in rows) / len(rows)
        norms = [sum(r["state_norm"][i] for r in rows) / len(rows) for i in layers]
        span = f"{rows[0]['start']:>5}-{rows[0]['end']:<5}"
        print(f"{span}  {ppl:>12.1f}            " + "  ".join(f"{x:>9.1f}" for x in norms))
    out = {
        "model": args.model,
        "method": args.method,
        "context": args.context,
        "chunk": args.chunk,
        "windows": len(results),
        "threads": args.threads,
        "torch": torch.__version__,
        # which trained weights produced the numbers: a retrained adapter ships under the same name
        "adapter": None if adapter is None else {"file": adapter.name, "sha256": file_sha256(adapter)},
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({"out": args.out, "windows": len(results)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
