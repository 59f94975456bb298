"""``sinkwindow baseline``: a candidate's state measured on its cache object against arithmetic from its
config, the equal-memory window, the run folder's rows, and the pair's report; on tiny random models of
three families with different state shapes (Qwen3-Next: gated delta rule + full attention, Mamba2,
LFM2: convolution + attention) that share the base's tokenizer, saved to folders and loaded by path."""

from __future__ import annotations

import json

import pytest
import torch

from test_niah import make_byte_bpe, make_word_level

FAMILIES = ("qwen3_next", "mamba2", "lfm2")
TASKS = ["niah_single_1", "babilong_qa1"]
LAYERS = 4  # every tiny candidate; half are full attention in the hybrids


def candidate_config(family: str, vocab: int):
    import transformers as tf

    if family == "qwen3_next":
        return tf.Qwen3NextConfig(
            vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, linear_num_value_heads=4,
            linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4,
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16,
            full_attention_interval=2, max_position_embeddings=4096,
        )  # fmt: skip
    if family == "mamba2":
        return tf.Mamba2Config(vocab_size=vocab, hidden_size=32, num_hidden_layers=LAYERS, state_size=8,
                               num_heads=8, head_dim=8, expand=2, n_groups=1, conv_kernel=4, chunk_size=32)  # fmt: skip
    return tf.Lfm2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS, num_attention_heads=4,
        num_key_value_heads=2, layer_types=["conv", "full_attention"] * (LAYERS // 2), conv_L_cache=3,
        max_position_embeddings=4096,
    )  # fmt: skip


def expected_state_bytes(family: str, config, n: int) -> int:
    """The family's decoding state after n tokens, float32, batch 1, from its config and the shapes of
    transformers' cache layers: convolution state (channels x kernel), recurrent state, and the keys and
    values of the full-attention layers; each linear layer also keeps one int64 token counter."""
    f32, counter = 4, 8
    if family == "mamba2":
        channels = config.expand * config.hidden_size + 2 * config.n_groups * config.state_size
        conv = channels * config.conv_kernel
        ssm = config.num_heads * config.head_dim * config.state_size
        return config.num_hidden_layers * ((conv + ssm) * f32 + counter)
    full = sum(t == "full_attention" for t in config.layer_types)
    linear = config.num_hidden_layers - full
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = full * 2 * config.num_key_value_heads * head_dim * n * f32
    if family == "qwen3_next":
        key_dim = config.linear_num_key_heads * config.linear_key_head_dim
        conv = (
            2 * key_dim + config.linear_num_value_heads * config.linear_value_head_dim
        ) * config.linear_conv_kernel_dim
        rec = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
        return kv + linear * ((conv + rec) * f32 + counter)
    return kv + linear * (config.hidden_size * config.conv_L_cache * f32 + counter)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The base (a tiny Llama), the three candidates and one with another tokenizer, each a folder."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    tok = make_byte_bpe()
    root = tmp_path_factory.mktemp("byom")
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=4096)).eval()  # fmt: skip
    out = {"base": root / "base"}
    base.save_pretrained(out["base"])
    tok.save_pretrained(out["base"])
    for family in FAMILIES:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(candidate_config(family, len(tok))).save_pretrained(root / family)
        tok.save_pretrained(root / family)
        out[family] = root / family
    other = make_word_level()
    AutoModelForCausalLM.from_config(candidate_config("mamba2", len(other))).save_pretrained(root / "other")
    other.save_pretrained(root / "other")
    out["other"] = root / "other"
    return {k: str(v) for k, v in out.items()}


def test_state_walk_counts_each_storage_once():
    from sinkwindow.eval.baseline.state import state_nbytes

    class Layer:
        def __init__(self, buf):
            self.keys, self.values = buf[:, :3], buf[:, 3:]  # two views of one buffer
            self.states = {"conv": torch.zeros(5, dtype=torch.float16), "empty": torch.zeros(0)}

    class Cache:
        def __init__(self):
            buf = torch.zeros(2, 8)
            self.layers = [Layer(buf), Layer(torch.zeros(4, 4, dtype=torch.float64))]
            self.alias = self.layers[0].keys  # the same tensor reached twice

    assert state_nbytes(Cache()) == 2 * 8 * 4 + 5 * 2 + 16 * 8 + 5 * 2


@pytest.mark.parametrize("family", FAMILIES)
def test_measured_state_is_the_configs_arithmetic(folders, family):
    from sinkwindow.eval.baseline.candidate import load_candidate
    from sinkwindow.eval.baseline.state import measure_state_bytes

    model, _ = load_candidate(folders[family], trust_remote_code=False, dtype=torch.float32, device="cpu")
    for n in (37, 300):  # 300 > chunk: the state is carried across prefill chunks
        assert measure_state_bytes(model, n, chunk_size=128) == expected_state_bytes(family, model.config, n)


