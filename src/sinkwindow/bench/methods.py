"""How each method is set up, prefilled, and brought to "context n" for a decode measurement.

A ``MethodRunner`` owns one (model, spec) pair for the length of a measurement:

- ``activate()`` puts the model into the method (``use_method``), ``deactivate()`` back to full attention;
- ``prefill(ids, chunk_size)`` is the real thing, as a user would run it (timed by the prefill
  benchmark): chunked through the bounded cache for SWA, one forward for full attention (what an
  unpatched model does);
- ``fill(ids, chunk_size)`` builds the decode state at context n = ``ids.shape[1]`` cheaply, with
  exactly the shapes and layout a real prefill leaves, so that the decode step that follows does
  the same work it would after a real prefill (see each runner for how).

Methods are looked up by spec kind in ``RUNNERS``, a plain dict beside ``sinkwindow.methods.METHODS``
(the bench sits above that layer, so a method class cannot name its runner): a new method is one
subclass (``activate``/``deactivate``/``new_cache``/``fill``) and one entry, and no change anywhere else.
Peers, other implementations timed beside ours (``bench.peers``), are looked up the same way by
peer kind in ``PEERS``; their rows carry the peer's name as ``method``.
"""

from __future__ import annotations

import importlib
import logging

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache, StaticCache

from ..methods import method_of
from ..runtime.cache import FullAttentionLayer, SinkWindowLayer
from ..runtime.make_cache import make_cache
from ..runtime.method import use_method
from ..runtime.prefill import input_device, prefill
from ..runtime.spec import MethodSpec, parse_spec
from .peers import is_peer, parse_peer, peer_kind, peer_window

__all__ = [
    "MethodRunner",
    "FullRunner",
    "FullStaticRunner",
    "MistralSlidingRunner",
    "WindowRunner",
    "LinearRunner",
    "MethodUnavailable",
    "RUNNERS",
    "PEERS",
    "runner_for",
]

logger = logging.getLogger(__name__)


class MethodUnavailable(RuntimeError):
    """This install cannot run the method; the benchmark records a skipped row instead of crashing."""


class MethodRunner:
    """One method on one model. Subclasses override ``fill`` (and ``prefill`` where it differs).

    Args:
        model: a transformers causal LM.
        spec: the method.
    """

    #: whether decode cost and state size stay flat with context (no time or memory cap needed).
    bounded = True
    #: a peer's kind (``bench.peers``); ``None`` for sinkwindow's own methods.
    peer: str | None = None

    def __init__(self, model: PreTrainedModel, spec: MethodSpec):
        self.model = model
        self.spec = spec

    @property
    def name(self) -> str:
        """What the rows call this method: its spec, or a peer's name."""
        return str(self.spec)

    def row_fields(self) -> dict:
        """Fields every row of this runner records beside ``method`` (a peer says which, and how run)."""
        return {}

    def step(self, token: torch.Tensor, cache: Cache) -> torch.Tensor:
        """One decode step of ``token`` ``[batch, 1]``: the next token's logits ``[batch, vocab]``."""
        return self.model(token, cache=cache, use_cache=True).logits[:, -1]

    def activate(self) -> None:
        # use_method is the one way to switch (a trained baseline converts; an untrained one too, as
        # a benchmark only times it); full attention reverts whatever ran before.
        use_method(self.model, self.spec, allow_untrained=True)

    def deactivate(self) -> None:
        use_method(self.model, "full")

    def __enter__(self) -> MethodRunner:
        self.activate()
        return self

    def __exit__(self, *exc) -> None:
        self.deactivate()

    def new_cache(self) -> Cache:
        return make_cache(self.model)

    def prefill_chunk(self, n: int, chunk_size: int) -> int:
        """Tokens per forward when prefilling n tokens."""
        return chunk_size

    def prefill(self, ids: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, Cache]:
        """Real prefill of ``ids`` ``[batch, n]``.

        Returns:
            last-position logits ``[batch, vocab]`` and the filled cache.
        """
        chunk = self.prefill_chunk(ids.shape[1], chunk_size)
        logits, cache = prefill(
            self.model, ids, chunk_size=chunk, cache=self.new_cache(), return_logits="last"
        )
        return logits, cache

    def fill(self, ids: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, Cache]:
        """Decode state at context n = ``ids.shape[1]``; the default is a real prefill."""
        return self.prefill(ids, chunk_size)

    def analytic_bytes(self, context: int, batch: int = 1) -> int:
        return method_of(self.spec).state_bytes(
            self.model.config, context, dtype=self.model.dtype, batch=batch
        )


