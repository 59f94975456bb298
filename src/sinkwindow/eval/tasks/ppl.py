"""Perplexity of essay windows as an evaluation task (``eval/perplexity.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Task

__all__ = ["PerplexityTask", "PERPLEXITY", "PPL_MIN_LENGTH"]

# One token to predict from and one to predict.
PPL_MIN_LENGTH = 2


@dataclass(frozen=True)
class PerplexityTask(Task):
    """Token-level NLL of ``ppl_windows`` essay windows per length, streamed through chunked prefill
    one window per cell; rows keep the per-position buckets."""

    def lengths(self, config) -> list[int]:
        return list(config.ppl_lengths)

    def count(self, config) -> int:
        return config.ppl_windows

    def batch_size(self, batch_size: int) -> int:
        return 1

    def settings(self, config) -> dict:
        return {"ppl_bucket": config.ppl_bucket}

    def token_budget(self, config, length: int, throughput) -> tuple[int, int]:
        return length, 0

    def run(self, model, tokenizer, length: int, indices, config, state: dict) -> list[dict]:
        from ..perplexity import essay_token_windows, perplexity

        windows = state.setdefault("ppl", {})
        if length not in windows:
            windows[length] = essay_token_windows(tokenizer, length, config.ppl_windows)
        rows = []
        for i in indices:
            res = perplexity(
                model, windows[length][i], chunk_size=config.chunk_size, bucket_size=config.ppl_bucket
            )
            rows.append(
                {
                    "score": res.ppl,
                    "metric": "ppl",
                    "nll_sum": res.nll_sum,
                    "n_tokens": res.n_tokens,
                    "bucket_size": res.bucket_size,
                    "bucket_nll_sum": res.bucket_nll_sum,
                    "bucket_count": res.bucket_count,
                }
            )
        return rows


PERPLEXITY = PerplexityTask("ppl", "ppl", "ppl", "Perplexity", PPL_MIN_LENGTH, ("ppl_bucket",))
