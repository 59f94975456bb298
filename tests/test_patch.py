"""apply(): identity cases, the fp64 reference, the silent no-mask failure, restoring, bad input, and which
models it accepts (by capability) or refuses (with the reason)."""

import json
import re

import pytest
import torch

import sinkwindow
from conftest import (
    CORE_FAMILIES,
    EAGER_ONLY,
    FAMILIES,
    VOCAB,
    family_impls,
    has_native_sliding,
    logits_in_fresh_process,
    tiny_model,
)
from sinkwindow.runtime.capability import native_sliding_layers, text_config
from sinkwindow.runtime.plan import config_plan
from sinkwindow.runtime.reference import reference_logits, reference_mask

# The core families run every case; the others one case of each contract (suite time, see conftest).
REFERENCE_CASES = [(29, 8, 2), (45, 16, 4), (33, 8, 0)]
REFERENCE_MATRIX = [(f, a, *case) for f, a in family_impls(CORE_FAMILIES) for case in REFERENCE_CASES] + [
    (f, a, *REFERENCE_CASES[0]) for f, a in family_impls([f for f in FAMILIES if f not in CORE_FAMILIES])
]


def _ids(length, batch=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, length), generator=g)


@torch.no_grad()
@pytest.mark.parametrize("family,attn", family_impls(FAMILIES))
def test_full_and_wide_window_reproduce_unpatched(family, attn):
    model = tiny_model(family, attn)
    sinkwindow.runtime.capability.check_supported(model)
    ids = _ids(37)
    base = model(ids).logits
    # Native sliding layers keep their own window so that W >= L is an exact identity there too.
    mode = "keep" if has_native_sliding(model) else "override"
    for spec in ("swa:37:4", "swa:64:0", "swa:500:16"):
        sinkwindow.apply(model, spec, native_sliding=mode)
        torch.testing.assert_close(model(ids).logits, base, atol=1e-5, rtol=1e-5)
    own_class = sinkwindow.runtime.capability.base_class(model)
    sinkwindow.apply(model, "full")
    # The model keeps the context subclass (so `with apply(model, "full")` works) under its own name.
    assert (
        sinkwindow.runtime.capability.base_class(model) is own_class
        and type(model).__name__ == own_class.__name__
    )
    assert isinstance(model, own_class)
    assert model.config._attn_implementation == attn
    torch.testing.assert_close(model(ids).logits, base, atol=0, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize(
    "family,attn,length,window,sinks", REFERENCE_MATRIX, ids=lambda x: str(x) if isinstance(x, str) else None
)
def test_swa_matches_fp64_reference(family, attn, length, window, sinks):
    model = tiny_model(family, attn)
    ids = _ids(length)
    spec = f"swa:{window}:{sinks}"
    modes = ["override", "keep"] if has_native_sliding(model) else ["override"]
    for mode in modes:
        ref = reference_logits(model, ids, spec, native_sliding=mode)
        sinkwindow.apply(model, spec, native_sliding=mode)
        got = model(ids).logits
        torch.testing.assert_close(got.double(), ref, atol=2e-4, rtol=1e-4)
        sinkwindow.apply(model, "full")


@torch.no_grad()
@pytest.mark.parametrize("family,attn", family_impls(FAMILIES))
def test_mask_really_applies(family, attn):
    """Guards the silent failure of docs/design.md §2: attention registered without a mask builder
    masks nothing."""
    model = tiny_model(family, attn)
    ids = _ids(40)
    spec = "swa:8:2"
    mode = "override"
    base = model(ids).logits
    sinkwindow.apply(model, spec, native_sliding=mode)
    swa = model(ids).logits
    # Identical while every query still sees everything it would under full attention...
    if not has_native_sliding(model):
        torch.testing.assert_close(swa[:, :8], base[:, :8], atol=1e-5, rtol=1e-5)
    # ...and clearly different once the sequence is longer than the window.
    assert (swa[:, 12:] - base[:, 12:]).abs().max() > 1e-2


def test_reference_mask_formula():
    m = reference_mask(10, 5, 2)
    for i in range(10):
        row = [j for j in range(10) if m[i, j]]
        expected = [j for j in range(10) if j <= i and (j < 2 or j > i - 3)]
        assert row == expected
        assert len(row) <= 5
    assert reference_mask(6, None, 0).sum() == 21


def test_context_manager_restores():
    model = tiny_model("llama")
    ids = _ids(30)
    with torch.no_grad():
        base = model(ids).logits
        with sinkwindow.apply(model, "swa:8:2") as patched:
            assert patched is model
            assert sinkwindow.active_spec(model) == sinkwindow.parse_spec("swa:8:2")
            assert (model(ids).logits - base).abs().max() > 1e-3
        assert sinkwindow.active_spec(model).is_full
        assert model.config._attn_implementation == "sdpa"
        assert sinkwindow.plan_of(model) is None and config_plan(model.config) is None
        torch.testing.assert_close(model(ids).logits, base, atol=0, rtol=0)


def test_full_block_runs_full_attention_and_returns_to_what_it_interrupted():
    model = tiny_model("llama")
    base_cls = type(model)
    ids = _ids(30)
    with torch.no_grad():
        base = model(ids).logits
        with sinkwindow.apply(model, "full"):  # on an unpatched model: a block that changes nothing
            torch.testing.assert_close(model(ids).logits, base, atol=0, rtol=0)
        assert type(model) is base_cls
        with sinkwindow.apply(model, "swa:8:2"):
            windowed = model(ids).logits
            with sinkwindow.apply(model, "full"):
                assert sinkwindow.active_spec(model).is_full
                torch.testing.assert_close(model(ids).logits, base, atol=0, rtol=0)
            assert str(sinkwindow.active_spec(model)) == "swa:8:2"
            torch.testing.assert_close(model(ids).logits, windowed, atol=0, rtol=0)
        assert sinkwindow.active_spec(model).is_full and type(model) is base_cls
        torch.testing.assert_close(model(ids).logits, base, atol=0, rtol=0)


def test_plain_calls_do_not_leak_into_blocks(tmp_path):
    # apply() outside any block, then a block: the block returns to the plain call's spec, not to a
    # spec an earlier plain call replaced.
    model = tiny_model("llama")
    sinkwindow.apply(model, "swa:8:2")
    sinkwindow.apply(model, "swa:16:4")
    with sinkwindow.apply(model, "evict:8:1"):
        pass
    assert str(sinkwindow.active_spec(model)) == "swa:16:4"
    sinkwindow.apply(model, "full")
    assert sinkwindow.runtime.capability.base_class(model) is type(model).__mro__[2]
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    with sinkwindow.apply(model, "swa:8:2"):
        pass
    assert sinkwindow.active_spec(model).is_full
    assert type(model) is sinkwindow.runtime.capability.base_class(model)  # the outermost block's exit


@torch.no_grad()
def test_after_a_plain_full_call_generate_is_the_unpatched_models():
    model = tiny_model("llama")
    ids = _ids(12)
    expected = model.generate(ids, max_new_tokens=6, do_sample=False)
    sinkwindow.apply(model, "swa:8:2")
    sinkwindow.apply(model, "full")  # leaves the context subclass, unpatched
    assert type(model) is not sinkwindow.runtime.capability.base_class(model)
    # generate() builds the family's own default cache again (the patched model builds none).
    assert model._supports_default_dynamic_cache()
    torch.testing.assert_close(
        model.generate(ids, max_new_tokens=6, do_sample=False), expected, atol=0, rtol=0
    )


def test_reapply_switches_spec_and_leaves_config_alone():
    model = tiny_model("gemma3_text")
    tcfg = text_config(model)
    original = list(tcfg.layer_types)
    sinkwindow.apply(model, "swa:8:2")
    sinkwindow.apply(model, "swa:16:4", native_sliding="keep")
    assert sinkwindow.active_spec(model) == sinkwindow.parse_spec("swa:16:4")
    assert tcfg.layer_types == original  # Gemma 3 reads layer_types every forward (per-type RoPE)
    assert native_sliding_layers(tcfg) == [True, True, False]
    cache = sinkwindow.make_cache(model)
    assert [(layer.window, layer.sinks, layer.is_sliding) for layer in cache.layers] == [
        (12, 0, True),
        (12, 0, True),
        (16, 4, False),
    ]
    sinkwindow.apply(model, "full")
    assert tcfg.layer_types == original and sinkwindow.active_spec(model).is_full


@torch.no_grad()
def test_stock_sliding_cache_that_lost_the_sinks_is_refused():
    """Gemma 3's default cache slides its local layers without sinks: SWA(w, s) cannot run on it."""
    from transformers import DynamicCache

    model = tiny_model("gemma3_text")
    sinkwindow.apply(model, "swa:8:2")
    stock = DynamicCache(config=model.config)
    with pytest.raises(ValueError, match="make_cache"):
        model(_ids(20), cache=stock, use_cache=True)
    assert stock.get_seq_length() == 0


def _refused(model, *patterns):
    """apply() refuses ``model`` with one line matching every pattern, leaving it untouched."""
    impl = model.config._attn_implementation
    with pytest.raises(ValueError) as err:
        sinkwindow.apply(model, "swa:8:2")
    message = str(err.value)
    assert "\n" not in message
    for pattern in patterns:
        assert re.search(pattern, message), (pattern, message)
    assert model.config._attn_implementation == impl and sinkwindow.active_spec(model).is_full
    return message


def test_every_tested_family_is_accepted_by_capability():
    """TESTED_MODEL_TYPES names exactly the families this suite runs, and each passes the checks."""
    seen = set()
    for family in FAMILIES:
        model = tiny_model(family, "eager")
        assert sinkwindow.runtime.capability.unsupported_reason(model) is None, family
        seen |= {model.config.model_type, text_config(model).model_type}
        # conftest skips SDPA exactly where transformers has none.
        assert type(model)._supports_sdpa == (family not in EAGER_ONLY), family
    assert seen == set(sinkwindow.runtime.capability.TESTED_MODEL_TYPES)
    assert sinkwindow.SUPPORTED_MODEL_TYPES == sinkwindow.runtime.capability.TESTED_MODEL_TYPES


def test_model_not_marked_backend_compatible_is_refused():
    from transformers import BloomConfig, BloomForCausalLM

    model = BloomForCausalLM(BloomConfig(n_layer=1, hidden_size=16, n_head=2, vocab_size=50))
    assert not BloomForCausalLM._supports_attention_backend
    _refused(model, "unsupported architecture 'bloom'", "_supports_attention_backend=False", "use a family")
    with pytest.raises(TypeError):
        sinkwindow.apply(torch.nn.Linear(2, 2), "swa:8:2")


def test_a_family_without_the_flag_is_accepted_by_a_probe_forward_and_matches_the_reference():
    """StableLM lacks _supports_attention_backend, yet routes attention and masks through the interfaces."""
    model = tiny_model("stablelm")
    assert not type(model)._supports_attention_backend
    assert sinkwindow.runtime.capability.unsupported_reason(model) is None
    ids = _ids(30)
    base = model(ids).logits
    sinkwindow.apply(model, "swa:8:2")
    assert (model(ids).logits - base).abs().max() > 1e-2  # the window changed the output
    torch.testing.assert_close(
        model(ids).logits.double(), reference_logits(model, ids, "swa:8:2"), atol=2e-4, rtol=1e-4
    )


def test_the_probe_names_a_layer_that_bypasses_the_attention_interface(monkeypatch):
    """The probe itself must see a bypass: one StableLM layer computing attention by hand is refused."""
    from transformers.models.stablelm import modeling_stablelm

    real = modeling_stablelm.StableLmAttention.forward

    def by_hand(self, hidden_states, *args, **kwargs):
        if self.layer_idx != 1:
            return real(self, hidden_states, *args, **kwargs)
        return self.o_proj(self.q_proj(hidden_states)), None

    monkeypatch.setattr(modeling_stablelm.StableLmAttention, "forward", by_hand)
    from sinkwindow.runtime.probe import probe_routing

    found = probe_routing(tiny_model("stablelm"), sinkwindow.runtime.capability._probe_layers)
    assert found is not None and "decoder layer(s) [1]" in found


def test_remote_code_is_told_to_use_transformers_implementation():
    from transformers import BloomConfig, BloomForCausalLM

    remote = type(
        "BloomForCausalLM", (BloomForCausalLM,), {"__module__": "transformers_modules.org.modeling_x"}
    )
    model = remote(BloomConfig(n_layer=1, hidden_size=16, n_head=2, vocab_size=50))
    _refused(model, "trust_remote_code=False")


def test_layers_without_attention_interface_are_refused():
    """transformers marks RecurrentGemma backend-compatible, yet its layers never call AttentionInterface."""
    from transformers import RecurrentGemmaConfig, RecurrentGemmaForCausalLM

    cfg = RecurrentGemmaConfig(
        num_hidden_layers=2,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=16,
        vocab_size=50,
        lru_width=16,
    )
    model = RecurrentGemmaForCausalLM(cfg)
    assert RecurrentGemmaForCausalLM._supports_attention_backend
    _refused(model, r"layer 0 of RecurrentGemmaModel .* computes no attention through AttentionInterface")


class _HandWrittenAttention(torch.nn.Module):
    """Softmax attention computed by hand from a stock layer's projections, never through AttentionInterface."""

    def __init__(self, stock):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            stock.q_proj,
            stock.k_proj,
            stock.v_proj,
            stock.o_proj,
        )

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        groups = q.shape[-1] // k.shape[-1]  # one head, GQA keys shared
        k, v = k.repeat_interleave(groups, -1), v.repeat_interleave(groups, -1)
        w = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        return self.o_proj(w @ v), None


