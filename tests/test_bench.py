"""The efficiency benchmark's measuring code: sizes, memory accounting, state fills, row schema.

No timing assertions: timings depend on the machine. What must hold everywhere is that the
synthetic model has the sizes asked for, that analytic KV/state bytes equal the bytes the cache
really holds, that the fast state fill leaves the same cache a real prefill does, and that every
row follows the JSONL schema.
"""

from __future__ import annotations

import json

import pytest
import torch

from sinkwindow.bench import (
    BenchConfig,
    PeakMemory,
    SyntheticConfig,
    analytic_state_bytes,
    build_synthetic,
    cache_lengths,
    cache_nbytes,
    check_targets,
    load_rows,
    measure_decode,
    measure_decode_interleaved,
    measure_prefill,
    measure_prefill_interleaved,
    run_bench,
    runner_for,
    validate_row,
    weight_bytes_per_token,
    write_report,
)
from sinkwindow.bench.cli import config_from_args, parse_contexts
from sinkwindow.bench.decode import random_ids
from sinkwindow.methods import method_of
from sinkwindow.runtime.spec import parse_spec

# GQA (6 query heads over 2 KV heads), sizes that are not powers of two.
TINY = SyntheticConfig(layers=2, hidden=48, heads=6, kv_heads=2, vocab=101, max_positions=4096)
METHODS = ["full", "swa:16:4", "swa:16:0", "evict:16:2", "linear", "lolcats:8", "liger:8"]


@pytest.fixture(scope="module")
def tiny():
    return build_synthetic(TINY)


def _n_params(cfg: SyntheticConfig) -> int:
    h, kv = cfg.hidden, (cfg.kv_heads or cfg.heads) * cfg.head_dim
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * cfg.mlp_width + 2 * h
    return 2 * cfg.vocab * h + cfg.layers * per_layer + h


@pytest.mark.parametrize(
    "layers,hidden,heads,kv_heads,intermediate",
    [(1, 32, 4, None, None), (3, 48, 6, 2, None), (2, 64, 8, 1, 100)],
    ids=["L1-D32-H4", "L3-D48-H6-KV2", "L2-D64-H8-KV1-I100"],
)
def test_synthetic_model_has_the_sizes_asked_for(layers, hidden, heads, kv_heads, intermediate):
    cfg = SyntheticConfig(
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, intermediate=intermediate, vocab=57
    )
    model = build_synthetic(cfg)
    c = model.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (layers, hidden, heads)
    assert c.num_key_value_heads == (kv_heads or heads)
    assert c.intermediate_size == (intermediate or cfg.mlp_width)
    assert model.model.layers[0].self_attn.k_proj.out_features == (kv_heads or heads) * hidden // heads
    assert sum(p.numel() for p in model.parameters()) == _n_params(cfg)
    assert not model.training
    logits = model(torch.randint(0, 57, (1, 7))).logits
    assert logits.shape == (1, 7, 57)


def test_synthetic_defaults_are_the_papers():
    cfg = SyntheticConfig()
    llama = cfg.to_llama_config()
    assert (llama.num_hidden_layers, llama.hidden_size, llama.num_attention_heads) == (4, 1024, 16)
    assert llama.num_key_value_heads == 16 and llama.intermediate_size == 2816
    assert llama.max_position_embeddings >= 262144 + 64  # 256K context plus decode steps


@pytest.mark.parametrize("kw", [dict(hidden=50, heads=6), dict(heads=6, kv_heads=4), dict(layers=0)])
def test_synthetic_rejects_impossible_sizes(kw):
    with pytest.raises(ValueError):
        SyntheticConfig(**kw)


@pytest.mark.parametrize("n", [5, 15, 16, 37, 101], ids=lambda n: f"T{n}")
@pytest.mark.parametrize("method", METHODS)
def test_analytic_bytes_equal_cache_nbytes(tiny, method, n):
    ids = random_ids(TINY.vocab, n)
    with runner_for(tiny, method) as runner:
        _, cache = runner.prefill(ids, chunk_size=8)
        measured = cache_nbytes(cache)
        assert measured == runner.analytic_bytes(n)
        assert measured == method_of(method).state_bytes(tiny.config, n, dtype=torch.float32)
        assert cache.get_seq_length() == n


