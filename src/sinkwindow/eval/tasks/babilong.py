"""BABILong QA1–QA5 as evaluation tasks (the samples: ``eval/generators/babilong.py``, the facts: ``eval/generators/babi.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .base import Prepared, Task

__all__ = ["BabilongTask", "BABILONG", "BABILONG_PROMPT_RESERVE", "BABILONG_MIN_LENGTH"]

# BABILong keeps babilong.PROMPT_RESERVE = 300 tokens for the prompt (a test holds them equal); 100
# more hold the facts and some background. 0 is BABILong's 0K (the facts alone).
BABILONG_PROMPT_RESERVE = 300
BABILONG_MIN_LENGTH = BABILONG_PROMPT_RESERVE + 100


@dataclass(frozen=True)
class BabilongTask(Task):
    """One bAbI task hidden in essay text: greedy decoding, BABILong's ``compare_answers`` (0/100)."""

    def lengths(self, config) -> list[int]:
        if config.babilong_lengths is not None:
            return list(config.babilong_lengths)
        return list(config.lengths)

    def settings(self, config) -> dict:
        from ..fingerprint import folder_identity

        data = config.babilong_data
        return {
            "babilong_facts": config.babilong_facts,
            "babilong_data": None if data is None else folder_identity(Path(data)),
            "babilong_chat": config.babilong_chat,
        }

    def deviations(self, config) -> list[str]:
        from ..generators.babilong import DEVIATIONS, babilong_data_kind

        data = config.babilong_data
        # Published samples (a BABILong JSON folder) are used verbatim: no rebuilding deviations.
        if data is not None and babilong_data_kind(data) == "babilong-json":
            return []
        out = [f"BABILong: {d}" for d in DEVIATIONS]
        if config.babilong_facts == "generated":
            out.append(
                "BABILong facts come from sinkwindow's seeded bAbI generator (tasks 1-5), not the "
                "released test set (--babilong-facts generated)"
            )
            return out
        if any(length > 0 for length in self.lengths(config)):
            out.append(
                "BABILong: at lengths above 0K a question whose facts do not fit is skipped and the "
                "next one taken, so sample i may be a different question than at 0K (qa3 mostly)"
            )
        if config.samples > 100:
            out.append(
                "BABILong: samples past BABILong's 100-question subset are the test file's other "
                "questions in file order"
            )
        return out

    def token_budget(self, config, length: int, throughput) -> tuple[int, int]:
        from ..generators.babilong import MAX_NEW_TOKENS

        return (length if length > 0 else throughput.babilong_0k_tokens), MAX_NEW_TOKENS

    def build_samples(self, tokenizer, length: int, config) -> list:
        from ..generators.babilong import generate_babilong

        # A data folder's published contexts (BABILong JSON) are used as they are.
        return generate_babilong(
            self.name.removeprefix("babilong_"),
            tokenizer,
            length,
            config.samples,
            seed=config.seed,
            source=config.babilong_data,
            facts=config.babilong_facts,
            keep_context=config.babilong_data is not None,
        )

    def prepare(self, tokenizer, sample, config) -> Prepared:
        from ..decoding import encode_prompt

        text = sample.prompt
        if config.babilong_chat and getattr(tokenizer, "chat_template", None):
            # BABILong wraps its prompts in the model's chat template for instruct models.
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": sample.prompt}], tokenize=False, add_generation_prompt=True
            )
        ids = encode_prompt(tokenizer, text, chat_wrapped=text != sample.prompt)

        def finish(pred: str) -> dict:
            return {
                "score": sample.score(pred),
                "metric": "compare_answers",
                "prediction": pred,
                "answer": sample.target,
                "question": sample.question,
                "n_prompt_tokens": int(ids.shape[1]),
            }

        return ids, sample.max_new_tokens, finish


_SETTINGS = ("babilong_facts", "babilong_data", "babilong_chat")
BABILONG = tuple(
    BabilongTask(
        f"babilong_qa{i}", "babilong", "babilong", "BABILong QA1–QA5 average", BABILONG_MIN_LENGTH, _SETTINGS
    )
    for i in range(1, 6)
)
