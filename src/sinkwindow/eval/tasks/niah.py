"""RULER's single-needle retrieval, S-NIAH-1/2/3, as evaluation tasks (the samples: ``eval/generators/niah.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Prepared, Task

__all__ = ["NeedleTask", "NIAH", "NIAH_ANSWER_TOKENS", "NIAH_MIN_LENGTH"]

# RULER sizes every haystack with tokens_to_generate = 128 answer tokens reserved (equal to
# niah.TOKENS_TO_GENERATE, which a test checks; kept here so that flag parsing need not import the
# generator), and its templates take 85-114 more (SmolLM2's tokenizer): below 2 x 128 no sample fits.
NIAH_ANSWER_TOKENS = 128
NIAH_MIN_LENGTH = 2 * NIAH_ANSWER_TOKENS


@dataclass(frozen=True)
class NeedleTask(Task):
    """One S-NIAH configuration: greedy decoding, RULER's string match (0/100), the needle's place."""

    def settings(self, config) -> dict:
        out = {"niah_max_new_tokens": config.niah_max_new_tokens}
        if getattr(config, "niah_depths", "random") != "random":
            # Only when set: RULER's random depths leave every existing row's fingerprint as it was.
            out["niah_depths"] = config.niah_depths
        return out

    def deviations(self, config) -> list[str]:
        from ..generators.niah import DEVIATIONS

        cap = config.niah_max_new_tokens
        out = []
        if cap is None or cap < NIAH_ANSWER_TOKENS:
            what = "the answer's token count + 16" if cap is None else str(cap)
            out.append(
                f"S-NIAH decodes at most {what} tokens (RULER: 128; the haystack is still sized with 128 "
                f"reserved), stopping at EOS"
            )
        return out + [f"S-NIAH: {d}" for d in DEVIATIONS]

    def token_budget(self, config, length: int, throughput) -> tuple[int, int]:
        cap = config.niah_max_new_tokens
        cap = throughput.auto_decode_tokens if cap is None else min(cap, NIAH_ANSWER_TOKENS)
        return max(0, length - NIAH_ANSWER_TOKENS), cap

    def build_samples(self, tokenizer, length: int, config) -> list:
        from ..generators.niah import generate_niah

        return generate_niah(
            self.name, tokenizer, length, config.samples, seed=config.seed, depths=config.niah_depths
        )

    def prepare(self, tokenizer, sample, config) -> Prepared:
        from ..decoding import encode_prompt
        from ..generators.niah import needle_tokens, ruler_string_match

        ids = encode_prompt(tokenizer, sample.text, chat_wrapped=False)
        span = needle_tokens(tokenizer, sample.text, sample.outputs[0], add_special_tokens=True)
        cap = config.niah_max_new_tokens
        if cap is None:
            cap = max(len(tokenizer(o, add_special_tokens=False).input_ids) for o in sample.outputs) + 16

        def finish(pred: str) -> dict:
            return {
                "score": ruler_string_match(pred, sample.outputs),
                "metric": "string_match",
                "prediction": pred,
                "answer": sample.outputs,
                "depth": sample.depth,
                "n_prompt_tokens": int(ids.shape[1]),
                # [start, end) of the needle's value among the prompt's ids: inside a method's window
                # or beyond it (eval/window_split.py).
                "needle_tokens": list(span),
            }

        return ids, min(sample.max_new_tokens, cap), finish


_SETTINGS = ("niah_max_new_tokens", "niah_depths")
NIAH = (
    NeedleTask("niah_single_1", "niah", "niah_single_1", "S-NIAH-1 (noise haystack, 7-digit values)",
               NIAH_MIN_LENGTH, _SETTINGS),
    NeedleTask("niah_single_2", "niah", "niah_single_2", "S-NIAH-2 (essay haystack, 7-digit values)",
               NIAH_MIN_LENGTH, _SETTINGS),
    NeedleTask("niah_single_3", "niah", "niah_single_3", "S-NIAH-3 (essay haystack, UUID values)",
               NIAH_MIN_LENGTH, _SETTINGS),
)  # fmt: skip
