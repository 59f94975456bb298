"""Calibration prompts: S-NIAH prompts of a seed no evaluation uses, with their gold answers for
teacher forcing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "CAL_HAYSTACK_OFFSET",
    "CAL_SEED",
    "EVAL_SEEDS",
    "check_calibration_seed",
    "CalibrationPrompt",
    "calibration_prompts",
]


# Seed of the calibration prompts. sinkwindow eval and compare default to 42 and people vary it
# by small amounts; this sits far outside EVAL_SEEDS, so no calibration prompt is an eval prompt.
CAL_SEED = 7_000_000


# Essay haystacks of calibration prompts start here (a word index of RULER's 111,877-word essay
# haystack, at the next sentence): evaluation reads from word 0, about 800 words per 1K tokens, so
# the two share no text at any context up to about 64K tokens.
CAL_HAYSTACK_OFFSET = 56_000
# Seeds reserved for evaluation: calibration and held-out seeds must stay outside them.
EVAL_SEEDS = range(0, 1_000_000)


def check_calibration_seed(seed: int, what: str = "seed") -> int:
    """Refuse a seed that evaluation uses (``EVAL_SEEDS``): calibration must never see eval prompts."""
    if seed in EVAL_SEEDS:
        raise ValueError(
            f"{what} {seed} is in the range evaluation uses ({EVAL_SEEDS.start}..{EVAL_SEEDS.stop - 1}; "
            f"sinkwindow eval defaults to 42): calibrating on it would tune on the test set; use a seed "
            f">= {EVAL_SEEDS.stop}, e.g. the default {CAL_SEED}"
        )
    return seed


@dataclass
class CalibrationPrompt:
    """One S-NIAH prompt with its gold answer, for teacher forcing.

    Attributes:
        input_ids: ``[1, n]`` the prompt through the answer prefix, encoded as the eval runner does.
        answer_ids: ``[1, a]`` the needle's value (with its leading space), which follows it.
        needle: ``[start, end)`` of the needle's value among ``input_ids`` (``eval.niah.needle_tokens``),
            where a head that retrieves the answer must look; ``None`` when unknown.
    """

    task: str
    index: int
    input_ids: torch.Tensor
    answer_ids: torch.Tensor
    needle: tuple[int, int] | None = None

    @property
    def n_tokens(self) -> int:
        return int(self.input_ids.shape[1] + self.answer_ids.shape[1])


def calibration_prompts(
    tokenizer, samples: int = 4, length: int = 2048, seed: int = CAL_SEED, tasks: Sequence[str] | None = None
) -> list[CalibrationPrompt]:
    """``samples`` S-NIAH prompts of ``length`` tokens (answer budget included), tasks taken in turn.

    Prompt i is sample ``i // len(tasks)`` of task ``tasks[i % len(tasks)]``, each task's samples
    drawn with ``generate_niah(task, tokenizer, length, count, seed=seed)`` from an essay haystack that
    starts at :data:`CAL_HAYSTACK_OFFSET`: other needles (the seed) in other text (the essays) than
    any evaluation prompt.
    """
    from ..eval.decoding import encode_prompt
    from ..eval.generators.niah import generate_niah, needle_tokens
    from ..eval.tasks import NIAH_TASKS

    tasks = tuple(tasks or NIAH_TASKS)
    if samples < 1:
        raise ValueError(f"give at least one calibration sample, got {samples}")
    counts = {t: len(range(i, samples, len(tasks))) for i, t in enumerate(tasks)}
    drawn = {
        t: generate_niah(t, tokenizer, length, c, seed=seed, haystack_offset=CAL_HAYSTACK_OFFSET)
        for t, c in counts.items()
        if c
    }
    out = []
    for i in range(samples):
        task = tasks[i % len(tasks)]
        s = drawn[task][i // len(tasks)]
        answer = tokenizer(" " + s.outputs[0], add_special_tokens=False, return_tensors="pt").input_ids
        ids = encode_prompt(tokenizer, s.text, chat_wrapped=False)
        # The eval runner's own span (raw prompt: the tokenizer's special tokens, as encode_prompt).
        needle = needle_tokens(tokenizer, s.text, s.outputs[0], add_special_tokens=True)
        out.append(CalibrationPrompt(task, s.index, ids, answer, needle))
    return out