class FullRunner(MethodRunner):
    """Dense attention: the unpatched model with transformers' ``DynamicCache``.

    ``fill`` prefills a short real prompt, then tiles its keys and values along the sequence to n
    entries per layer. The decode step then reads n keys and extends the cache by concatenation
    (what ``DynamicCache`` does every step), exactly as after a real n-token prefill; only the
    key values repeat, which no kernel's running time depends on. This avoids an O(n^2) prefill
    per measurement at 64K+ tokens.
    """

    bounded = False
    seed_tokens = 64

    def prefill_chunk(self, n: int, chunk_size: int) -> int:
        # An unpatched model prefills in one forward (SDPA with is_causal, no n x n mask).
        return max(n, 1)

    def fill(self, ids: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, Cache]:
        n = ids.shape[1]
        if n <= self.seed_tokens:
            return self.prefill(ids, chunk_size)
        p = self.seed_tokens
        logits, cache = self.prefill(ids[:, :p], chunk_size)
        reps, rem = divmod(n, p)
        for layer in cache.layers:
            for name in ("keys", "values"):
                seed = getattr(layer, name)  # [batch, kv_heads, p, head_dim]
                tiled = seed.repeat(1, 1, reps, 1)
                if rem:
                    tiled = torch.cat([tiled, seed[..., :rem, :]], dim=-2)
                setattr(layer, name, tiled)
                del seed
        if cache.get_seq_length() != n:
            raise RuntimeError(
                f"full-attention fill: cache holds {cache.get_seq_length()} tokens, expected {n}"
            )
        return logits, cache


def _tile_in_place(store: torch.Tensor, p: int, n: int) -> None:
    """Copy ``store[..., :p, :]`` over ``store[..., p:n, :]`` in place (a static buffer keeps its address)."""
    for start in range(p, n, p):
        end = min(start + p, n)
        store[:, :, start:end].copy_(store[:, :, : end - start])


class FullStaticRunner(FullRunner):
    """Peer ``peer:static-full``: dense attention through transformers' ``StaticCache``.

    The cache is preallocated for the context plus ``headroom`` decode steps and written in place, so
    a decode step reads a fixed ``n + headroom`` keys under a mask and never concatenates (what
    ``DynamicCache`` does every step, whose copies would inflate SWA's advantage). The decode step is
    ``torch.compile``d (``mode="reduce-overhead"``, CUDA graphs) where ``compile``, by default on CUDA
    only: on CPU each context's compile takes tens of seconds (30 s for a tiny Llama on a loaded
    2-core box) for little gain. Compilation happens in the first decode step of each context (a
    warm-up step, untimed: keep ``warmup`` >= 1); each context gets a fresh graph (its cache's shapes).

    ``fill`` prefills a short real prompt into the static buffers, tiles its keys and values in place
    along the sequence to n entries (as ``FullRunner`` does) and sets the write position to n.

    Args:
        model: a transformers causal LM.
        name: ``peer:static-full`` (compile on CUDA only), ``...:compiled`` or ``...:eager``.
        headroom: decode steps the cache must have room for after the context.
    """

    peer = "static-full"

    def __init__(self, model: PreTrainedModel, name: str = "peer:static-full", *, headroom: int = 64):
        super().__init__(model, parse_spec("full"))
        choice = parse_peer(name).split(":")[2:]
        self.compile = choice == ["compiled"] if choice else input_device(model).type == "cuda"
        self.headroom = headroom
        self._compiled = None

    @property
    def name(self) -> str:
        return f"peer:static-full:{'compiled' if self.compile else 'eager'}"

    def row_fields(self) -> dict:
        return {"peer": self.peer, "compile": self.compile, "cache_headroom": self.headroom}

    def prefill_chunk(self, n: int, chunk_size: int) -> int:
        # A static cache attends over its whole buffer under an explicit mask (no is_causal): chunks
        # keep that mask at chunk x (n + headroom) instead of n x n.
        return chunk_size

    def static_cache(self, n: int) -> StaticCache:
        """An empty ``StaticCache`` for n tokens plus the headroom (and, compiling, a fresh graph)."""
        if self.compile:
            torch._dynamo.reset()  # a new cache has new shapes: compile for it, not past the recompile limit
            mode = "reduce-overhead" if input_device(self.model).type == "cuda" else None
            self._compiled = torch.compile(self.model.forward, mode=mode, dynamic=False)
        return StaticCache(config=self.model.config, max_cache_len=n + self.headroom)

    def prefill(self, ids: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, Cache]:
        n = ids.shape[1]
        return prefill(
            self.model, ids, chunk_size=chunk_size, cache=self.static_cache(n), return_logits="last"
        )

    def fill(self, ids: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, Cache]:
        n = ids.shape[1]
        if n <= self.seed_tokens:
            return self.prefill(ids, chunk_size)
        p = self.seed_tokens
        cache = self.static_cache(n)
        logits, cache = prefill(self.model, ids[:, :p], chunk_size=p, cache=cache, return_logits="last")
        for layer in cache.layers:
            _tile_in_place(layer.keys, p, n)  # [batch, kv_heads, n + headroom, head_dim]
            _tile_in_place(layer.values, p, n)
            layer.cumulative_length.fill_(n)  # in place: compiled graphs hold its address
        if int(cache.get_seq_length()) != n:
            raise RuntimeError(
                f"static-cache fill: cache at {int(cache.get_seq_length())} tokens, expected {n}"
            )
        return logits, cache

    def step(self, token: torch.Tensor, cache: Cache) -> torch.Tensor:
        if self._compiled is None:
            return super().step(token, cache)
        return self._compiled(input_ids=token, cache=cache, use_cache=True).logits[:, -1]

    def analytic_bytes(self, context: int, batch: int = 1) -> int:
        return method_of(self.spec).state_bytes(
            self.model.config, context + self.headroom, dtype=self.model.dtype, batch=batch
        )


