"""S-NIAH found / n by how far the needle lay from the prompt's end, per method of a run folder.

    python benchmarks/needle_distance.py benchmarks/results/2026-12-06-smollm2-frontier-4k

Plain SWA(w, s) is a step in this table (every needle within its last w − s positions, none
beyond), and a hybrid whose full heads or layers do the retrieval is flat: it shows whether a
frontier point loses needles because they are far or because its full units miss them at any
distance. Reads ``<run>/eval/results.jsonl`` (or ``<run>/results.jsonl``): rows that carry
``needle_tokens`` (the needle value's ``[start, end)`` among ``n_prompt_tokens``); the distance is
``n_prompt_tokens - start``. Prints a table and writes ``needle_distance.json`` beside the rows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sinkwindow.jsonl import read_jsonl

EDGES = (0, 256, 1024, 2048, 3072, 1 << 30)


def bucket_label(i: int) -> str:
    lo, hi = EDGES[i], EDGES[i + 1]
    return f">={lo}" if hi == EDGES[-1] else f"{lo}-{hi}"


def distance_table(rows: list[dict]) -> dict[str, list[list[int]]]:
    """``{method: [[found, n] per distance bucket]}`` over the S-NIAH rows that locate their needle."""
    out: dict[str, list[list[int]]] = {}
    for r in rows:
        if not r.get("needle_tokens"):
            continue
        d = int(r["n_prompt_tokens"]) - int(r["needle_tokens"][0])
        i = next(j for j in range(len(EDGES) - 1) if EDGES[j] <= d < EDGES[j + 1])
        cell = out.setdefault(r["method"], [[0, 0] for _ in range(len(EDGES) - 1)])[i]
        cell[0] += float(r["score"]) > 0
        cell[1] += 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a run folder (compare, eval or frontier)")
    args = ap.parse_args()
    path = args.run / "eval" / "results.jsonl"
    if not path.exists():
        path = args.run / "results.jsonl"
    if not path.exists():
        raise SystemExit(f"no results.jsonl in {args.run} or {args.run / 'eval'}: give a run folder")
    rows, _ = read_jsonl(path)
    table = distance_table(rows)
    if not table:
        raise SystemExit(
            f"no S-NIAH row in {path} carries needle_tokens: run benchmarks/locate_needles.py first"
        )
    labels = [bucket_label(i) for i in range(len(EDGES) - 1)]
    print("| method | " + " | ".join(f"{b} tokens from the end" for b in labels) + " |")
    print("|---|" + "---:|" * len(labels))
    for method, cells in table.items():
        print(f"| `{method}` | " + " | ".join(f"{f}/{n}" for f, n in cells) + " |")
    out = path.parent / "needle_distance.json"
    out.write_text(json.dumps({"rows": str(path), "buckets": labels, "found_of_n": table}, indent=1))
    print(json.dumps({"out": str(out), "methods": len(table), "rows": len(rows)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
