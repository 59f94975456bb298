"""The method registry: one class per spec kind, each answering the whole interface, agreeing with
the spec predicates the runtime reads, and doing what its spec says on a tiny model."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_config
from sinkwindow.methods import HYBRID, INTERFACE, METHODS, Method, method_of
from sinkwindow.runtime.cache import cache_nbytes
from sinkwindow.runtime.spec import SPEC_KINDS, parse_spec

# One spec a kind (and a hybrid, and an adapter-named SWA): every class the registry can hand out.
SPECS = [
    "full",
    "swa:16:4",
    "swa:16:4:cache",
    "swa:16:4@lora",
    "evict:16:2",
    "linear",
    "lolcats:8",
    "liger:8",
    "swa:16:4+full:1,2.1",
]


def test_the_registry_covers_every_kind_the_parser_knows():
    assert set(METHODS) == set(SPEC_KINDS)
    for kind, cls in METHODS.items():
        assert issubclass(cls, Method) and cls.kind == kind


@pytest.mark.parametrize("text", SPECS)
def test_every_method_answers_every_interface_member(text):
    method = method_of(text)
    for name in INTERFACE:
        value = getattr(method, name)
        if name in ("family", "label"):
            assert isinstance(value, str) and value, name
        if name in ("trained", "windowed", "dense_prompt"):
            assert isinstance(value, bool), name
    assert method.adapter in (None, "lora", "retrofit")
    assert method.kind == parse_spec(text).kind


@pytest.mark.parametrize("text", SPECS)
def test_methods_agree_with_the_spec_predicates_the_runtime_reads(text):
    spec, method = parse_spec(text), method_of(text)
    assert method.windowed == spec.is_windowed
    assert method.dense_prompt == spec.dense_prompt
    assert method.trained == spec.is_trained
    assert (method.adapter == "retrofit") == spec.is_linear
    # Only a kind that takes a LoRA adapter may carry @NAME without being a retrofit.
    if spec.adapter and not spec.is_linear:
        assert method.adapter == "lora"


def test_a_hybrid_gets_the_full_units_wrapper_over_its_swa():
    method = method_of("swa:16:4+full:1,2.1")
    assert isinstance(method, HYBRID) and str(method.inner.spec) == "swa:16:4"
    assert method.label == "SWA(16, 4)+full:1,2.1" and method.adapter is None
    with pytest.raises(ValueError, match="full-attention units"):
        HYBRID(parse_spec("swa:16:4"))


def test_labels_name_the_parameters():
    assert method_of("swa:256:4").label == "SWA(256, 4)"
    assert method_of("evict:64:2").label == "evict(64, 2)"
    assert method_of("lolcats:64@len4k").label == "LoLCATs(+SWA) w=64@len4k"
    assert method_of("liger:64").family == "Liger-GLA(+SWA)"


def test_a_class_refuses_a_spec_of_another_kind():
    with pytest.raises(ValueError, match="runs 'swa' specs"):
        METHODS["swa"](parse_spec("evict:16:2"))


def test_a_kv_cache_method_refuses_a_feature_dim():
    with pytest.raises(ValueError, match="drop feature_dim"):
        method_of("swa:16:4").state_bytes(tiny_config("llama"), 10, feature_dim=8)


def test_the_runtime_byte_count_refuses_a_retrofit_and_names_the_method_class():
    from sinkwindow.runtime.kv_bytes import analytic_state_bytes

    with pytest.raises(ValueError, match="method_of"):
        analytic_state_bytes(parse_spec("lolcats:8"), tiny_config("llama"), 10)


def test_retrofit_state_is_flat_past_the_window_and_grows_with_features():
    config = tiny_config("llama")
    for text in ("linear", "lolcats:8", "liger:8"):
        m = method_of(text)
        assert m.state_bytes(config, 64) == m.state_bytes(config, 4096), text
    lin = method_of("linear")
    assert lin.state_bytes(config, 10, feature_dim=16) > lin.state_bytes(config, 10, feature_dim=8)
    # lolcats holds W keys, liger W - 1 (the query brings the W-th), one more token of K and V each.
    small = method_of("lolcats:8").state_bytes(config, 100) - method_of("lolcats:8").state_bytes(config, 7)
    assert small == method_of("lolcats:8").state_bytes(config, 8) - method_of("lolcats:8").state_bytes(
        config, 7
    )


@pytest.fixture(scope="module")
def tiny():
    import transformers as tf

    torch.manual_seed(0)
    return tf.LlamaForCausalLM(tiny_config("llama")).eval()


@pytest.mark.parametrize("text", ["full", "swa:16:4", "evict:16:2", "swa:16:4+full:1"])
def test_patch_make_cache_prefill_and_state_bytes_agree_on_a_tiny_model(tiny, text):
    method = method_of(text)
    method.patch(tiny)
    try:
        ids = torch.randint(1, 100, (1, 40), generator=torch.Generator().manual_seed(1))
        cache = method.make_cache(tiny)
        with torch.no_grad():
            method.prefill(tiny, ids, chunk_size=8, cache=cache)
        assert cache_nbytes(cache) == method.state_bytes(tiny.config, 40)
        out = method.decode(tiny, ids[:, :20], 3, chunk_size=8)
        assert out.shape == (1, 23)
    finally:
        method_of("full").patch(tiny)


def test_evict_prefills_the_prompt_densely_swa_does_not(tiny):
    """The dense prompt is evict's and only evict's: its last-token logits equal full attention's."""
    ids = torch.randint(1, 100, (1, 40), generator=torch.Generator().manual_seed(2))
    logits = {}
    for text in ("full", "evict:16:2", "swa:16:2"):
        method = method_of(text)
        method.patch(tiny)
        with torch.no_grad():
            logits[text] = method.prefill(tiny, ids, chunk_size=8).logits
    method_of("full").patch(tiny)
    torch.testing.assert_close(logits["evict:16:2"], logits["full"])
    assert not torch.allclose(logits["swa:16:2"], logits["full"], atol=1e-4)


