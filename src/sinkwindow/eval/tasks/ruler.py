"""RULER's synthetic tasks beyond S-NIAH-1/2/3 as evaluation tasks: multi-key, multi-value and
multi-query NIAH, variable tracking, common and frequent words (the samples: ``eval/generators/niah_multi.py``,
``variable_tracking.py``, ``common_words.py``, ``freq_words.py``).

Every row keeps the exact text the model read (``prompt``: RULER's input and answer prefix, before
the tokenizer's special tokens) and, where the answer needs particular lines, ``evidence_tokens``:
their ``[start, end)`` among the prompt's ids (the needles of the queried keys, the chain's five
assignments, the gold documents of a QA question). Common and frequent words are aggregation
tasks: every occurrence of a word is evidence, so their rows record none. QA (``qa_1`` SQuAD,
``qa_2`` HotpotQA, ``eval/generators/ruler_qa.py``) runs on data the user gives (``--ruler-qa-data``) and is
scored by ``string_match_part``, as RULER scores it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Prepared, Task

__all__ = ["RulerTask", "RULER", "RULER_QA", "RULER_CATEGORIES", "RULER_CATEGORY_TITLES"]

_GENERATORS = {
    "niah_multi": ("niah_multi", "generate_niah_multi"),
    "vt": ("variable_tracking", "generate_vt"),
    "cwe": ("common_words", "generate_cwe"),
    "fwe": ("freq_words", "generate_fwe"),
    "qa": ("ruler_qa", "generate_qa"),
}


@dataclass(frozen=True)
class RulerTask(Task):
    """One RULER task: greedy decoding of RULER's ``tokens_to_generate`` (``answer_tokens``, also
    what every prompt is sized to leave), scored by ``string_match_all`` (0-100, partial credit)."""

    source: str = "niah_multi"
    answer_tokens: int = 128
    metric: str = "string_match_all"

    def _capped(self) -> bool:
        # The NIAH decode cap (--niah-max-new-tokens) applies to every NIAH task, as to S-NIAH.
        return self.source == "niah_multi"

    def lengths(self, config) -> list[int]:
        """The run's lengths from :attr:`min_length` on (shorter ones cannot hold the task; the
        run's deviations say which were skipped)."""
        return [n for n in config.lengths if n >= self.min_length]

    def settings(self, config) -> dict:
        if self.source == "qa":
            from pathlib import Path

            from ..fingerprint import folder_identity

            data = config.ruler_qa_data
            return {"ruler_qa_data": None if data is None else folder_identity(Path(data))}
        return {"niah_max_new_tokens": config.niah_max_new_tokens} if self._capped() else {}

    def deviations(self, config) -> list[str]:
        import importlib

        module = importlib.import_module(f"sinkwindow.eval.generators.{_GENERATORS[self.source][0]}")
        out = []
        cap = config.niah_max_new_tokens
        if self._capped() and (cap is None or cap < self.answer_tokens):
            what = "the answers' token count + 16" if cap is None else str(cap)
            out.append(
                f"RULER NIAH decodes at most {what} tokens (RULER: 128; the haystack is still sized "
                f"with 128 reserved), stopping at EOS"
            )
        skipped = [n for n in config.lengths if n < self.min_length]
        if skipped:
            out.append(f"RULER {self.name} skips lengths {skipped}: below {self.min_length} no sample fits")
        label = "RULER NIAH multi-key/value/query" if self._capped() else f"RULER {self.name}"
        return out + [f"{label}: {d}" for d in module.DEVIATIONS]

    def _cap(self, config, tokenizer=None, outputs=()) -> int | None:
        if not self._capped():
            return self.answer_tokens
        cap = config.niah_max_new_tokens
        if cap is not None:
            return min(cap, self.answer_tokens)
        if tokenizer is None:
            return None
        return min(
            self.answer_tokens, len(tokenizer(", ".join(outputs), add_special_tokens=False).input_ids) + 16
        )

    def token_budget(self, config, length: int, throughput) -> tuple[int, int]:
        cap = self._cap(config)
        return max(0, length - self.answer_tokens), throughput.auto_decode_tokens if cap is None else cap

    def build_samples(self, tokenizer, length: int, config) -> list:
        import importlib

        module_name, function = _GENERATORS[self.source]
        generate = getattr(importlib.import_module(f"sinkwindow.eval.generators.{module_name}"), function)
        if self.source == "niah_multi":
            return generate(self.name, tokenizer, length, config.samples, seed=config.seed)
        if self.source == "qa":
            return generate(
                self.name, config.ruler_qa_data, tokenizer, length, config.samples, seed=config.seed
            )
        return generate(tokenizer, length, config.samples, seed=config.seed)

    def prepare(self, tokenizer, sample, config) -> Prepared:
        from ..decoding import encode_prompt
        from ..generators.niah import ruler_string_match_all, ruler_string_match_part
        from ..generators.ruler_common import token_spans

        ids = encode_prompt(tokenizer, sample.text, chat_wrapped=False)
        spans = token_spans(tokenizer, sample.text, sample.evidence, add_special_tokens=True)
        cap = self._cap(config, tokenizer, sample.outputs)
        match = ruler_string_match_part if self.metric == "string_match_part" else ruler_string_match_all

        def finish(pred: str) -> dict:
            row = {
                "score": match(pred, sample.outputs),
                "metric": self.metric,
                "prediction": pred,
                "answer": list(sample.outputs),
                "n_prompt_tokens": int(ids.shape[1]),
                "prompt": sample.text,
            }
            if spans:
                row["evidence_tokens"] = spans
            return row

        return ids, min(sample.max_new_tokens, cap), finish


