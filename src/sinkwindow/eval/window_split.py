"""Where the needle was: S-NIAH scores split by whether the needle lay inside a method's window.

SWA(w, s) answers the first generated token from the sinks (prompt positions < s) and the last
w − s prompt positions; a needle elsewhere it can only retrieve through what the layers carried
forward. On a small model that carries almost nothing, so a cell's score mostly counts how many
needles its random depths happened to put in the window. The split makes that visible: per
method and cell, the samples whose needle value starts in the window, the rest, and the share
a uniform needle position would put in the window (``expected_share``).

Needle positions come from each row's ``needle_tokens`` (``[start, end)`` among the prompt's
``n_prompt_tokens`` ids, written by the runner), or from a ``needles.jsonl`` beside
``results.jsonl`` for rows written before rows carried them (``write_needles``).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

from ..jsonl import read_jsonl
from ..methods import method_of
from ..runtime.spec import MethodSpec, parse_spec

__all__ = [
    "NEEDLES_FILE",
    "method_window",
    "needle_in_window",
    "window_split",
    "read_needles",
    "write_needles",
]

NEEDLES_FILE = "needles.jsonl"
_KEY = ("model", "task", "length", "seed", "index")


def method_window(spec: MethodSpec) -> tuple[int, int] | None:
    """``(w, s)``: the keys a method's first decoded token sees exactly (s sinks plus w − s recent),
    or ``None`` for a method that sees every key (``full``, a hybrid with full layers or heads) or
    none exactly (``linear``). ``lolcats:W`` and ``liger:W`` see their last W keys by softmax."""
    return method_of(spec).exact_view


def needle_in_window(start: int, end: int, n_prompt: int, window: tuple[int, int]) -> bool:
    """Whether the needle value at prompt positions ``[start, end)`` is inside SWA(w, s)'s view from
    the last prompt position: all of it among the sinks, or its first token among the last w − s."""
    w, s = window
    return end <= s or start >= n_prompt - (w - s)


def _key(row: dict) -> tuple:
    return tuple(row.get(k) for k in _KEY)


def read_needles(run_dir: str | os.PathLike) -> dict[tuple, dict]:
    """``needles.jsonl`` of a run folder by sample key (empty when there is none)."""
    return {_key(row): row for row in read_jsonl(Path(run_dir) / NEEDLES_FILE)[0]}


def write_needles(run_dir: str | os.PathLike, rows: list[dict], tokenizer) -> int:
    """Locate the needle of every S-NIAH sample in ``rows`` and write ``needles.jsonl``; returns the count.

    The samples are regenerated from their (task, length, seed) with ``tokenizer`` (generation is
    deterministic), and each must give the prompt length its row recorded, or nothing is written.

    Raises:
        ValueError: a regenerated prompt whose length differs from its row's (another tokenizer,
            another sinkwindow version's haystack).
    """
    from .generators.niah import generate_niah, needle_tokens
    from .tasks import NIAH_TASKS

    wanted: dict[tuple, int] = {}
    for r in rows:
        if r.get("task") in NIAH_TASKS:
            wanted[_key(r)] = int(r["n_prompt_tokens"])
    by_cell: dict[tuple, int] = defaultdict(int)
    for _model, task, length, seed, index in wanted:
        by_cell[(task, length, seed)] = max(by_cell[(task, length, seed)], index + 1)
    out = []
    models = {k[0] for k in wanted}
    for (task, length, seed), count in sorted(by_cell.items()):
        for sample in generate_niah(task, tokenizer, length, count, seed=seed):
            start, end = needle_tokens(tokenizer, sample.text, sample.outputs[0], add_special_tokens=True)
            n = len(tokenizer(sample.text, add_special_tokens=True).input_ids)
            for model in models:
                key = (model, task, length, seed, sample.index)
                if key not in wanted:
                    continue
                if wanted[key] != n:
                    raise ValueError(
                        f"{task} at {length}, index {sample.index}: the regenerated prompt has {n} tokens, its row "
                        f"{wanted[key]}: not the tokenizer (or haystack) the rows were made with"
                    )
                out.append(
                    dict(zip(_KEY, key), needle_tokens=[start, end], n_prompt_tokens=n, depth=sample.depth)
                )
    path = Path(run_dir) / NEEDLES_FILE
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in out))
    tmp.replace(path)
    return len(out)


def window_split(rows: list[dict], needles: dict[tuple, dict] | None = None) -> dict:
    """``{task: {method: {length: cell}}}`` for S-NIAH rows whose needle position is known.

    A cell: ``window`` (w, s), ``inside`` and ``beyond`` as ``{"n", "found"}`` (found = score 100),
    ``expected_share`` (the mean over samples of min(1, w / n_prompt): the share of prompt positions
    the window covers) and, for ``full``, ``by`` (the method whose window splits it). ``full`` is split
    by the window of the first untrained SWA method with sinks among the rows, on its own samples:
    what dense attention finds where that window would not have seen.
    """
    from .tasks import NIAH_TASKS

    needles = needles or {}
    specs: dict[str, MethodSpec] = {}
    for r in rows:
        m = r.get("method")
        if isinstance(m, str) and m not in specs:
            try:
                specs[m] = parse_spec(m)
            except ValueError:
                continue
    swa = [m for m, sp in specs.items() if method_of(sp).anchors_comparisons and not sp.adapter]
    reference = swa[0] if swa else None
    out: dict = {}
    for r in rows:
        task, method = r.get("task"), r.get("method")
        if task not in NIAH_TASKS or method not in specs:
            continue
        by = None
        window = method_window(specs[method])
        if method == "full" and reference is not None:
            window, by = method_window(specs[reference]), reference
        if window is None:
            continue
        where = r if r.get("needle_tokens") else needles.get(_key(r))
        if not where or not where.get("needle_tokens"):
            continue
        start, end = where["needle_tokens"]
        n = int(where.get("n_prompt_tokens") or r["n_prompt_tokens"])
        cell = (
            out.setdefault(task, {})
            .setdefault(method, {})
            .setdefault(
                r["length"],
                {
                    "window": list(window),
                    "inside": {"n": 0, "found": 0},
                    "beyond": {"n": 0, "found": 0},
                    "share_sum": 0.0,
                    "by": by,
                },  # fmt: skip
            )
        )
        part = cell["inside" if needle_in_window(start, end, n, window) else "beyond"]
        part["n"] += 1
        part["found"] += int(float(r["score"]) >= 100.0)
        cell["share_sum"] += min(1.0, window[0] / n)
    for by_method in out.values():
        for by_len in by_method.values():
            for cell in by_len.values():
                total = cell["inside"]["n"] + cell["beyond"]["n"]
                cell["expected_share"] = cell.pop("share_sum") / total
    return out
