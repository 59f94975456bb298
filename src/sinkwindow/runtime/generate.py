"""sinkwindow's own decoding loop: chunked prefill, then one token at a time through the bounded cache.

``model.generate(..., cache=sinkwindow.make_cache(model))`` works for absolute positions, padding and
beam search. This loop exists for what ``generate`` cannot do:

- stream a prompt longer than the model's context: the prompt is prefilled in chunks (``generate``
  feeds it in one forward), which with ``positions="cache"`` keeps every position below ``w + chunk``;
- decode through a ``torch.compile``d step over the static ring-buffer cache (``DecodeStep``).

``decode_speed`` measures that compiled step against the eager one (ms/token), for benchmarks.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache
from transformers.masking_utils import create_masks_for_generate

from .cache import SinkWindowCache
from .hooks import check_positions
from .make_cache import make_cache
from .masks import token_positions
from .patching import active_native_sliding, active_spec, apply
from .prefill import check_token_ids, input_device, prefill
from .static_cache import StaticSinkWindowCache

__all__ = ["generate", "DecodeStep", "decode_speed", "select_next"]

logger = logging.getLogger(__name__)


def select_next(
    logits: torch.Tensor,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Pick the next token per row.

    Args:
        logits: ``[batch, vocab]``.

    Returns:
        ``[batch]`` token ids: argmax, or a sample after temperature, top-k and top-p filtering.
    """
    if not do_sample:
        return logits.argmax(-1)
    if temperature <= 0:
        raise ValueError(f"temperature must be positive for sampling, got {temperature}")
    logits = logits.float() / temperature
    if top_k is not None and top_k > 0:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token once the tokens before it already cover top_p (the first always stays).
        drop = probs.cumsum(-1) - probs > top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class DecodeStep:
    """One decoding step (a single new token per row) through a sink-window cache.

    Eager: calls the patched model, whose forward pre-hook plans the step. Compiled (``compile=True``,
    static cache only): plans the step and builds the 4-D mask eagerly, then runs a
    ``torch.compile``d ``model.forward`` whose shapes never change (the ring buffer is written in place),
    so it compiles once.

    Args:
        model: a model patched with ``sinkwindow.apply``.
        cache: the cache to decode into (a ``StaticSinkWindowCache`` when compiling).
        compile: compile the forward.
        compile_kwargs: passed to ``torch.compile`` (e.g. ``backend="aot_eager"``, ``mode=...``).
    """

    def __init__(self, model: PreTrainedModel, cache: Cache, *, compile: bool = False, **compile_kwargs):
        self.model = model
        self.cache = cache
        self.compiled = None
        if compile:
            if not isinstance(cache, StaticSinkWindowCache):
                raise ValueError(
                    "compiling the decode step needs fixed shapes: use sinkwindow.make_cache(model, static=True)"
                )
            compile_kwargs.setdefault("dynamic", False)
            self.compiled = torch.compile(model.forward, **compile_kwargs)

    def __call__(self, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Feed ``tokens [batch, 1]`` (with the 2-D ``attention_mask`` of all columns, if padded).

        Returns:
            ``[batch, vocab]`` logits of the next token.
        """
        if self.compiled is None:
            extra = {}
            if attention_mask is not None and not isinstance(self.cache, SinkWindowCache):
                # A stock cache (full attention, unpatched): positions count real tokens, as in generate().
                extra["position_ids"] = token_positions(attention_mask)[:, -tokens.shape[1] :].clamp(min=0)
            out = self.model(
                tokens,
                cache=self.cache,
                attention_mask=attention_mask,
                use_cache=True,
                logits_to_keep=1,
                **extra,
            )
            return out.logits[:, -1]
        cache = self.cache
        plan = cache.begin_step(1, attention_mask, batch_size=tokens.shape[0], device=tokens.device)
        try:
            position_ids = plan.model_pos.expand(tokens.shape[0], -1)
            embeds = torch.empty((tokens.shape[0], 1, 0), dtype=self.model.dtype, device=tokens.device)
            mask = create_masks_for_generate(
                config=self.model.config,
                inputs_embeds=embeds,
                attention_mask=attention_mask,
                cache=cache,
                position_ids=position_ids,
            )
            out = self.compiled(
                input_ids=tokens,
                attention_mask=mask,
                position_ids=position_ids,
                cache=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        finally:
            cache.end_step()
        return out.logits[:, -1]


def _check_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")


@torch.no_grad()
def generate(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    attention_mask: torch.Tensor | None = None,
    cache: Cache | None = None,
    chunk_size: int = 512,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | list[int] | None = None,
    pad_token_id: int | None = None,
    static: bool = False,
    compile: bool = False,
    on_token: Callable[[int, torch.Tensor], None] | None = None,
    progress: bool = False,
) -> torch.Tensor:
    """Greedy or sampled decoding with chunked prefill and the bounded cache.

    Args:
        model: a model patched with ``sinkwindow.apply`` (or unpatched, for full attention).
        input_ids: ``[batch, n]`` prompt; pad rows on the left and pass ``attention_mask``.
        max_new_tokens: tokens to add per row.
        attention_mask: ``[batch, n]`` padding mask of the prompt (left padding).
        cache: continue this cache (default: a fresh ``make_cache(model, static=static)``).
        chunk_size: prefill chunk.
        do_sample, temperature, top_k, top_p, generator: sampling (see ``select_next``).
        eos_token_id: stop a row once it emits one of these; finished rows get ``pad_token_id``.
        pad_token_id: filler for finished rows (default: the first eos id, else 0).
        static: use the static ring-buffer cache.
        compile: ``torch.compile`` the decode step (implies ``static``).
        on_token: called as ``on_token(step, tokens[batch])`` after each new token (streaming).
        progress: show a bar over the prefill's chunks.

    Returns:
        ``[batch, n + max_new_tokens]`` (fewer columns if every row stopped early).
    """
    _check_generate_args(model, input_ids, max_new_tokens, attention_mask, chunk_size, top_k, top_p,
                         eos_token_id, pad_token_id)  # fmt: skip
    static = static or compile
    if cache is None:
        cache = make_cache(model, static=static)
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    if pad_token_id is None:
        pad_token_id = eos[0] if eos else 0
    device = input_device(model)
    input_ids = input_ids.to(device)
    logits, cache = prefill(
        model, input_ids, chunk_size=chunk_size, cache=cache, attention_mask=attention_mask, progress=progress
    )
    mask = None if attention_mask is None else attention_mask.to(device)
    # A continued cache already holds earlier columns, which count as real (see prefill()).
    if mask is not None and cache.get_seq_length() > mask.shape[1]:
        mask = torch.cat([mask.new_ones((mask.shape[0], cache.get_seq_length() - mask.shape[1])), mask], 1)

    def choose(step_logits: torch.Tensor) -> torch.Tensor:
        return select_next(
            step_logits, do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
            generator=generator,
        )  # fmt: skip

    step = DecodeStep(model, cache, compile=compile)
    new = _decode_loop(step, logits, mask, max_new_tokens, choose, eos, pad_token_id, on_token)
    return torch.cat([input_ids, *new], dim=1)


def _check_generate_args(
    model, input_ids, max_new_tokens, attention_mask, chunk_size, top_k, top_p, eos_token_id, pad_token_id
) -> None:
    """``generate``'s argument checks: one line naming the fix, before any compute."""
    check_token_ids(model, input_ids)
    _check_int("max_new_tokens", max_new_tokens)
    _check_int("chunk_size", chunk_size)
    for name, value in (("eos_token_id", eos_token_id), ("pad_token_id", pad_token_id)):
        ids = [value] if not isinstance(value, list | tuple) else list(value)
        if value is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise TypeError(
                f"{name} must be a token id (int) or a list of them, got {value!r}: use tokenizer.eos_token_id"
            )
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0: no top-k filter), got {top_k}")
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must be a non-empty [batch, n] prompt, got shape {tuple(input_ids.shape)}"
        )
    if active_spec(model).positions != "cache":
        # Fail before any compute, not after the prefill.
        check_positions(model, input_ids.shape[1] + max_new_tokens)
    if attention_mask is not None and not bool(attention_mask[:, -1].all()):
        raise ValueError(
            "right padding cannot be continued: a row's next token would follow its padding. Pad prompts on the "
            "left for generation (tokenizer.padding_side = 'left')"
        )