def test_hand_written_attention_layer_is_refused():
    model = tiny_model("llama")
    model.model.layers[1].self_attn = _HandWrittenAttention(model.model.layers[1].self_attn)
    _refused(model, r"layer 1 of LlamaModel \(LlamaDecoderLayer\) computes no attention", "use a family")


def test_decoder_building_its_own_masks_is_refused():
    from transformers import LlamaModel
    from transformers.modeling_outputs import BaseModelOutputWithPast

    class HandMaskedLlamaModel(LlamaModel):
        def forward(self, input_ids=None, **kwargs):
            n = input_ids.shape[1]
            mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
            h = self.embed_tokens(input_ids)
            pos = torch.arange(n)[None]
            emb = self.rotary_emb(h, pos)
            for layer in self.layers:
                h = layer(h, attention_mask=mask, position_embeddings=emb, position_ids=pos)
            return BaseModelOutputWithPast(last_hidden_state=self.norm(h))

    model = tiny_model("llama")
    model.model.__class__ = HandMaskedLlamaModel
    _refused(model, "HandMaskedLlamaModel.forward builds its attention masks itself", "create_causal_mask")


@torch.no_grad()
def test_decoder_subclass_calling_super_is_accepted():
    """A wrapper whose forward defers to the stock one still builds its masks through create_causal_mask."""
    from transformers import LlamaModel

    class LoggingLlamaModel(LlamaModel):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    model = tiny_model("llama")
    ids = _ids(30)
    base = model(ids).logits
    model.model.__class__ = LoggingLlamaModel
    sinkwindow.apply(model, "swa:8:2")
    assert (model(ids).logits - base).abs().max() > 1e-2
    torch.testing.assert_close(
        model(ids).logits.double(), reference_logits(model, ids, "swa:8:2"), atol=2e-4, rtol=1e-4
    )