@pytest.mark.parametrize("method", METHODS)
def test_fast_fill_leaves_the_cache_shapes_of_a_real_prefill(tiny, method):
    n = 200
    ids = random_ids(TINY.vocab, n, seed=3)
    with runner_for(tiny, method) as runner:
        _, real = runner.prefill(ids, chunk_size=8)
        _, fast = runner.fill(ids, chunk_size=8)
        assert fast.get_seq_length() == real.get_seq_length() == n
        assert cache_lengths(fast) == cache_lengths(real)
        assert cache_nbytes(fast) == cache_nbytes(real) == runner.analytic_bytes(n)
        for a, b in zip(fast.layers, real.layers):
            for name in ("keys", "values", "S", "z"):
                x, y = getattr(a, name, None), getattr(b, name, None)
                assert (x is None) == (y is None)
                if x is not None:
                    assert x.shape == y.shape and x.dtype == y.dtype


@pytest.mark.parametrize("spec", ["swa:16:4", "swa:16:0", "evict:16:2"])
def test_window_fill_equals_real_prefill_in_a_one_layer_model(spec):
    # Layer 0's keys depend only on token and position, so for one layer the fill is exact: same
    # cache contents, same next decode step, and (for swa, whose prompt is windowed too; evict's
    # real prompt is dense) the same last logits.
    model = build_synthetic(SyntheticConfig(layers=1, hidden=32, heads=4, kv_heads=2, vocab=61))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)  # sharper attention, so a wrong key would show in the logits
    n = 150
    ids = random_ids(61, n, seed=5)
    with torch.no_grad(), runner_for(model, spec) as runner:
        logits_real, real = runner.prefill(ids, chunk_size=8)
        logits_fast, fast = runner.fill(ids, chunk_size=8)
        if spec.startswith("swa"):
            torch.testing.assert_close(logits_fast, logits_real, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fast.layers[0].keys, real.layers[0].keys)
        torch.testing.assert_close(fast.layers[0].values, real.layers[0].values)
        token = logits_real.argmax(-1, keepdim=True)
        step_real = model(token, cache=real).logits
        step_fast = model(token, cache=fast).logits
        torch.testing.assert_close(step_fast, step_real, rtol=1e-5, atol=1e-5)


def test_full_fill_holds_n_keys(tiny):
    n = 1000
    with runner_for(tiny, "full") as runner:
        _, cache = runner.fill(random_ids(TINY.vocab, n), chunk_size=8)
        assert cache.get_seq_length() == n
        assert cache.layers[0].keys.shape == (1, 2, n, 8)
        assert cache.layers[0].keys.is_contiguous()
        assert cache_nbytes(cache) == runner.analytic_bytes(n)


def test_cache_nbytes_counts_the_storage_a_view_pins(tiny):
    with runner_for(tiny, "full") as runner:
        _, cache = runner.prefill(random_ids(TINY.vocab, 20), chunk_size=8)
        exact = cache_nbytes(cache)
        layer = cache.layers[0]
        big = torch.cat([layer.keys, layer.keys], dim=-2)
        layer.keys = big[..., :20, :]  # same numel as before, twice the storage
        assert cache_nbytes(cache) == exact + big.numel() * big.element_size() // 2


def test_analytic_bytes_are_flat_for_bounded_methods(tiny):
    for method in ("swa:64:4", "evict:64:4", "linear", "lolcats:64"):
        spec = parse_spec(method)
        sizes = {method_of(spec).state_bytes(tiny.config, n) for n in (64, 1024, 262144)}
        assert len(sizes) == 1, method
    full = parse_spec("full")
    assert analytic_state_bytes(full, tiny.config, 2048) == 2 * analytic_state_bytes(full, tiny.config, 1024)
    bf16 = analytic_state_bytes(parse_spec("swa:16:4"), tiny.config, 100, dtype=torch.bfloat16)
    assert 2 * bf16 == analytic_state_bytes(parse_spec("swa:16:4"), tiny.config, 100)


def test_weight_bytes_per_token_counts_the_head_not_the_lookup(tiny):
    total = sum(p.numel() * p.element_size() for p in tiny.parameters())
    emb = tiny.get_input_embeddings().weight
    assert weight_bytes_per_token(tiny) == total - emb.numel() * 4 + emb.shape[1] * 4


def test_weight_bytes_per_token_counts_tied_weights_once():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg)
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    unique = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    assert weight_bytes_per_token(model) == sum(unique.values())


def test_peak_memory_sees_an_allocation_inside_the_block():
    with PeakMemory() as mem:
        x = torch.ones(32 << 20)  # 128 MiB
        del x
    assert mem.peak_rss >= mem.rss_before > 0
    if mem.rss_scope == "block":
        assert mem.peak_rss - mem.rss_before >= 100 << 20


