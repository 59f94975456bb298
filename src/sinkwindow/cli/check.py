"""``sinkwindow check``: verify the SWA(w, s) runtime on the user's own model, end to end.

One short sequence of random token ids, longer than W, goes through every path the runtime has,
and each path is compared with the one it must equal:

- the patched model with SDPA and with eager attention, against the slow float64 reference
  (``reference``: dense attention masked from the formula, no transformers mask code, no cache).
  The reference is a float64 copy, so on a big model both run on a copy cut to its first K
  decoder layers (``truncate_layers``); a mask error shows up in the first layer it reaches;
- eager against SDPA on the whole model;
- chunked prefill (``prefill``) and then token-by-token decoding on the bounded cache, against the
  one-shot forward of the same patched model;
- the bounded cache: entries per layer never above W - 1 (W with the query), and full once the
  sequence is past the window;
- "SWA != full": past position W the patched logits must differ from full attention by more than
  the tolerance, which proves the mask reaches the attention at all (the silent failure: an
  attention function registered without its mask builder gets no mask and attends to everything).

**Tolerances.** Every comparison is ``max |Δlogit| <= rel * scale`` with ``scale`` the largest
``|logit|`` of the side taken as truth (at least 1), and ``rel`` set by the dtype the model runs in
(``TOLERANCES``). Equal computations in different kernel orders (SDPA vs eager, chunks vs one shot,
float32 vs float64) differ by rounding only: float32's unit roundoff is 6e-8, and sums over a
hidden size of ~10^3 through tens of layers stay near 1e-6 of the logit scale (SmolLM2-135M:
1.5e-6), so 1e-4 leaves a wide margin, while a mask that admits or drops a single key moves logits
by far more (SmolLM2, window off by one: 0.14 of the scale within 4 layers). Half precision is coarse: SmolLM2 in float16 shows 3e-3 of the scale
between SDPA and eager, in bfloat16 3e-2, hence 2e-2 and 1e-1; use float32 (the default) for a
sharp check. "SWA != full" must exceed the same tolerance: a difference within it could be rounding
alone, and a mask that does not apply leaves patched and full attention equal up to rounding.

This module is not part of the core: it uses only the public runtime (``apply``, ``make_cache``,
``prefill``, ``reference``), and the CLI prints what it returns.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import asdict, dataclass, field

import torch
from transformers import PreTrainedModel

from ..methods import METHODS, method_of
from ..runtime.cache import SinkWindowCache
from ..runtime.capability import base_class, native_sliding_layers, text_config
from ..runtime.make_cache import make_cache
from ..runtime.patching import apply
from ..runtime.prefill import input_device, prefill
from ..runtime.reference import reference_logits
from ..runtime.spec import MethodSpec, parse_spec

__all__ = [
    "CheckResult",
    "CheckReport",
    "check_model",
    "default_seq_len",
    "default_layers",
    "truncate_layers",
    "validate_options",
    "TOLERANCES",
]

logger = logging.getLogger(__name__)

# max |Δlogit| allowed, relative to the logit scale, per dtype the model runs in (module docstring).
TOLERANCES: dict[torch.dtype, float] = {
    torch.float64: 1e-8,
    torch.float32: 1e-4,
    torch.float16: 2e-2,
    torch.bfloat16: 1e-1,
}
# Reference copies keep at least this many decoder layers (more if a layer type first shows up later).
MIN_REFERENCE_LAYERS = 4
# Token-by-token decoding covers at most this many steps (each is a whole-model forward).
MAX_DECODE_STEPS = 32
# Config attributes holding token ids that random input must avoid (padding, BOS/EOS, image tokens...).
_SPECIAL_ID_ATTRS = (
    "pad_token_id", "bos_token_id", "eos_token_id", "image_token_id", "image_token_index",
    "boi_token_index", "eoi_token_index", "video_token_id", "audio_token_id",
)  # fmt: skip


@dataclass
class CheckResult:
    """One row of the check table.

    Attributes:
        name: stable id (``sdpa_vs_reference``, ``cache_entries``...), what JSON and tests match on.
        label: what the table shows.
        value: the measured number (max |Δlogit|, or cache entries).
        tolerance: the bound ``value`` must stay within (``swa_differs_from_full``: must exceed).
        status: ``"pass"``, ``"fail"`` or ``"skip"``.
        detail: one line on what was compared, or why it failed or was skipped.
    """

    name: str
    label: str
    value: float | int | None
    tolerance: float | int | None
    status: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status != "fail"


@dataclass
class CheckReport:
    """What ``check_model`` found.

    Attributes:
        model: what the model is called (the ``--model`` argument, or its ``name_or_path``).
        spec: canonical spec string checked.
        seq_len: tokens in the test sequence.
        layers: decoder layers of the model.
        reference_layers: decoder layers of the copy compared with the fp64 reference.
        dtype: the model's dtype (sets the tolerances).
        window: W.
        cache_entries: per layer, the most entries the bounded cache held between forwards.
        cache_bounds: per layer, the most it may hold (W - 1, or a kept native window - 1).
        checks: the rows of the table.
        seconds: wall time of the whole check.
    """

    model: str
    spec: str
    seq_len: int
    layers: int
    reference_layers: int
    dtype: str
    window: int
    cache_entries: list[int] = field(default_factory=list)
    cache_bounds: list[int] = field(default_factory=list)
    checks: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def failed(self) -> list[str]:
        """Names of the failed checks."""
        return [c.name for c in self.checks if not c.passed]

    def to_json(self) -> dict:
        out = asdict(self)
        out = {"ok": self.ok, "failed": self.failed, **out}
        out["seconds"] = round(self.seconds, 2)
        return out

    def table(self) -> str:
        """The human-readable table (the CLI prints it)."""
        head = (
            f"sinkwindow check: {self.model}  {self.spec}  {self.seq_len} tokens  {self.dtype}  "
            f"{self.layers} layers (fp64 reference on the first {self.reference_layers})"
        )
        rows = [("path", "max |Δlogit|", "tolerance", "result")]
        for c in self.checks:
            value, tol = _fmt(c.value), _fmt(c.tolerance)
            if c.name == "swa_differs_from_full" and c.tolerance is not None:
                tol = f"> {tol}"
            rows.append((c.label, value, tol, c.status.upper()))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [head, ""]
        for i, r in enumerate(rows):
            lines.append("  ".join(x.ljust(w) for x, w in zip(r, widths)).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        for c in self.checks:
            if c.status != "pass":
                lines.append(f"  {c.name}: {c.detail}")
        entries = _summarise_entries(self.cache_entries, self.cache_bounds)
        lines += ["", f"cache entries per layer: {entries} (W = {self.window}; the query makes W)"]
        verdict = "OK" if self.ok else "FAILED: " + ", ".join(self.failed)
        lines.append(f"{verdict}  ({self.seconds:.1f} s)")
        return "\n".join(lines)


def _fmt(x: float | int | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if isinstance(x, float) else str(x)


def _summarise_entries(entries: list[int], bounds: list[int]) -> str:
    if not entries:
        return "none"
    groups: dict[tuple[int, int], int] = {}
    for e, b in zip(entries, bounds):
        groups[(e, b)] = groups.get((e, b), 0) + 1
    return ", ".join(
        f"{n} layer{'s' if n > 1 else ''} at {e} (max {b})" for (e, b), n in sorted(groups.items())
    )


def default_seq_len(window: int) -> int:
    """Tokens to check SWA(W, s) on: W, up to 64 more past the window, and 7 so nothing lines up.

    ``swa:64:4`` gives 2W + 7 = 135; a huge W stays at W + 71, so the run grows with W only.
    """
    return window + min(window, 64) + 7


def _per_layer_lists(cfg, n_layers: int) -> dict[str, list]:
    """Config attributes that are one entry per decoder layer (``layer_types``, ``no_rope_layers``...)."""
    return {
        k: v
        for k, v in vars(cfg).items()
        if not k.startswith("_") and isinstance(v, (list, tuple)) and len(v) == n_layers and n_layers > 1
    }


def default_layers(model: PreTrainedModel) -> int:
    """Layers the reference copy keeps: ``MIN_REFERENCE_LAYERS``, or more so that every kind of layer
    (each value of each per-layer config list, e.g. Gemma 3's first global layer) is in the copy."""
    cfg = text_config(model)
    n = cfg.num_hidden_layers
    k = MIN_REFERENCE_LAYERS
    for values in _per_layer_lists(cfg, n).values():
        firsts: dict = {}
        for i, v in enumerate(values):
            firsts.setdefault(repr(v), i)
        k = max(k, max(firsts.values()) + 1)
    return min(k, n)


def _decoder_layers(model: PreTrainedModel) -> tuple[torch.nn.Module, str]:
    """``(decoder, attribute)`` of the ModuleList holding the decoder blocks."""
    decoder = model.get_decoder()
    n = text_config(model).num_hidden_layers
    for name, child in decoder.named_children():
        if isinstance(child, torch.nn.ModuleList) and len(child) == n:
            return decoder, name
    raise ValueError(
        f"cannot find the {n} decoder layers of {type(decoder).__name__} to cut a reference copy; "
        f"pass layers={n} (--layers {n}) to compare the whole model"
    )


def truncate_layers(model: PreTrainedModel, k: int) -> PreTrainedModel:
    """A deep copy of ``model`` keeping only its first ``k`` decoder layers.

    The dropped layers are never copied (they are shared through deepcopy's memo, then removed), and
    the copy's config says ``num_hidden_layers = k`` with every per-layer list (``layer_types``...)
    cut to match, so caches and masks are sized for k layers. The embedding, final norm and LM head
    stay, so the copy maps ids to logits like the model with its upper layers removed.
    """
    n = text_config(model).num_hidden_layers
    if not 1 <= k <= n:
        raise ValueError(f"layers must be between 1 and {n} (the model's decoder layers), got {k}")
    decoder, attr = _decoder_layers(model)
    dropped = list(getattr(decoder, attr))[k:]
    memo = {id(layer): layer for layer in dropped}
    twin = copy.deepcopy(model, memo)
    twin_decoder, _ = _decoder_layers(twin)
    setattr(twin_decoder, attr, torch.nn.ModuleList(list(getattr(twin_decoder, attr))[:k]))
    seen = set()
    for cfg in (twin.config, text_config(twin)):
        if id(cfg) in seen:
            continue
        seen.add(id(cfg))
        if getattr(cfg, "num_hidden_layers", None) != n:
            continue
        for key, values in _per_layer_lists(cfg, n).items():
            setattr(cfg, key, type(values)(values[:k]))
        cfg.num_hidden_layers = k
    return twin.eval()


def validate_options(spec: str | MethodSpec, seq_len: int | None, layers: int | None) -> MethodSpec:
    """Check what can be checked before loading a model; returns the parsed spec.

    Raises:
        ValueError: one line naming the fix.
    """
    spec = parse_spec(spec)
    if not isinstance(method_of(spec), METHODS["swa"]):
        raise ValueError(
            f"sinkwindow check verifies swa:W[:S] specs (the runtime the reference covers), got {spec}; "
            f"try --method swa:64:4"
        )
    if seq_len is not None and seq_len < spec.window + 2:
        raise ValueError(
            f"seq_len (--seq-len) must be at least W + 2 = {spec.window + 2} so that prefill and decoding "
            f"both run past the window, got {seq_len}; omit it for the default {default_seq_len(spec.window)}"
        )
    if layers is not None and layers < 1:
        raise ValueError(f"layers (--layers) must be at least 1, got {layers}")
    return spec


def _random_ids(model: PreTrainedModel, length: int, seed: int, device) -> torch.Tensor:
    """``[1, length]`` random ids that avoid special tokens (padding, BOS/EOS, image placeholders)."""
    vocab = text_config(model).vocab_size
    allowed = torch.ones(vocab, dtype=torch.bool)
    for cfg in (model.config, text_config(model)):
        for attr in _SPECIAL_ID_ATTRS:
            ids = getattr(cfg, attr, None)
            for i in ids if isinstance(ids, (list, tuple)) else [ids]:
                if isinstance(i, int) and 0 <= i < vocab:
                    allowed[i] = False
    pool = allowed.nonzero().squeeze(1)
    g = torch.Generator().manual_seed(seed)
    return pool[torch.randint(len(pool), (1, length), generator=g)].to(device)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def _scale(logits: torch.Tensor) -> float:
    return max(1.0, float(logits.double().abs().max()))


def _compare(name: str, label: str, got, want, rel: float, detail: str) -> CheckResult:
    if got.shape != want.shape:
        return CheckResult(
            name, label, None, None, "fail", f"shape {tuple(got.shape)} != {tuple(want.shape)}"
        )
    if not bool(torch.isfinite(got).all()):
        return CheckResult(name, label, None, None, "fail", "non-finite logits")
    diff, tol = _max_diff(got, want), rel * _scale(want)
    ok = diff <= tol
    why = detail if ok else f"{detail}: max |Δlogit| {diff:.3g} > {tol:.3g}"
    return CheckResult(name, label, diff, tol, "pass" if ok else "fail", why)


def _supports_sdpa(model: PreTrainedModel) -> bool:
    return bool(getattr(base_class(model), "_supports_sdpa", False))


@torch.no_grad()
def _forward(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    return model(ids, use_cache=False).logits


def _expected_bounds(model: PreTrainedModel, spec: MethodSpec, native_sliding: str, length: int) -> list[int]:
    """Per layer, the most entries the bounded cache may persist: (window - 1), from the spec and config
    (not from the cache, so a cache that is wrong about its own window is caught). A hybrid's full
    layers hold all ``length`` tokens; a layer with some full KV heads is bounded on its windowed ones."""
    cfg = text_config(model)
    native = native_sliding_layers(cfg) if native_sliding == "keep" else [False] * cfg.num_hidden_layers
    sw = getattr(cfg, "sliding_window", None)
    return [
        length if i in spec.full_layers else (sw if is_native and sw else spec.window) - 1
        for i, is_native in enumerate(native)
    ]


@torch.no_grad()
def _cache_paths(
    model: PreTrainedModel,
    ids: torch.Tensor,
    one_shot: torch.Tensor,
    spec: MethodSpec,
    native_sliding: str,
    rel: float,
    chunk_size: int,
    decode_steps: int,
) -> tuple[list[CheckResult], list[int], list[int]]:
    """Chunked prefill of all but the last ``decode_steps`` tokens, then one token a forward."""
    length = ids.shape[1]
    prompt = length - decode_steps
    bounds = _expected_bounds(model, spec, native_sliding, length)
    cache = make_cache(model)
    if not isinstance(cache, SinkWindowCache):
        fail = CheckResult(
            "cache_entries",
            "bounded cache",
            None,
            None,
            "fail",
            f"make_cache gave a {type(cache).__name__}, not a SinkWindowCache: the spec is not active",
        )
        return [fail], [], bounds
    most = [0] * len(cache.layers)

    def watch() -> None:
        for i, n in enumerate(cache.window_lengths()):
            most[i] = max(most[i], n)

    chunks = []

    def keep(start: int, logits: torch.Tensor) -> None:
        chunks.append(logits)
        watch()

    prefill(model, ids[:, :prompt], chunk_size=chunk_size, cache=cache, return_logits="none", on_chunk=keep)
    pre = torch.cat(chunks, dim=1)
    steps = []
    for t in range(prompt, length):
        steps.append(model(ids[:, t : t + 1], cache=cache, use_cache=True).logits)
        watch()
    dec = torch.cat(steps, dim=1)
    n_chunks = len(chunks)
    results = [
        _compare(
            "prefill_vs_one_shot",
            f"chunked prefill ({n_chunks} chunks of {chunk_size}) vs one-shot",
            pre,
            one_shot[:, :prompt],
            rel,
            f"{prompt} tokens in chunks of {chunk_size} through the bounded cache",
        ),
        _compare(
            "decode_vs_one_shot",
            f"token-by-token decode ({decode_steps} steps) vs one-shot",
            dec,
            one_shot[:, prompt:],
            rel,
            f"tokens {prompt}..{length - 1} one a forward on the bounded cache",
        ),
    ]
    results.append(_cache_entries_result(cache, spec, most, bounds, length))
    return results, most, bounds


def _cache_entries_result(
    cache: SinkWindowCache, spec: MethodSpec, most: list[int], bounds: list[int], length: int
) -> CheckResult:
    """The bound check after ``length`` tokens: no layer ever held more than its bound (``most``, the
    largest count seen per layer), every layer ends at it, and full KV heads hold every token."""
    final = cache.window_lengths()
    over = [i for i, (m, b) in enumerate(zip(most, bounds)) if m > b]
    short = [i for i, (f, b) in enumerate(zip(final, bounds)) if f != min(length, b)]
    # A layer with full KV heads must hold every token for them (from the spec, not the cache).
    held = cache.persisted_lengths()
    lost = sorted(i for i in {layer for layer, _ in spec.full_heads} if i < len(held) and held[i] != length)
    if len(most) != len(bounds):
        status, why = "fail", f"the cache has {len(most)} layers, the model {len(bounds)}"
    elif over:
        i = over[0]
        status, why = (
            "fail",
            f"{len(over)} layer(s) held more than W - 1 entries (layer {i}: {most[i]} > {bounds[i]})",
        )
    elif short:
        i = short[0]
        status, why = (
            "fail",
            f"layer {i} holds {final[i]} entries after {length} tokens, expected {min(length, bounds[i])}",
        )
    elif lost:
        i = lost[0]
        status, why = (
            "fail",
            f"layer {i}'s full KV heads hold {held[i]} entries after {length} tokens, expected all {length}",
        )
    else:
        status, why = "pass", f"every layer at its bound after {length} tokens"
    return CheckResult("cache_entries", "cache entries per layer (max)", max(most), max(bounds), status, why)


def check_model(
    model: PreTrainedModel,
    spec: str | MethodSpec = "swa:64:4",
    *,
    seq_len: int | None = None,
    layers: int | None = None,
    native_sliding: str = "override",
    seed: int = 0,
    chunk_size: int | None = None,
    name: str | None = None,
) -> CheckReport:
    """Run every runtime path of ``spec`` on ``model`` and compare each with its slow twin.

    The model is left as it was found (its spec and attention implementation are restored).

    Args:
        model: a transformers causal LM (unpatched, or patched: it is restored afterwards).
        spec: an ``swa:W[:S][:cache]`` spec.
        seq_len: tokens to run, at least W + 2 (default ``default_seq_len(W)``: 2W + 7 for W <= 64).
        layers: decoder layers of the copy compared with the fp64 reference (default
            ``default_layers``: 4, or more so every layer type is included; all if the model is smaller).
        native_sliding: as in ``apply``.
        seed: for the random token ids.
        chunk_size: prefill chunk (default W // 2 + 1, so chunks straddle the window's edge).
        name: what to call the model in the report.

    Returns:
        A ``CheckReport``; ``report.ok`` is False if any check failed and ``report.failed`` names them.

    Raises:
        ValueError: a spec other than swa, out-of-range ``seq_len``/``layers``, an unsupported model.
    """
    t0 = time.perf_counter()
    spec = validate_options(spec, seq_len, layers)
    n_layers = text_config(model).num_hidden_layers
    length, k, chunk = _check_sizes(model, spec, seq_len, layers, chunk_size)
    decode_steps = min(MAX_DECODE_STEPS, max(1, (length - spec.window) // 2))
    dtype = next(model.parameters()).dtype
    rel = TOLERANCES.get(dtype, 1e-2)
    ids = _random_ids(model, length, seed, input_device(model))
    report = CheckReport(
        model=name or getattr(model, "name_or_path", "") or type(model).__name__,
        spec=str(spec),
        seq_len=length,
        layers=n_layers,
        reference_layers=k,
        dtype=str(dtype).removeprefix("torch."),
        window=spec.window,
    )
    checks = report.checks
    sdpa_ok = _supports_sdpa(model)
    main_impl = "sdpa" if sdpa_ok else "eager"
    # One block around the whole check: leaving it gives the model back whatever it ran before
    # (spec, native-sliding policy and attention implementation), whatever the check switched to.
    with apply(model, "full"):
        logger.info("check %s on %d tokens: full attention", spec, length)
        full = _forward(model, ids)
        checks.extend(_reference_checks(model, ids, spec, k, native_sliding, rel, sdpa_ok))
        apply(model, "full")

        # The whole model: eager vs SDPA, the cache paths vs one shot, SWA vs full.
        logger.info("check: patched model (%s), one shot", main_impl)
        apply(model, spec, native_sliding=native_sliding, attn_implementation=main_impl)
        one_shot = _forward(model, ids)
        if sdpa_ok:
            apply(model, spec, native_sliding=native_sliding, attn_implementation="eager")
            eager = _forward(model, ids)
            label = f"eager vs sdpa (all {n_layers} layers)"
            why = "the two mask builders over the whole model"
            checks.append(_compare("eager_vs_sdpa", label, eager, one_shot, rel, why))
            del eager
            apply(model, spec, native_sliding=native_sliding, attn_implementation=main_impl)
        logger.info("check: chunked prefill + %d decode steps", decode_steps)
        cache_checks, report.cache_entries, report.cache_bounds = _cache_paths(
            model, ids, one_shot, spec, native_sliding, rel, chunk, decode_steps
        )
        checks.extend(cache_checks)
        checks.append(_differs_from_full(one_shot, full, spec.window, rel))
    report.seconds = time.perf_counter() - t0
    for c in checks:
        # Info, not warning: failures are the report's content, and the caller decides how to show them.
        logger.info("check %s: %s (%s)", c.name, c.status, c.detail)
    return report


def _check_sizes(model, spec: MethodSpec, seq_len, layers, chunk_size) -> tuple[int, int, int]:
    """``(tokens, reference layers, prefill chunk)`` of a check, each refused with the fix when out of range."""
    cfg = text_config(model)
    n_layers = cfg.num_hidden_layers
    length = seq_len if seq_len is not None else default_seq_len(spec.window)
    limit = getattr(cfg, "max_position_embeddings", None)
    if limit is not None and length > limit:
        raise ValueError(
            f"seq_len (--seq-len) {length} is beyond the model's limit of {limit} positions; use at most "
            f"{limit}, and a window below {limit - 1}"
        )
    if layers is not None and layers > n_layers:
        raise ValueError(
            f"layers (--layers) must be between 1 and {n_layers} (the model's decoder layers), got {layers}"
        )
    k = layers if layers is not None else default_layers(model)
    if layers is None and spec.is_hybrid:
        # The copy reaches the first full layer and the first layer with full heads, so both kinds of unit
        # are held to the reference.
        firsts = [spec.full_layers[0]] if spec.full_layers else []
        firsts += [spec.full_heads[0][0]] if spec.full_heads else []
        k = min(n_layers, max(k, *(i + 1 for i in firsts)))
    chunk = chunk_size if chunk_size is not None else spec.window // 2 + 1
    if chunk < 1:
        raise ValueError(f"chunk_size must be positive, got {chunk}")
    return length, k, chunk


def _reference_checks(
    model, ids, spec: MethodSpec, k: int, native_sliding: str, rel: float, sdpa_ok: bool
) -> list:
    """SDPA and eager against the fp64 reference, on a copy cut to ``k`` layers when the model has more."""
    n_layers = text_config(model).num_hidden_layers
    twin = truncate_layers(model, k) if k < n_layers else model
    where = f"first {k} of {n_layers} layers" if twin is not model else f"all {n_layers} layers"
    logger.info("check: fp64 reference on %s", where)
    # A hybrid's units past the copy's last layer are not there to check.
    twin_spec = (
        spec.with_full([i for i in spec.full_layers if i < k], [u for u in spec.full_heads if u[0] < k])
        if twin is not model
        else spec
    )
    ref = reference_logits(twin, ids, twin_spec, native_sliding=native_sliding)
    checks = []
    for impl in ("sdpa", "eager"):
        row, label = f"{impl}_vs_reference", f"{impl} vs fp64 reference ({where})"
        if impl == "sdpa" and not sdpa_ok:
            checks.append(
                CheckResult(row, label, None, None, "skip", "transformers has no SDPA for this family")
            )
            continue
        apply(twin, twin_spec, native_sliding=native_sliding, attn_implementation=impl)
        why = f"patched {impl} against dense float64 attention masked from the formula"
        checks.append(_compare(row, label, _forward(twin, ids), ref, rel, why))
    return checks


def _differs_from_full(one_shot, full, window: int, rel: float) -> CheckResult:
    """Past the window the patched logits must leave full attention's, or no mask was applied."""
    diff = _max_diff(one_shot[:, window:], full[:, window:])
    margin = rel * _scale(one_shot)
    ok = diff > margin
    if ok:
        why = f"positions {window}..{one_shot.shape[1] - 1} differ from full attention"
    else:
        why = f"past W the logits are within {diff:.3g} of full attention (need > {margin:.3g}): no mask applied"
    label = "SWA ≠ full (positions past W)"
    return CheckResult("swa_differs_from_full", label, diff, margin, "pass" if ok else "fail", why)
