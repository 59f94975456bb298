"""Local-file loaders and prompt helpers for the offline ``*_local`` lm-eval tasks.

lm-eval imports this file by path (``!function utils.load_local`` in the YAMLs beside it), so it
uses only the standard library and ``datasets``, never relative imports.

Each task's YAML names its data through ``dataset_kwargs: {sinkwindow_task: ...}``; the folder
comes from the task metadata key ``data_dir`` (``TaskManager(metadata=...)``, ``--metadata`` or
``--model_args ...,data_dir=DIR``) or else the ``SINKWINDOW_SHORT_DATA`` environment variable.
The files are the hub datasets' own schemas (see ``LOCAL_FILES``), except HellaSwag, which may
also come in llama.cpp's preprocessed text format.
"""

from __future__ import annotations

import bz2
import functools
import json
import os
import re
from pathlib import Path
from typing import Any

DATA_ENV = "SINKWINDOW_SHORT_DATA"

# Task -> {split: candidate file names relative to the data folder, first existing wins}.
LOCAL_FILES: dict[str, dict[str, tuple[str, ...]]] = {
    "arc_easy": {"test": ("arc_easy_test.jsonl",)},
    "arc_challenge": {"test": ("arc_challenge_test.jsonl",)},
    "piqa": {"validation": ("piqa_validation.jsonl",)},
    "winogrande": {"validation": ("winogrande_xl_validation.jsonl", "winogrande_validation.jsonl")},
    "mmlu": {"test": ("mmlu_test.jsonl",), "dev": ("mmlu_dev.jsonl",)},
    # The lm-eval schema (ctx_a/ctx_b) when a genuine copy is present, else the text format.
    "hellaswag": {
        "validation": (
            "hellaswag_validation.jsonl",
            "hellaswag_textformat/hellaswag_val_full.txt.bz2",
            "hellaswag_textformat/hellaswag_val_full.txt",
            "hellaswag_val_full.txt.bz2",
            "hellaswag_val_full.txt",
        )
    },
}


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The folder holding the local files: ``data_dir`` or ``$SINKWINDOW_SHORT_DATA``."""
    value = data_dir if data_dir not in (None, "") else os.environ.get(DATA_ENV)
    if not value:
        raise FileNotFoundError(
            f"offline lm-eval tasks need a data folder: pass data_dir (--data-dir DIR, --metadata data_dir=DIR "
            f"or --model_args ...,data_dir=DIR) or set {DATA_ENV}"
        )
    return Path(value).expanduser().resolve()


def find_files(task: str, data_dir: str | os.PathLike | None = None) -> dict[str, Path]:
    """``{split: path}`` of ``task``'s local files.

    Raises:
        FileNotFoundError: naming every file name that was looked for.
    """
    root = resolve_data_dir(data_dir)
    if task not in LOCAL_FILES:
        raise KeyError(f"no local files are defined for {task!r}; known: {', '.join(LOCAL_FILES)}")
    found = {}
    for split, names in LOCAL_FILES[task].items():
        path = next((root / n for n in names if (root / n).is_file()), None)
        if path is None:
            raise FileNotFoundError(f"{task} ({split}): none of {', '.join(names)} in {root}")
        found[split] = path
    return found


@functools.lru_cache(maxsize=16)
def _read_jsonl(path: str, mtime: float) -> tuple[dict, ...]:
    # Cached on (path, mtime): the 57 MMLU subject tasks all read the same two files.
    with open(path, encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def read_jsonl(path: Path) -> tuple[dict, ...]:
    return _read_jsonl(str(path), path.stat().st_mtime)


def preprocess(text: str) -> str:
    """lm-eval's HellaSwag text clean-up (``tasks/hellaswag/utils.py``), idempotent on clean text."""
    text = text.strip()
    # Brackets are artifacts of the WikiHow part of HellaSwag.
    text = text.replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    text = text.replace("  ", " ")
    return text


def hellaswag_from_hub_schema(doc: dict) -> dict:
    """lm-eval's ``process_docs`` for one row in the ``Rowan/hellaswag`` schema."""
    ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
    return {
        "query": preprocess(doc["activity_label"] + ": " + ctx),
        "choices": [preprocess(e) for e in doc["endings"]],
        "label": str(doc["label"]),
        "gold": int(doc["label"]),
    }


def read_hellaswag_text(path: Path) -> list[dict]:
    """Read llama.cpp's HellaSwag text format: 6 lines per item.

    Lines: ``activity_label + ": " + ctx`` (already preprocessed), the gold index, 4 endings. The
    context is ``ctx`` as one string, so lm-eval's capitalisation of ``ctx_b`` cannot be redone;
    scores can differ slightly from stock ``hellaswag``.
    """
    opener = bz2.open if path.suffix == ".bz2" else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = f.read().split("\n")
    while lines and lines[-1] == "":
        lines.pop()
    if len(lines) % 6:
        raise ValueError(f"{path}: {len(lines)} lines is not a multiple of 6 (context, label, 4 endings)")
    docs = []
    for i in range(0, len(lines), 6):
        ctx, label, endings = lines[i], lines[i + 1].strip(), lines[i + 2 : i + 6]
        if label not in {"0", "1", "2", "3"}:
            raise ValueError(f"{path}: line {i + 2} should be the gold index 0-3, got {label!r}")
        docs.append(
            {
                "query": preprocess(ctx),
                "choices": [preprocess(e) for e in endings],
                "label": label,
                "gold": int(label),
            }
        )
    return docs


def load_rows(
    task: str, data_dir: str | os.PathLike | None = None, subject: str | None = None
) -> dict[str, list[dict]]:
    """``{split: rows}`` for a task, in the schema its YAML's prompts expect."""
    files = find_files(task, data_dir)
    out: dict[str, list[dict]] = {}
    for split, path in files.items():
        if task == "hellaswag":
            if path.suffix == ".jsonl":
                out[split] = [hellaswag_from_hub_schema(d) for d in read_jsonl(path)]
            else:
                out[split] = read_hellaswag_text(path)
            continue
        rows = read_jsonl(path)
        if subject is not None:
            rows = tuple(r for r in rows if r["subject"] == subject)
            if not rows:
                raise ValueError(f"{path} has no rows with subject {subject!r}")
        out[split] = list(rows)
    return out


def load_local(sinkwindow_task: str, subject: str | None = None, data_dir: str | None = None, **_: Any):
    """``custom_dataset`` entry point: a ``datasets.DatasetDict`` read from local files.

    lm-eval calls it with the task metadata and ``dataset_kwargs`` as keyword arguments; the
    metadata also holds unrelated keys (``version``, model arguments), hence ``**_``.
    """
    import datasets

    return datasets.DatasetDict(
        {
            split: datasets.Dataset.from_list(rows)
            for split, rows in load_rows(sinkwindow_task, data_dir, subject).items()
        }
    )


# WinoGrande partial scoring, as lm-eval's tasks/winogrande/preprocess_winogrande.py: the context
# is the sentence up to the blank with each option filled in, the target the rest.
def winogrande_doc_to_text(doc: dict) -> int:
    return {"1": 0, "2": 1}[doc["answer"]]


def winogrande_doc_to_target(doc: dict) -> str:
    idx = doc["sentence"].index("_") + 1
    return doc["sentence"][idx:].strip()


def winogrande_doc_to_choice(doc: dict) -> list[str]:
    idx = doc["sentence"].index("_")
    return [doc["sentence"][:idx] + opt for opt in (doc["option1"], doc["option2"])]
