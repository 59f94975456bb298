"""The benchmark's peers (``sinkwindow.bench.peers``): names, and runners that compute what they claim.

``peer:static-full`` is full attention in transformers' ``StaticCache``: its decode steps must give
``FullRunner``'s logits (same attention, another cache). ``peer:mistral-sw:W`` is transformers' own
sliding window on the same weights: it must give ``swa:W:0``'s logits exactly, one-shot and
decoding, or the ratio of their times compares different work.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import VOCAB, tiny_model
from sinkwindow.bench import BenchConfig, MethodUnavailable, SyntheticConfig, build_synthetic, runner_for
from sinkwindow.bench.cli import config_from_args
from sinkwindow.bench.decode import random_ids
from sinkwindow.bench.peers import is_peer, method_name, parse_peer, peer_window
from sinkwindow.bench.report import markdown_report
from sinkwindow.bench.rows import validate_row
from sinkwindow.bench.suite import run_bench
from sinkwindow.bench.targets import check_targets
from sinkwindow.runtime.cache import cache_nbytes


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def _decode(runner, logits, cache, steps=3):
    """Greedy steps through ``runner``; the logits of each."""
    out = []
    token = logits.argmax(-1, keepdim=True)
    for _ in range(steps):
        step = runner.step(token, cache)
        out.append(step)
        token = step.argmax(-1, keepdim=True)
    return out


@pytest.mark.parametrize("n", [40, 150], ids=["T40-prefill", "T150-fill"])
def test_static_full_decode_equals_full_runner(llama, n):
    # n <= 64 seeds: a real prefill; above: the seed's keys tiled in place, as FullRunner tiles them.
    ids = random_ids(VOCAB, n, seed=2)
    with torch.no_grad():
        with runner_for(llama, "full") as full:
            logits_d, dynamic = full.fill(ids, chunk_size=16)
            steps_d = _decode(full, logits_d, dynamic)
        with runner_for(llama, "peer:static-full:eager", headroom=5) as static:
            logits_s, cache = static.fill(ids, chunk_size=16)
            assert int(cache.get_seq_length()) == n
            assert cache.layers[0].keys.shape[-2] == n + 5  # preallocated: context + headroom
            steps_s = _decode(static, logits_s, cache)
            assert int(cache.get_seq_length()) == n + 3
    torch.testing.assert_close(logits_s, logits_d, rtol=1e-5, atol=1e-5)
    for a, b in zip(steps_s, steps_d):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert cache_nbytes(cache) >= static.analytic_bytes(n)


def test_static_full_names_its_compile_setting(llama):
    assert runner_for(llama, "peer:static-full").name == "peer:static-full:eager"  # CPU: eager by default
    compiled = runner_for(llama, "peer:static-full:compiled")
    assert compiled.name == "peer:static-full:compiled" and compiled.row_fields()["compile"] is True
    assert compiled.bounded is False and compiled.peer == "static-full"


def test_mistral_peer_gives_swa_w0_logits_exactly(llama):
    w = 16
    ids = random_ids(VOCAB, 70, seed=4)
    peer = runner_for(llama, f"peer:mistral-sw:{w}")
    assert type(peer.model).__name__ == "MistralForCausalLM" and peer.model.config.sliding_window == w
    shared = peer.model.model.embed_tokens.weight.data_ptr() == llama.model.embed_tokens.weight.data_ptr()
    assert shared  # the weights are shared, not copied
    with torch.no_grad():
        native = peer.model(ids).logits  # one shot, no cache object given
        with runner_for(llama, f"swa:{w}:0") as ours:
            mine = llama(ids).logits
            # Chunked prefill through each cache (ours bounded, the stock sliding-window one), then decode.
            logits_o, cache_o = ours.prefill(ids, chunk_size=8)
            steps_o = _decode(ours, logits_o, cache_o, steps=4)
        with peer:
            logits_p, cache_p = peer.prefill(ids, chunk_size=8)
            steps_p = _decode(peer, logits_p, cache_p, steps=4)
    # Same masks over the same keys in the same order through the same SDPA: equal bit for bit.
    assert torch.equal(native, mine)
    assert torch.equal(logits_p, logits_o)
    for a, b in zip(steps_p, steps_o):
        assert torch.equal(a, b)
    assert type(cache_p.layers[0]).__name__ == "DynamicSlidingWindowLayer"


def test_mistral_peer_fill_equals_real_prefill_in_a_one_layer_model():
    # As for WindowRunner: layer 0's keys depend only on token and position, so the fill is exact.
    model = build_synthetic(SyntheticConfig(layers=1, hidden=32, heads=4, kv_heads=2, vocab=61))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0)
    n, w = 150, 16
    ids = random_ids(61, n, seed=5)
    with torch.no_grad(), runner_for(model, f"peer:mistral-sw:{w}") as peer:
        logits_real, real = peer.prefill(ids, chunk_size=8)
        logits_fast, fast = peer.fill(ids, chunk_size=8)
        assert fast.get_seq_length() == real.get_seq_length() == n
        assert fast.layers[0].keys.shape == real.layers[0].keys.shape  # the last W - 1 keys
        torch.testing.assert_close(logits_fast, logits_real, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fast.layers[0].keys, real.layers[0].keys)
        token = logits_real.argmax(-1, keepdim=True)
        torch.testing.assert_close(peer.step(token, fast), peer.step(token, real), rtol=1e-5, atol=1e-5)


def test_mistral_peer_refuses_other_families():
    with pytest.raises(MethodUnavailable, match="Llama-family"):
        runner_for(tiny_model("qwen2"), "peer:mistral-sw:16")


def test_peer_names_parse_and_refuse():
    assert parse_peer("peer:static-full") == "peer:static-full"
    assert parse_peer(" PEER:static-full:Eager ") == "peer:static-full:eager"
    assert (
        parse_peer("peer:mistral-sw:064") == "peer:mistral-sw:64" and peer_window("peer:mistral-sw:64") == 64
    )
    assert method_name("swa:64") == "swa:64:4" and method_name("peer:mistral-sw:8") == "peer:mistral-sw:8"
    assert is_peer("peer:nope") and not is_peer("swa:64:4")
    for bad in ("peer:nope", "peer:mistral-sw", "peer:mistral-sw:1", "peer:static-full:fast"):
        with pytest.raises(ValueError):
            parse_peer(bad)


def test_cli_takes_peers_in_the_methods_list():
    from sinkwindow.cli import build_parser

    args = build_parser().parse_args(
        ["bench", "--methods", "swa:64:0,peer:mistral-sw:64", "--methods", "PEER:static-full"]
    )
    config = config_from_args(args)
    assert config.methods == ("swa:64:0", "peer:mistral-sw:64", "peer:static-full")
    assert config.threads is None  # chosen when the run starts (sinkwindow.runtime.threads)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--methods", "swa:64:0,peer:mistral-sw:x"])


def test_run_bench_measures_peers_beside_the_methods(tmp_path):
    tiny = SyntheticConfig(layers=2, hidden=48, heads=6, kv_heads=2, vocab=101, max_positions=4096)
    config = BenchConfig(
        models=("synthetic",),
        methods=("full", "peer:static-full", "swa:16:0", "peer:mistral-sw:16"),
        contexts=(40, 2048),
        prefill_contexts=(),
        steps=2,
        warmup=1,
        chunk_size=8,
        synthetic=tiny,
        bandwidth_mib=0,
        out=str(tmp_path),
        plots=False,
    )
    rows = run_bench(config)
    for row in rows:
        validate_row(row)
    cells = {(r["kind"], r["method"], r["context"]): r for r in rows}
    static = cells[("decode", "peer:static-full:eager", 2048)]
    assert static["status"] == "ok" and static["compile"] is False and static["peer"] == "static-full"
    assert static["kv_entries_per_layer"] == 2048 + 3  # room for warm-up + timed steps
    native = cells[("decode", "peer:mistral-sw:16", 2048)]
    assert native["status"] == "ok" and native["kv_entries_per_layer"] == 15
    paired = cells[("paired", "swa:16:0", 2048)]  # alternating steps against the peer at equal W
    assert paired["baseline"] == "peer:mistral-sw:16" and paired["baseline_peer"] == "mistral-sw"
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["threads"]["threads"] == torch.get_num_threads()
    assert all(r["threads_reason"] == meta["threads"]["reason"] for r in rows)
    targets = {t["name"]: t for t in check_targets(rows)}
    assert set(targets["swa_vs_native_sliding"]["value"]) == {"synthetic@40 w16", "synthetic@2048 w16"}
    assert targets["swa_vs_native_sliding"]["ok"] is not None
    md = markdown_report(rows, list(targets.values()))
    assert "### Peers" in md and "| swa:16:0 | peer:mistral-sw:16 | 2K |" in md
    assert "| full | peer:static-full:eager | 2K |" in md


def _row(method, context, ms, kind="decode", **extra):
    return {
        "kind": kind, "model": "m", "method": method, "context": context, "status": "ok", "reason": None,
        "ms_per_token": ms, "ms_per_token_min": ms, "tokens_per_s": 1e3 / ms, "kv_bytes": 1, "prefill_s": None,
        "peak_rss_bytes": 1, **extra,
    }  # fmt: skip


def test_native_sliding_target_reads_ratios_at_equal_w():
    def target(rows):
        return {t["name"]: t for t in check_targets(rows)}["swa_vs_native_sliding"]

    rows = [_row("swa:64:0", 1024, 9.0), _row("peer:mistral-sw:64", 1024, 10.0), _row("swa:64:4", 1024, 9.5)]
    got = target(rows)
    assert got["ok"] is True and got["value"] == {"m@1024 w64": 0.9}
    slower = target([_row("swa:64:0", 1024, 11.0), _row("peer:mistral-sw:64", 1024, 10.0)])
    assert slower["ok"] is False
    other_w = target([_row("swa:128:0", 1024, 9.0), _row("peer:mistral-sw:64", 1024, 10.0)])
    assert other_w["ok"] is None and "not measured" in other_w["detail"]
    paired = _row(
        "swa:64:0", 2048, 10.2, kind="paired", baseline="peer:mistral-sw:64",
        ms_per_token_baseline=10.0, ms_per_token_baseline_min=10.0,
    )  # fmt: skip
    got = target([*rows, paired])
    assert got["value"] == {"m@2048 w64": 1.02, "m@1024 w64": 0.9} and got["ok"] is False
    assert "alternating" in got["detail"]