def test_equal_memory_window_is_the_largest_that_fits(folders):
    from transformers import AutoConfig

    from sinkwindow.eval.baseline.window import equal_memory_window, neighbour_windows, swa_bound_bytes

    config = AutoConfig.from_pretrained(folders["base"])
    per_token = 2 * 2 * 2 * 8 * 4  # layers x (K, V) x kv heads x head dim x float32
    for budget in (per_token * 4, per_token * 99 + 5, 6672, 10**6):
        w = equal_memory_window(config, budget, 4, torch.float32)
        assert (
            swa_bound_bytes(config, w, 4, torch.float32)
            <= budget
            < swa_bound_bytes(config, w + 1, 4, torch.float32)
        )
        assert w == budget // per_token + 1  # (W - 1) tokens of KV fit, W do not
    with pytest.raises(ValueError, match="no window fits"):
        equal_memory_window(config, per_token * 3, 4, torch.float32)
    assert neighbour_windows(27, 4) == [16, 32] and neighbour_windows(256, 4) == [128, 512]
    assert neighbour_windows(6, 4) == [8]


def _run(folders, candidate, out, **kw):
    from sinkwindow.eval.baseline.run import BaselineConfig, run_baseline

    kw.setdefault("samples", 1)
    return run_baseline(BaselineConfig(candidate=candidate, base=folders["base"], tasks=TASKS, **kw), out)


def _rows(out):
    from sinkwindow.eval.results import ResultsStore

    return ResultsStore(out).all_rows()


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_runs_end_to_end_beside_swa_at_equal_memory(folders, family, tmp_path):
    from transformers import AutoConfig

    from sinkwindow.eval.baseline.report import PLOT_FILE, write_baseline_report
    from sinkwindow.eval.baseline.window import swa_bound_bytes

    record = _run(folders, folders[family], tmp_path)
    choice, context = record["choice"], record["eval_context"]
    config = AutoConfig.from_pretrained(folders[family])
    assert context == 2048 and choice["budget_bytes"] == expected_state_bytes(family, config, context)
    base_config = AutoConfig.from_pretrained(folders["base"])
    w = choice["window"]
    assert swa_bound_bytes(base_config, w, 4, torch.float32) <= choice["budget_bytes"]
    assert swa_bound_bytes(base_config, w + 1, 4, torch.float32) > choice["budget_bytes"]
    assert choice["swa_bytes_measured"] <= choice["budget_bytes"]
    # Neighbours past the context would be full attention again: left out, and said so.
    assert all(n - 1 < context for n in choice["neighbours"])
    assert all(n - 1 >= context for n in choice["neighbours_left_out"])
    rows = _rows(tmp_path)
    methods = {(r["model"], r["method"]) for r in rows}
    assert methods == {(folders["base"], m) for m in record["roles"]} | {(folders[family], "full")}
    # Two tasks x two lengths each, one sample: every model and method has its four rows.
    assert len(rows) == 4 * len(methods)
    for r in rows:
        assert r["state_bytes_source"] == f"cache-object after prefill at {r['state_context']} tokens"
        if r["model"] == folders[family]:
            assert r["role"] == "candidate"
            assert r["state_bytes"] == expected_state_bytes(family, config, r["state_context"])
        elif r["method"] == f"swa:{w}:4":
            assert r["role"] == "base-swa" and str(choice["budget_bytes"]) in r["window_choice"].replace(
                ",", ""
            )
    full_curve = record["state_curves"]["B full"]
    assert [b for _, b in full_curve] == [n * 2 * 2 * 2 * 8 * 4 for n, _ in full_curve]
    cand_curve = record["state_curves"][f"C {folders[family]}"]
    assert [b for _, b in cand_curve] == [expected_state_bytes(family, config, n) for n, _ in cand_curve]
    report = write_baseline_report(tmp_path).read_text()
    assert f"SWA({w}, 4)" in report and "p (Holm)" in report and (tmp_path / PLOT_FILE).stat().st_size > 0