@pytest.mark.parametrize("real_max,fill", [(16, "fill"), (64, "prefill")])
def test_decode_row_follows_the_schema(tiny, real_max, fill):
    with runner_for(tiny, "swa:16:4") as runner:
        row = measure_decode(runner, 40, steps=2, warmup=1, chunk_size=8, real_prefill_max=real_max)
    row["model"] = "synthetic"
    validate_row(row)
    assert json.loads(json.dumps(row)) == row
    assert row["fill"] == fill
    assert (row["prefill_s"] is None) == (fill == "fill")
    assert row["kv_bytes"] == row["kv_bytes_analytic"] == row["kv_bytes_end"]
    assert row["seq_length"] == 40
    assert row["kv_entries_per_layer"] == 15


def test_interleaved_decode_gives_one_row_per_context(tiny):
    with runner_for(tiny, "lolcats:8") as runner:
        rows = measure_decode_interleaved(
            runner, [40, 5, 200], steps=3, warmup=1, chunk_size=8, real_prefill_max=64
        )
    assert [r["context"] for r in rows] == [40, 5, 200]
    assert [r["fill"] for r in rows] == ["prefill", "prefill", "fill"]
    for row in rows:
        validate_row({**row, "model": "synthetic"})
        assert row["protocol"] == "interleaved" and row["steps"] == 3
        assert row["kv_bytes"] == row["kv_bytes_analytic"] and row["seq_length"] == row["context"]


def test_interleaved_prefill_fills_each_cache_like_a_real_prefill(tiny):
    with runner_for(tiny, "swa:16:4") as runner:
        rows = measure_prefill_interleaved(runner, [24, 100, 50], chunk_size=8)
        _, real = runner.prefill(random_ids(TINY.vocab, 100), chunk_size=8)
    assert [r["context"] for r in rows] == [24, 100, 50]
    for row in rows:
        validate_row({**row, "model": "synthetic"})
        assert row["seq_length"] == row["context"] and row["kv_bytes"] == row["kv_bytes_analytic"]
    assert rows[1]["kv_bytes"] == cache_nbytes(real)


def test_prefill_row_follows_the_schema(tiny):
    with runner_for(tiny, "full") as runner:
        row = measure_prefill(runner, 33, chunk_size=8)
    row["model"] = "synthetic"
    validate_row(row)
    assert row["chunk_size"] == 33  # full attention prefills in one forward
    assert row["kv_bytes"] == row["kv_bytes_analytic"]


@pytest.mark.parametrize(
    "change",
    [
        {"kind": "train"},
        {"status": "maybe"},
        {"ms_per_token": -1.0},
        {"kv_bytes": 1.5},
        {"context": 0},
        {"method": "swa:4:8"},
        {"status": "skipped", "reason": ""},
    ],
    ids=["kind", "status", "negative", "float-bytes", "context", "method", "no-reason"],
)
def test_validate_row_rejects_malformed_rows(change):
    row = {
        "kind": "decode",
        "model": "m",
        "method": "swa:64:4",
        "context": 1024,
        "status": "ok",
        "reason": None,
        "ms_per_token": 10.0,
        "tokens_per_s": 100.0,
        "kv_bytes": 1000,
        "prefill_s": None,
        "peak_rss_bytes": 10**9,
    }
    validate_row(dict(row))
    with pytest.raises(ValueError):
        validate_row({**row, **change})
    with pytest.raises(ValueError):
        validate_row({k: v for k, v in row.items() if k != "peak_rss_bytes"})


def test_run_bench_writes_rows_report_and_skips(tmp_path):
    # KV of full attention at context 40: 2 layers x (k + v) x 2 heads x 8 dims x 40 x 4 B = 10 KiB.
    config = BenchConfig(
        models=("synthetic", "no-such-model"),
        methods=("full", "swa:16:4", "linear"),
        contexts=(8, 40),
        prefill_contexts=(32,),
        steps=2,
        warmup=1,
        chunk_size=8,
        synthetic=TINY,
        bandwidth_mib=8,
        mem_budget_gib=6 * 1024 / 2**30,
        out=str(tmp_path),
        plots=False,
    )
    rows = run_bench(config)
    assert rows == load_rows(tmp_path)
    for row in rows:
        validate_row(row)
    cells = {(r["model"], r["kind"], r["method"], r["context"]): r for r in rows}
    assert cells[("synthetic", "decode", "full", 8)]["status"] == "ok"
    assert "budget" in cells[("synthetic", "decode", "full", 40)]["reason"]
    assert cells[("synthetic", "decode", "swa:16:4", 40)]["status"] == "ok"
    assert cells[("synthetic", "prefill", "swa:16:4", 32)]["status"] == "ok"
    paired = cells[("synthetic", "paired", "swa:16:4", 8)]  # n <= w: patched vs unpatched, alternating
    assert paired["baseline"] == "full" and paired["ratio"] > 0 and paired["steps"] == 2
    assert paired["kv_bytes"] == paired["kv_bytes_baseline"]  # below the window both hold every key
    assert ("synthetic", "paired", "swa:16:4", 40) not in cells
    assert all(
        r["status"] == "skipped" and "unavailable" in r["reason"]
        for r in rows
        if r["model"] == "no-such-model"
    )
    ok_decode = [r for r in rows if r["kind"] == "decode" and r["status"] == "ok"]
    assert all(r["roofline_ms"] > 0 for r in ok_decode)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["config"]["synthetic"]["hidden"] == 48 and "synthetic" in meta["bandwidth"]
    result = write_report(rows, tmp_path, plots=False)
    assert "swa:16:4" in (tmp_path / "bench.md").read_text()
    targets = json.loads((tmp_path / "targets.json").read_text())["median_step"]
    assert {t["name"] for t in targets} == set(result["targets"])
    assert result["rows"] == len(rows) and result["ok"] + result["skipped"] == len(rows)
    assert set(result["targets_min_step"]) == set(result["targets"])


