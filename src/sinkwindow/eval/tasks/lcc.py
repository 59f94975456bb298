"""LongBench-LCC-style next-line completion on the Python standard library as an evaluation task
(the samples: ``eval/generators/code.py``, the score: ``eval/code_sim.py``)."""

from __future__ import annotations

import platform
from dataclasses import dataclass

from .base import Prepared, Task

__all__ = ["CodeTask", "LCC", "LCC_ANSWER_TOKENS", "LCC_MIN_LENGTH"]

# LongBench decodes 64 tokens for lcc (code.MAX_NEW_TOKENS, which a test holds equal; kept here so
# that flag parsing need not import the generator), and every context is sized with them reserved.
# The template takes about 15 more: below 4 x 64 a context holds only a few lines.
LCC_ANSWER_TOKENS = 64
LCC_MIN_LENGTH = 4 * LCC_ANSWER_TOKENS


@dataclass(frozen=True)
class CodeTask(Task):
    """Next-line completion: greedy decoding of 64 tokens, LongBench's ``code_sim_score`` (0-100) as
    the score, exact match (0/100) beside it, the nearest line the answer depends on."""

    def settings(self, config) -> dict:
        # Each Python ships its own stdlib: the samples are those of the interpreter that ran.
        return {"lcc_python": platform.python_version()}

    def deviations(self, config) -> list[str]:
        from ..generators.code import DEVIATIONS

        return [f"LCC (Python {platform.python_version()} stdlib): {d}" for d in DEVIATIONS]

    def token_budget(self, config, length: int, throughput) -> tuple[int, int]:
        return max(0, length - LCC_ANSWER_TOKENS), LCC_ANSWER_TOKENS

    def build_samples(self, tokenizer, length: int, config) -> list:
        from ..generators.code import generate_lcc

        return generate_lcc(tokenizer, length, config.samples, seed=config.seed)

    def prepare(self, tokenizer, sample, config) -> Prepared:
        from ..code_sim import code_sim_score, exact_match
        from ..decoding import encode_prompt

        # LongBench sends lcc prompts without a chat template.
        ids = encode_prompt(tokenizer, sample.prompt, chat_wrapped=False)
        evidence = sample.evidence or {}

        def finish(pred: str) -> dict:
            return {
                "score": code_sim_score(pred, sample.answer),
                "metric": "code_sim",
                "exact_match": exact_match(pred, sample.answer),
                "prediction": pred,
                "answer": sample.answer,
                "file": sample.target_file,
                "line": sample.line,
                "files": sample.files,
                "python_version": sample.python_version,
                "prompt": sample.prompt,
                "n_prompt_tokens": int(ids.shape[1]),
                "context_lines": sample.context_lines,
                "answer_names": sample.answer_names,
                # The nearest context line binding a name the answer reads (null: none in the
                # context); [start, end) among the prompt's ids, as S-NIAH's needle_tokens.
                "evidence_file": evidence.get("file"),
                "evidence_line": evidence.get("line"),
                "evidence_name": evidence.get("name"),
                "evidence_distance_lines": evidence.get("distance_lines"),
                "evidence_distance_tokens": evidence.get("distance_tokens"),
                "evidence_tokens": evidence.get("tokens"),
            }

        return ids, sample.max_new_tokens, finish


LCC = CodeTask(
    "lcc", "code", "lcc", "LCC (next-line code completion, Python stdlib; edit similarity)", LCC_MIN_LENGTH,
    ("lcc_python",), default=False,
)  # fmt: skip
