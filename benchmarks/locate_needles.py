"""Write ``needles.jsonl`` into a run folder: where each S-NIAH sample's needle lies among its prompt ids.

Rows written since the runner records ``needle_tokens`` need nothing; older folders (the reference
run) get their positions here, from the samples regenerated with the model's tokenizer (generation
is deterministic, and each regenerated prompt must have the length its row recorded). The report
then splits every S-NIAH cell by whether the needle lay inside each method's window.

    python benchmarks/locate_needles.py benchmarks/results/2026-12-02-smollm2-long
    sinkwindow report benchmarks/results/2026-12-02-smollm2-long
"""

from __future__ import annotations

import argparse
import json

from sinkwindow.eval.results import ResultsStore
from sinkwindow.eval.window_split import NEEDLES_FILE, write_needles


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="a run folder with S-NIAH rows")
    p.add_argument("--model", default=None, help="whose tokenizer (default: the rows' model)")
    args = p.parse_args()
    import sinkwindow

    rows = ResultsStore(args.run).all_rows()
    models = {r.get("model") for r in rows if str(r.get("task", "")).startswith("niah_")}
    model = args.model or (models.pop() if len(models) == 1 else None)
    if model is None:
        raise SystemExit(f"error: {args.run} holds S-NIAH rows of {sorted(models)}: pass --model")
    _, tokenizer = sinkwindow.load(model)
    n = write_needles(args.run, rows, tokenizer)
    print(json.dumps({"run": args.run, "model": model, "needles": n, "file": NEEDLES_FILE}))


if __name__ == "__main__":
    main()