def _decode_loop(
    step: DecodeStep,
    logits: torch.Tensor,
    mask: torch.Tensor | None,
    max_new_tokens: int,
    choose: Callable[[torch.Tensor], torch.Tensor],
    eos: list[int],
    pad_token_id: int,
    on_token: Callable[[int, torch.Tensor], None] | None,
) -> list[torch.Tensor]:
    """Decode after the prefill: ``logits`` ``[batch, vocab]`` of the last prompt token in, the new
    tokens out as ``[batch, 1]`` columns (a row that emitted an eos id is padded from then on; the
    loop stops when every row has)."""
    done = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    eos_t = torch.tensor(eos, device=logits.device) if eos else None
    out = []
    for i in range(max_new_tokens):
        nxt = choose(logits)
        nxt = torch.where(done, torch.full_like(nxt, pad_token_id), nxt)
        out.append(nxt[:, None])
        if on_token is not None:
            on_token(i, nxt)
        if eos_t is not None:
            done = done | torch.isin(nxt, eos_t)
            if bool(done.all()):
                break
        if i == max_new_tokens - 1:
            break
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
        logits = step(nxt[:, None], mask)
    return out


@torch.no_grad()
def decode_speed(
    model: PreTrainedModel,
    spec: str | None = None,
    *,
    context: int = 512,
    tokens: int = 64,
    warmup: int = 3,
    rounds: int = 4,
    batch_size: int = 1,
    seed: int = 0,
    **compile_kwargs,
) -> dict:
    """Decode ms/token through the static cache, eager vs ``torch.compile``d (the compile-friendly path).

    Both paths prefill the same random context into their own static cache, take ``warmup`` untimed
    steps (the compiled path's first step compiles: reported as ``compile_s``), then decode ``tokens``
    steps each, alternating in ``rounds`` blocks so that load drifting on a shared machine hits both
    alike; the reported ms/token are medians over blocks.

    Args:
        model: any supported model; ``spec`` (e.g. ``"swa:256:4"``) is applied for the measurement and the
            model's previous spec restored afterwards; ``None`` keeps the active spec.
        context: prompt tokens before timing.
        tokens: timed decode steps per path.
        compile_kwargs: for ``torch.compile`` (default backend inductor).

    Returns:
        ``{"spec", "context", "tokens", "batch_size", "eager_ms_per_token", "compiled_ms_per_token",
        "speedup", "compile_s", "max_abs_logit_diff"}``; the last compares the two paths' final logits.
    """
    # A block: leaving it restores what the model ran before, whatever spec was measured.
    with apply(
        model, spec if spec is not None else active_spec(model), native_sliding=active_native_sliding(model)
    ):
        measured = active_spec(model)
        if not measured.is_windowed:
            raise ValueError(
                "decode_speed times the sink-window static cache: pass a spec such as 'swa:256:4'"
            )
        device = input_device(model)
        g = torch.Generator().manual_seed(seed)
        vocab = model.config.get_text_config(decoder=True).vocab_size
        prompt = torch.randint(1, vocab, (batch_size, context), generator=g).to(device)
        feed = torch.randint(1, vocab, (batch_size, warmup + tokens), generator=g).to(device)
        steps, logits, compile_s = {}, {}, 0.0
        for name in ("eager", "compiled"):
            cache = make_cache(model, static=True)
            prefill(model, prompt, chunk_size=256, cache=cache, return_logits="none")
            steps[name] = DecodeStep(model, cache, compile=name == "compiled", **compile_kwargs)
            t0 = time.perf_counter()
            logits[name] = steps[name](feed[:, :1])
            if name == "compiled":
                compile_s = time.perf_counter() - t0
            for i in range(1, warmup):
                logits[name] = steps[name](feed[:, i : i + 1])
        times: dict[str, list[float]] = {"eager": [], "compiled": []}
        rounds = max(1, min(rounds, tokens))
        bounds = [warmup + tokens * r // rounds for r in range(rounds + 1)]
        for lo, hi in zip(bounds, bounds[1:]):
            for name in ("eager", "compiled"):
                _sync(device)
                t0 = time.perf_counter()
                for i in range(lo, hi):
                    logits[name] = steps[name](feed[:, i : i + 1])
                _sync(device)
                times[name].append((time.perf_counter() - t0) / max(hi - lo, 1) * 1e3)
    eager_ms = statistics.median(times["eager"])
    compiled_ms = statistics.median(times["compiled"])
    return {
        "spec": str(measured),
        "context": context,
        "tokens": tokens,
        "batch_size": batch_size,
        "eager_ms_per_token": eager_ms,
        "compiled_ms_per_token": compiled_ms,
        "speedup": eager_ms / compiled_ms,
        "compile_s": compile_s,
        "max_abs_logit_diff": float((logits["eager"].float() - logits["compiled"].float()).abs().max()),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