class MistralSlidingRunner(MethodRunner):
    """Peer ``peer:mistral-sw:W``: transformers' own sliding window on the model under test.

    The model's weights go into a ``MistralForCausalLM`` whose config is the Llama config with
    ``sliding_window = W`` (Mistral is Llama plus the window, so the weights load unchanged and are
    shared, not copied). It runs unpatched, with its stock cache (``DynamicCache`` of
    ``DynamicSlidingWindowLayer``: the last W - 1 keys, concatenated with the query's each step)
    and transformers' sliding-window masks; it computes what ``swa:W:0`` does, logits equal.

    ``fill`` prefills the first W tokens for real (each layer then holds W - 1 keys), advances every
    layer's ``cumulative_length`` to n - W, then prefills the last W tokens, at positions n-W..n-1: the
    layers hold the last W - 1 keys at cumulative length n, the state a real n-token prefill leaves
    (and the last query sees exactly its real keys, as in ``WindowRunner``).

    Raises:
        MethodUnavailable: the model is not a Llama-family model.
    """

    peer = "mistral-sw"

    def __init__(self, model: PreTrainedModel, name: str, *, headroom: int = 64):
        from transformers import MistralConfig, MistralForCausalLM

        window = peer_window(name)
        config = model.config
        if getattr(config, "model_type", None) != "llama" or getattr(config, "attention_bias", False):
            raise MethodUnavailable(
                f"{name}: needs a Llama-family model without attention biases (its weights load into "
                f"MistralForCausalLM unchanged); this one is {getattr(config, 'model_type', type(model).__name__)}"
            )
        settings = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "architectures")}
        peer_config = MistralConfig(**settings, sliding_window=window)
        peer_model = MistralForCausalLM._from_config(
            peer_config, attn_implementation="sdpa", dtype=model.dtype
        )
        peer_model.to(input_device(model))
        try:
            # assign: the peer's parameters are the model's own tensors (no second copy of the weights).
            peer_model.load_state_dict(model.state_dict(), strict=True, assign=True)
        except RuntimeError as err:
            first = str(err).strip().splitlines()[0]
            raise MethodUnavailable(
                f"{name}: the weights do not load into MistralForCausalLM ({first})"
            ) from err
        peer_model.tie_weights()
        super().__init__(peer_model.eval(), parse_spec(f"swa:{window}:0"))
        self.window = window

    @property
    def name(self) -> str:
        return f"peer:mistral-sw:{self.window}"

    def row_fields(self) -> dict:
        return {"peer": self.peer, "compile": False, "window": self.window}

    def activate(self) -> None:
        pass  # the peer model is never patched

    def deactivate(self) -> None:
        pass

    def new_cache(self) -> Cache:
        return DynamicCache(config=self.model.config)

    def fill(self, ids: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, Cache]:
        n, w = ids.shape[1], self.window
        if n <= 2 * w + chunk_size:
            return self.prefill(ids, chunk_size)
        cache = self.new_cache()
        prefill(self.model, ids[:, :w], chunk_size=chunk_size, cache=cache, return_logits="none")
        for layer in cache.layers:
            layer.cumulative_length = n - w  # its W - 1 keys now stand for positions n-2W+1..n-W
        logits, cache = prefill(
            self.model, ids[:, n - w :], chunk_size=chunk_size, cache=cache, return_logits="last"
        )
        for layer in cache.layers:
            if layer.cumulative_length != n or layer.keys.shape[-2] != w - 1:
                raise RuntimeError(
                    f"{self.name} fill: layer holds {layer.keys.shape[-2]} keys at {layer.cumulative_length}, "
                    f"expected {w - 1} at {n}"
                )
        return logits, cache