def test_a_candidate_equal_to_its_base_scores_what_full_attention_scores(folders, tmp_path):
    import shutil

    from sinkwindow.eval.baseline.report import pair_table

    with pytest.raises(ValueError, match="are both"):
        _run(folders, folders["base"], tmp_path / "same")
    twin = shutil.copytree(folders["base"], tmp_path / "twin")  # the same weights under another name
    record = _run(folders, str(twin), tmp_path / "run", samples=2)
    rows = _rows(tmp_path / "run")
    cand = {(r["task"], r["length"], r["index"]): r for r in rows if r["role"] == "candidate"}
    full = {(r["task"], r["length"], r["index"]): r for r in rows if r["role"] == "base-full"}
    assert len(cand) == 8 and cand.keys() == full.keys()
    for key, r in cand.items():
        assert (r["prediction"], r["score"], r["state_bytes"]) == (
            full[key]["prediction"], full[key]["score"], full[key]["state_bytes"])  # fmt: skip
    # C keeps every key, as full attention does: SWA at equal memory covers the whole context.
    assert record["choice"]["within_window_at_context"]
    table = pair_table(rows, record)
    for cell in table["cells"]:
        assert cell["means"][table["columns"][-1]] == cell["means"]["B full"]


def test_a_retrofit_candidate_gives_the_rows_compare_gives(folders, tmp_path):
    """``--candidate lolcats:16`` of the base runs the runner's own cells: the rows (predictions, scores,
    fingerprints) of ``compare``'s path for that method on the same samples."""
    from sinkwindow.eval.runner import EvalConfig, run_eval
    from sinkwindow.linear import convert, save_checkpoint
    from sinkwindow.models.loading import load

    model, _ = load(folders["base"])
    ckpt = str(
        save_checkpoint(convert(model, "lolcats:16", init="kaiming", seed=3), tmp_path / "l16.safetensors")
    )
    record = _run(folders, "lolcats:16", tmp_path / "pair", checkpoints={"lolcats:16": ckpt})
    assert record["candidate_kind"] == "method" and record["roles"]["lolcats:16"]["role"] == "candidate"
    cfg = EvalConfig(model=folders["base"], methods=["lolcats:16"], tasks=TASKS, lengths=[512, 2048],
                     babilong_lengths=[0, 1024], samples=1, niah_max_new_tokens=None,
                     checkpoints={"lolcats:16": ckpt})  # fmt: skip
    compared = {
        (r["task"], r["length"], r["index"]): r
        for r in run_eval(cfg, tmp_path / "cmp", progress=False).rows()
    }
    ours = {
        (r["task"], r["length"], r["index"]): r
        for r in _rows(tmp_path / "pair")
        if r["method"] == "lolcats:16"
    }
    assert ours.keys() == compared.keys() and len(ours) == 4
    for key, r in ours.items():
        for field in ("prediction", "score", "fingerprint", "model"):
            assert r[field] == compared[key][field], (key, field)
    # The retrofit's own cache is what is measured: its constant state plus a 16-token window.
    assert record["choice"]["budget_bytes"] == ours[("niah_single_1", 2048, 0)]["state_bytes"]


def test_a_candidate_with_another_tokenizer_is_refused(folders, tmp_path):
    with pytest.raises(ValueError, match="different tokenizers") as err:
        _run(folders, folders["other"], tmp_path)
    assert "\n" not in str(err.value) and not (tmp_path / "results.jsonl").exists()


def test_the_command_runs_and_refuses_in_one_line(folders, tmp_path, capsys):
    from sinkwindow.cli import main

    out = tmp_path / "run"
    argv = ["baseline", "--candidate", folders["mamba2"], "--base", folders["base"], "--tasks", "niah_single_1",
            "--lengths", "512", "--samples", "1", "--out", str(out), "--allow-dirty"]  # fmt: skip
    assert main(argv) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["window"] == json.loads((out / "baseline.json").read_text())["choice"]["window"]
    assert (out / "baseline.md").exists() and (out / "state_bytes.png").exists()
    assert main([*argv[:2], "swa:64:4", *argv[3:]]) != 0
    err = capsys.readouterr().err.strip()
    assert "base's own attention methods" in err and len(err.splitlines()) == 1


def test_a_rerun_resumes_and_another_candidate_is_refused(folders, tmp_path):
    from sinkwindow.eval.baseline.run import BaselineConfig, run_baseline
    from sinkwindow.runs.folder import RunMismatchError

    config = BaselineConfig(candidate=folders["mamba2"], base=folders["base"], tasks=["niah_single_1"],
                            lengths=[512], samples=1)  # fmt: skip
    first = run_baseline(config, tmp_path)
    rows = (tmp_path / "results.jsonl").read_text()
    assert run_baseline(config, tmp_path)["choice"] == first["choice"]
    assert (tmp_path / "results.jsonl").read_text() == rows  # nothing ran twice
    config.candidate = folders["lfm2"]
    with pytest.raises(RunMismatchError, match="candidate"):
        run_baseline(config, tmp_path)