def test_chunked_attention_family_is_refused():
    """Llama 4's chunked layers have no SWA(w, s) counterpart to keep: refused, not silently overridden."""
    from transformers import AutoModelForCausalLM, Llama4TextConfig

    cfg = Llama4TextConfig(
        vocab_size=50, hidden_size=16, intermediate_size=32, intermediate_size_mlp=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_local_experts=2, attention_chunk_size=8,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(cfg, experts_implementation="eager")
    _refused(model, "unsupported architecture 'llama4_text'", "create_chunked_causal_mask")


def test_family_failing_the_contract_tests_has_a_named_refusal():
    """gpt-oss passes the capability checks, but its learned sinks are outside the fp64 reference."""
    from transformers import AutoModelForCausalLM, GptOssConfig

    cfg = GptOssConfig(
        vocab_size=50, hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, num_local_experts=2, num_experts_per_tok=1,
        layer_types=["sliding_attention", "full_attention"], sliding_window=8,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", experts_implementation="eager")
    message = _refused(model, "unsupported architecture 'gpt_oss'", "learned per-head sink logits")
    assert sinkwindow.runtime.capability.REFUSED_MODEL_TYPES["gpt_oss"] in message


def test_encoder_decoder_is_refused():
    from transformers import BartConfig, BartForConditionalGeneration

    cfg = BartConfig(
        vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
    )  # fmt: skip
    _refused(BartForConditionalGeneration(cfg), "encoder-decoder", "use a decoder-only model")


@torch.no_grad()
def test_family_without_sdpa_runs_its_eager_attention():
    """Stock SDPA would drop Gemma 2's attention softcap: an explicit request is refused, the default is eager."""
    model = tiny_model("gemma2", "eager")
    with pytest.raises(ValueError, match="_supports_sdpa=False.*attn_implementation='eager'"):
        sinkwindow.apply(model, "swa:8:2", attn_implementation="sdpa")
    assert sinkwindow.active_spec(model).is_full
    model.config._attn_implementation_internal = "flex_attention"  # no sink-window path: falls back
    sinkwindow.apply(model, "swa:8:2")
    assert model.config._attn_implementation == sinkwindow.runtime.attention.EAGER_NAME
    ids = _ids(29)
    torch.testing.assert_close(
        model(ids).logits.double(), reference_logits(model, ids, "swa:8:2"), atol=2e-4, rtol=1e-4
    )


def test_bad_spec_and_linear_spec_rejected():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="smaller than the window"):
        sinkwindow.apply(model, "swa:4:4")
    with pytest.raises(ValueError, match="is a trained method"):
        sinkwindow.apply(model, "lolcats:64")
    with pytest.raises(ValueError, match="native_sliding"):
        sinkwindow.apply(model, "swa:8:2", native_sliding="sometimes")
    assert sinkwindow.active_spec(model).is_full


def test_unknown_model_name():
    with pytest.raises(ValueError, match="unknown model 'no-such-model'.*smollm2-135m"):
        sinkwindow.load("no-such-model")


@torch.no_grad()
def test_models_built_from_one_config_do_not_share_a_patch():
    """from_config hands one config object to both models; patching one must leave the other alone."""
    from transformers import AutoModelForCausalLM

    from conftest import tiny_config

    cfg = tiny_config("llama")
    torch.manual_seed(0)
    a = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    b = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    b.load_state_dict(a.state_dict())
    assert a.config is b.config  # the sharing this guards against
    ids = _ids(40)
    want = b(ids, use_cache=False).logits
    sinkwindow.apply(a, "swa:8:2")
    assert b(ids, use_cache=False).logits.equal(want)
    assert b.config._attn_implementation == "sdpa" and a.config is not b.config
    assert not torch.allclose(a(ids, use_cache=False).logits, want, atol=1e-3)
    torch.testing.assert_close(
        a(ids, use_cache=False).logits, reference_logits(b, ids, "swa:8:2").float(), atol=1e-4, rtol=0
    )
    sinkwindow.apply(a, "full")
    torch.testing.assert_close(a(ids, use_cache=False).logits, want, atol=1e-5, rtol=0)


def test_the_plan_is_one_typed_object_on_the_model_and_never_in_a_saved_config(tmp_path):
    # The mask builders read the plan from the config (all transformers hands them), but it is bound,
    # not written into the config: save_pretrained of a patched model saves the plain model's config.
    model = tiny_model("llama")
    with sinkwindow.apply(model, "swa:8:2+full:1"):
        plan = sinkwindow.plan_of(model)
        assert isinstance(plan, sinkwindow.AttentionPlan)
        assert (plan.kind, plan.window, plan.sinks, plan.native_sliding) == ("swa", 8, 2, "override")
        assert plan.full_kv_heads[1] == tuple(range(model.config.num_key_value_heads))
        assert plan.restores == "sdpa" and plan.attention == sinkwindow.runtime.attention.SDPA_NAME
        assert config_plan(model.config) is plan
        with pytest.raises(AttributeError):
            plan.spec = sinkwindow.parse_spec("swa:4:1")  # frozen: nothing edits a running plan
        model.save_pretrained(tmp_path)
        saved = json.loads((tmp_path / "config.json").read_text())
        assert not any("sinkwindow" in key for key in saved)
    assert sinkwindow.plan_of(model) is None and config_plan(model.config) is None


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@torch.no_grad()
def test_a_copy_of_a_patched_model_runs_the_same_window_and_restores_alone(how):
    import copy
    import pickle

    from transformers import LlamaForCausalLM

    model = tiny_model("llama")
    ids = _ids(30)
    full = model(ids).logits
    sinkwindow.apply(model, "swa:8:2+full:1")  # a hybrid: its full-attention units travel too
    want = model(ids).logits
    twin = copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))
    # The family's class under the context class, so the copy can still open and close blocks.
    assert (
        type(twin).__name__ == "LlamaForCausalLM"
        and sinkwindow.runtime.capability.base_class(twin) is LlamaForCausalLM
    )
    assert twin.config is not model.config and sinkwindow.plan_of(twin) == sinkwindow.plan_of(model)
    torch.testing.assert_close(twin(ids).logits, want, atol=0, rtol=0)
    sinkwindow.apply(model, "full")  # the original's restore leaves the copy patched
    torch.testing.assert_close(twin(ids).logits, want, atol=0, rtol=0)
    sinkwindow.apply(twin, "full")  # and the copy's restore removes its own hooks, not the original's
    assert not twin._forward_pre_hooks and not twin._forward_hooks
    torch.testing.assert_close(twin(ids).logits, full, atol=0, rtol=0)
    with sinkwindow.apply(twin, "swa:8:2+full:1"):
        torch.testing.assert_close(twin(ids).logits, want, atol=0, rtol=0)


@torch.no_grad()
def test_a_saved_patched_model_runs_its_window_in_a_fresh_process(tmp_path):
    # torch.save / pickle, then a process that does not import sinkwindow itself (a worker, a Ray task).
    model = tiny_model("llama")
    ids = _ids(30)
    full = model(ids).logits
    sinkwindow.apply(model, "swa:8:2+full:1")
    want = model(ids).logits
    assert not torch.allclose(want, full, atol=1e-3)  # the window changes these logits
    torch.testing.assert_close(logits_in_fresh_process(model, ids, tmp_path), want, atol=0, rtol=0)