class WindowRunner(MethodRunner):
    """SWA(w, s) and evict(w, s) through ``sinkwindow.apply`` and the bounded ``SinkWindowCache``.

    ``fill`` builds the state a real n-token prefill leaves without running n tokens: it prefills
    the s sink tokens at positions 0..s-1, advances every layer's ``cumulative_length`` to
    ``n - (w - s)``, then prefills the last w - s tokens, which therefore get positions
    n-w+s..n-1 (RoPE) and the same mask offsets as in a real run. The cache ends holding the s
    sinks + the last w - s - 1 keys with ``cumulative_length == n``: the next decode step runs at
    position n over w keys, as after a real prefill. The last prompt query sees exactly its real
    keys too, so in the first layer (whose keys depend only on token and position) state and
    logits equal a real prefill's; deeper layers' keys differ because the skipped tokens never
    reached them, but their shapes, and so the work of every decode step, do not.
    """

    def fill(self, ids: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, Cache]:
        n = ids.shape[1]
        if n <= self.spec.window + chunk_size:
            return self.prefill(ids, chunk_size)
        logits, cache = self._skip_to(ids, chunk_size)
        self._check(cache, n)
        return logits, cache

    def _skip_to(self, ids: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, Cache]:
        """Sinks at 0..s-1, every layer advanced to n - (w - s), then the last w - s tokens for real."""
        n = ids.shape[1]
        sinks = self.spec.sinks
        tail = self.spec.window - sinks  # the last query's own window: itself + w - s - 1 keys
        cache = self.new_cache()
        if sinks:
            prefill(self.model, ids[:, :sinks], chunk_size=chunk_size, cache=cache, return_logits="none")
        for layer in cache.layers:
            if not isinstance(layer, SinkWindowLayer):
                raise MethodUnavailable(
                    f"{self.spec}: fast fill needs SinkWindowLayer caches, got {type(layer).__name__}"
                )
            for part in _stores(layer):
                part.cumulative_length = n - tail
        return prefill(
            self.model, ids[:, n - tail :], chunk_size=chunk_size, cache=cache, return_logits="last"
        )

    def _check(self, cache: Cache, n: int) -> None:
        """Every windowed layer at ``n`` tokens holding ``min(n, w - 1)`` keys (full stores are not windowed)."""
        for layer in cache.layers:
            if isinstance(layer, FullAttentionLayer):
                continue
            held = layer.keys.shape[-2]
            if layer.cumulative_length != n or held != min(n, layer.max_persisted):
                raise RuntimeError(
                    f"{self.spec} fill: layer holds {held} keys at cumulative length {layer.cumulative_length}, "
                    f"expected {min(n, layer.max_persisted)} at {n}"
                )


def _stores(layer) -> list:
    """A layer's key stores: itself, and a hybrid layer's store of full heads."""
    full = getattr(layer, "full", None)
    return [layer] if full is None else [layer, full]