_NIAH = ("niah_max_new_tokens",)


def _task(
    name: str,
    title: str,
    min_length: int,
    source: str = "niah_multi",
    answer_tokens: int = 128,
    keys: tuple[str, ...] = _NIAH,
    metric: str = "string_match_all",
) -> RulerTask:
    """A RULER-only task: group ``ruler``, its own report column, run only when named."""
    return RulerTask(name, "ruler", name, title, min_length, keys, default=False, source=source,
                     answer_tokens=answer_tokens, metric=metric)  # fmt: skip


RULER = (
    _task("niah_multikey_1", "RULER MK-NIAH-1 (essay, 4 keys, 7-digit values)", 512),
    _task("niah_multikey_2", "RULER MK-NIAH-2 (haystack of needles, word keys)", 512),
    _task("niah_multikey_3", "RULER MK-NIAH-3 (haystack of needles, UUID keys)", 512),
    _task("niah_multivalue", "RULER MV-NIAH (essay, 4 values of one key)", 512),
    _task("niah_multiquery", "RULER MQ-NIAH (essay, 4 keys queried)", 512),
    _task("vt", "RULER VT (variable tracking, 1 chain of 4 hops)", 1024, "vt", 30, ()),
    _task("cwe", "RULER CWE (10 most common words)", 1024, "cwe", 120, ()),
    _task("fwe", "RULER FWE (3 most frequent coded words)", 512, "fwe", 50, ()),
    _task("qa_1", "RULER QA-1 (SQuAD, given data)", 512, "qa", 32, ("ruler_qa_data",), "string_match_part"),
    _task("qa_2", "RULER QA-2 (HotpotQA, given data)", 2048, "qa", 32, ("ruler_qa_data",), "string_match_part"),
)  # fmt: skip
# The tasks that read user-given data (--ruler-qa-data); the `ruler` group runs them when it is given.
RULER_QA = ("qa_1", "qa_2")

# The report's RULER categories (RULER's own grouping): each averages its tasks per method and length.
RULER_CATEGORIES: dict[str, tuple[str, ...]] = {
    "ruler_retrieval": ("niah_single_1", "niah_single_2", "niah_single_3",
                        *(t.name for t in RULER if t.source == "niah_multi")),
    "ruler_multihop": ("vt",),
    "ruler_aggregation": ("cwe", "fwe"),
    "ruler_qa": RULER_QA,
}  # fmt: skip
RULER_CATEGORY_TITLES: dict[str, str] = {
    "ruler_retrieval": "RULER retrieval (niah_*, average)",
    "ruler_multihop": "RULER multi-hop tracing (vt)",
    "ruler_aggregation": "RULER aggregation (cwe, fwe, average)",
    "ruler_qa": "RULER question answering (qa_1, qa_2, average)",
}