def _row(method, context, ms, kind="decode", model="synthetic", **extra):
    return {
        "kind": kind,
        "model": model,
        "method": method,
        "context": context,
        "status": "ok",
        "reason": None,
        "ms_per_token": ms,
        "tokens_per_s": 1e3 / ms,
        "kv_bytes": extra.pop("kv_bytes", 1000),
        "prefill_s": extra.pop("prefill_s", None),
        "peak_rss_bytes": 1,
        **extra,
    }


def test_check_targets_reads_ratios_from_rows():
    rows = [
        _row("swa:64:4", 32, 10.0),
        _row("full", 32, 9.5),
        _row("swa:64:4", 1024, 10.0),
        _row("swa:64:4", 2048, 10.0),
        _row("full", 2048, 12.0),
        _row("swa:64:4", 4096, 10.0),
        _row("full", 4096, 15.0),
        _row("swa:64:4", 65536, 10.5),
        _row("swa:64:4", 16384, 1.0, kind="prefill", prefill_s=10.0),
        _row("swa:64:4", 32768, 1.0, kind="prefill", prefill_s=21.0),
        _row("full", 16384, 1.0, kind="prefill", prefill_s=10.0),
        _row("full", 32768, 1.0, kind="prefill", prefill_s=35.0),
        _row("swa:64:4", 1024, 50.0, model="real", roofline_ms=30.0, roofline_ratio=50 / 30.0,
             weight_bytes_per_token=540e6, bandwidth_gbps=18.0),
    ]  # fmt: skip
    got = {t["name"]: t for t in check_targets(rows)}
    paired = _row("swa:64:4", 32, 12.0, kind="paired", baseline="full", ms_per_token_baseline=10.0)
    assert check_targets([*rows, paired])[4]["value"] == {"synthetic@32": 1.2}
    assert got["swa_decode_flat"]["ok"] and got["swa_decode_flat"]["value"] == 1.05
    assert got["swa_kv_constant"]["ok"]
    assert got["swa_faster_than_full"]["ok"] and got["swa_faster_than_full"]["value"] == {
        2048: 1.2,
        4096: 1.5,
    }
    assert got["swa_prefill_linear"]["ok"] and got["swa_prefill_linear"]["value"]["full"] == 3.5
    assert got["short_context_overhead"]["ok"] and got["short_context_overhead"]["value"] == {
        "synthetic@32": 1.053
    }
    assert got["roofline"]["ok"]
    alternating = _row("swa:64:4", 2048, 10.0, kind="paired", baseline="full", ms_per_token_baseline=13.0)
    assert check_targets([*rows, alternating])[2]["value"] == {2048: 1.3, 4096: 1.5}  # paired cells win
    slower = [*rows, _row("swa:64:4", 8192, 20.0), _row("full", 8192, 15.0)]
    assert not {t["name"]: t for t in check_targets(slower)}["swa_faster_than_full"]["ok"]


def test_cli_parses_the_grid():
    from sinkwindow.cli import build_parser

    args = build_parser().parse_args(
        ["bench", "--quick", "--contexts", "1K,64k", "--methods", "full,swa:64:4"]
    )
    config = config_from_args(args)
    assert config.contexts == (1024, 65536) and config.methods == ("full", "swa:64:4")
    assert config.steps == 16  # from the quick grid
    assert parse_contexts("none") == () and parse_contexts("256K") == (262144,)
    with pytest.raises(Exception, match="bad context"):
        parse_contexts("12x")