class FullUnitsRunner(WindowRunner):
    """A hybrid spec (``swa:W:S+full:...``): windowed layers as ``WindowRunner``, full stores as ``FullRunner``.

    ``fill`` skips ahead like ``WindowRunner``, then tiles every full-attention store (a full layer, or a
    layer's full KV heads) along the sequence to n entries, as ``FullRunner`` does, so each decode step
    reads n keys there and at most w elsewhere, as after a real n-token prefill.
    """

    bounded = False

    def fill(self, ids: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, Cache]:
        n = ids.shape[1]
        if n <= self.spec.window + chunk_size:
            return self.prefill(ids, chunk_size)
        logits, cache = self._skip_to(ids, chunk_size)
        for layer in cache.layers:
            full = layer if isinstance(layer, FullAttentionLayer) else getattr(layer, "full", None)
            if full is None:
                continue
            for name in ("keys", "values"):
                seed = getattr(full, name)  # [batch, full kv heads, w, head_dim]
                reps, rem = divmod(n, seed.shape[-2])
                setattr(full, name, torch.cat([seed.repeat(1, 1, reps, 1), seed[..., :rem, :]], dim=-2))
            if full.n_persisted != n or full.cumulative_length != n:
                raise RuntimeError(
                    f"{self.spec} fill: a full store holds {full.n_persisted} keys, expected {n}"
                )
        self._check(cache, n)
        return logits, cache


class LinearRunner(MethodRunner):
    """Linear attention (``linear``) and the LoLCATs hybrid (``lolcats:W``), via ``sinkwindow.linear``.

    ``activate`` puts the model into the baseline with ``use_method``: the shipped trained adapter
    where there is one, else a conversion at the identity init (which times exactly as trained
    feature maps do); ``deactivate`` reverts it.
    The cache is the retrofit's ``LinearAttnCache``: per layer S (H x F x D) and z (H x F) in
    float32, plus a FIFO of the last w keys/values for the hybrid.

    ``fill`` advances every layer's token counter to n - p and then prefills p = 2w (at least 64)
    real tokens: the state then has S, z built from tokens that left the window and a full FIFO,
    exactly the shapes a real n-token prefill leaves, and decoding continues at position n.
    """

    def __init__(self, model: PreTrainedModel, spec: MethodSpec):
        super().__init__(model, spec)
        try:
            self._convert = importlib.import_module("sinkwindow.linear.convert")
        except ImportError as err:
            raise MethodUnavailable(
                f"{spec}: sinkwindow.linear has no model conversion in this install ({err})"
            ) from err

    def new_cache(self) -> Cache:
        return self._convert.get_retrofit(self.model).make_cache()

    def fill(self, ids: torch.Tensor, chunk_size: int) -> tuple[torch.Tensor, Cache]:
        n = ids.shape[1]
        p = max(2 * (self.spec.window or 0), 64)
        if n <= p + chunk_size:
            return self.prefill(ids, chunk_size)
        cache = self.new_cache()
        for layer in cache.layers:
            layer.cumulative_length = n - p
        logits, cache = prefill(
            self.model, ids[:, n - p :], chunk_size=chunk_size, cache=cache, return_logits="last"
        )
        if cache.get_seq_length() != n:
            raise RuntimeError(f"{self.spec} fill: cache at {cache.get_seq_length()} tokens, expected {n}")
        return logits, cache


RUNNERS: dict[str, type[MethodRunner]] = {
    "full": FullRunner,
    "swa": WindowRunner,
    "evict": WindowRunner,
    "linear": LinearRunner,
    "lolcats": LinearRunner,
    "liger": LinearRunner,
    "hybrid": FullUnitsRunner,  # swa:W:S+full:... (looked up by is_hybrid, its kind being swa)
}


PEERS: dict[str, type[MethodRunner]] = {
    "static-full": FullStaticRunner,
    "mistral-sw": MistralSlidingRunner,
}


def runner_for(model: PreTrainedModel, spec: str | MethodSpec, *, headroom: int = 64) -> MethodRunner:
    """The runner for ``spec`` (a method spec, or a peer's name: ``bench.peers``) on ``model``.

    Args:
        headroom: decode steps a peer's preallocated cache must have room for after the context.

    Raises:
        MethodUnavailable: the method cannot run in this install (or on this model).
    """
    if isinstance(spec, str) and is_peer(spec):
        return PEERS[peer_kind(spec)](model, spec, headroom=headroom)
    spec = parse_spec(spec)
    if spec.positions != "absolute":
        raise MethodUnavailable(f"{spec}: only absolute positions are implemented")
    return RUNNERS["hybrid" if spec.is_hybrid else spec.kind](model, spec)