def test_methods_rank_themselves_beside_swa_in_the_papers_order():
    anchor = parse_spec("swa:64:4")
    order = ["lolcats:64", "liger:64", "swa:64:4@lora", "swa:64:0", "evict:64:4", "linear"]
    ranks = [method_of(m).rank_against(anchor) for m in order]
    assert None not in ranks and ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    for other in ("full", "lolcats:32", "swa:32:0", "evict:64:2", "swa:64:4"):
        assert method_of(other).rank_against(anchor) is None, other
    assert method_of("swa:64:4").anchors_comparisons and not method_of("swa:64:0").anchors_comparisons
    assert [method_of(m).exact_view for m in ("full", "linear", "liger:64", "evict:64:2")] == [
        None,
        None,
        (64, 0),
        (64, 2),
    ]


@pytest.mark.parametrize("text", [s for s in SPECS if "@" not in s])
def test_trainable_is_what_the_parser_lets_carry_an_adapter(text):
    try:
        parse_spec(f"{text}@x")
        named = True
    except ValueError:
        named = False
    assert method_of(text).trainable == named
    assert method_of(text).train_stages or not named  # a trainable method has a recipe


@pytest.mark.parametrize("text", [s for s in SPECS if "@" not in s and "+" not in s])
def test_takes_full_units_is_what_the_parser_lets_carry_units(text):
    try:
        parse_spec(f"{text}+full:0")
        named = True
    except ValueError:
        named = False
    assert method_of(text).takes_full_units == named


def test_a_class_registered_in_a_test_is_what_every_caller_gets(tiny, monkeypatch):
    """The registry is the one lookup: a subclass put in METHODS is handed out by method_of and runs
    through patch, make_cache and prefill with no other file touched. (A new *kind* also needs the
    parser's grammar, runtime/spec.py, which sits below this layer.)"""

    class Shouting(METHODS["swa"]):
        family = "SHOUTING SWA"

        @property
        def label(self) -> str:
            return f"{self.family}({self.spec.window}, {self.spec.sinks})"

    monkeypatch.setitem(METHODS, "swa", Shouting)
    method = method_of("swa:16:4")
    assert isinstance(method, Shouting) and method.label == "SHOUTING SWA(16, 4)"
    method.patch(tiny)
    try:
        cache = method.make_cache(tiny)
        ids = torch.randint(1, 100, (1, 30), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            method.prefill(tiny, ids, chunk_size=8, cache=cache)
        assert cache_nbytes(cache) == method.state_bytes(tiny.config, 30)
    finally:
        method_of("full").patch(tiny)
