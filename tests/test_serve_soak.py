"""A short soak of ``sinkwindow serve`` through benchmarks/serve_soak.py (the harness the full-size
benchmark runs), in a subprocess on 127.0.0.1: sessions churning through eviction, bursts of 16
streams half of which drop their connection, a long conversation, long prompts and bad requests,
for about 20 seconds.

The model is random but not the smallest: 4 layers with 2 KV heads of 64 under ``swa:512:4``, so a
session's cache is about 2 MiB and a 16-row decode batch's tensors are megabytes: before the block
pool (issue 60) this server's RSS grew 413 -> 989 MiB in such a soak, past the margin.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

pytest.importorskip("starlette", reason="pip install 'sinkwindow[serve]'")
pytest.importorskip("uvicorn", reason="pip install 'sinkwindow[serve]'")
pytest.importorskip("psutil", reason="the soak samples the server's RSS with psutil")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "serve_soak.py"
TIMEOUT = 30.0


def _script():
    spec = importlib.util.spec_from_file_location("serve_soak", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["serve_soak"] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def soaked(tmp_path_factory):
    from conftest import make_tiny_folder

    mod = _script()
    folder = make_tiny_folder(tmp_path_factory.mktemp("soak"))  # its tokenizer (ids 1-100)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=101, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, pad_token_id=0)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    cfg = mod.SoakConfig(
        model=str(folder), served_name="tiny", method="swa:512:4", vocab=101, requests=20_000,
        duration_s=20.0, warmup_s=7.0, sessions=40, max_sessions=8, workers=4, burst=16, burst_every_s=5.0,
        prompt_tokens=12, long_prompt_tokens=600, max_tokens=4, burst_max_tokens=12, request_timeout_s=TIMEOUT,
        max_rss_mib=4096.0,
    )  # fmt: skip
    out = tmp_path_factory.mktemp("soak-out")
    summary, samples = mod.soak(cfg, out)
    return mod, cfg, summary, samples, out


def test_every_request_ends_and_the_server_answers_after_the_faults(soaked):
    mod, cfg, s, _, _ = soaked
    reqs = [json.loads(x) for x in (soaked[4] / "requests.jsonl").read_text().splitlines()]
    assert len(reqs) == s["requests"] > 100
    assert s["hung"] == 0 and s["broken_connections"] == 0
    finished = [r for r in reqs if not r["dropped"] and r["status"] == 200]
    assert finished and max(r["latency_s"] for r in finished) < TIMEOUT
    assert s["wall_s"] < cfg.duration_s + 2 * TIMEOUT  # the drive is bounded
    assert s["answers_after"] and s["health_end"]["status"] == "ok"
    # Every fault the soak promises did happen.
    assert s["by_kind"]["burst_drop"] >= 8 and s["dropped"] >= 1
    assert s["by_kind"]["long_prompt"] >= 1 and s["by_kind"]["bad"] >= 4
    assert s["evictions_reported"] > 0  # 40 ids through 8 kept sessions
    assert s["long_session_turns"] >= 2


def test_errors_are_the_expected_4xx_only(soaked):
    mod, _, s, _, _ = soaked
    assert s["server_errors_5xx"] == 0 and s["bad_not_4xx"] == 0 and s["good_refused_unexpectedly"] == 0
    assert set(s["statuses"]) <= {"200", "400", "404", "409", "429"}, s["statuses"]
    assert s["faults_ok"]


def test_health_was_sampled_and_the_files_written(soaked):
    _, cfg, s, samples, out = soaked
    assert len(samples) >= cfg.duration_s / cfg.sample_s / 2
    assert all(x["rss"] > 0 and x["health_status"] == 200 for x in samples)
    assert any("health.sessions" in x for x in samples)
    for name in ("samples.jsonl", "requests.jsonl", "summary.json", "rss.png"):
        assert (out / name).stat().st_size > 0


def test_rss_after_the_warm_up_stays_within_the_margin(soaked):
    _, cfg, s, _, _ = soaked
    assert s["rss_warmup_peak"] > 0 and s["rss_limit"] >= s["rss_warmup_peak"] + 64 * 2**20
    assert s["rss_ok"], (s["rss_after_peak"], s["rss_limit"], s["rss_slope_mib_per_min"])


def test_the_rss_verdict_fails_growth_past_the_margin_and_passes_a_flat_line():
    mod = _script()
    cfg = mod.SoakConfig(warmup_s=10.0)
    mib = 2**20
    flat = [{"t": t, "rss": (500 + (t % 3)) * mib} for t in range(60)]
    grows = [{"t": t, "rss": (500 + 2 * t) * mib} for t in range(60)]  # 120 MiB a minute
    assert mod.rss_verdict(flat, cfg)["rss_ok"]
    v = mod.rss_verdict(grows, cfg)
    assert not v["rss_ok"] and v["rss_limit"] == (520 + 64) * mib and v["rss_after_peak"] == 618 * mib
    assert v["rss_slope_mib_per_min"] == pytest.approx(120.0)
    big = [{"t": t, "rss": 2000 * mib + (t > 10) * 150 * mib} for t in range(60)]  # 10 % of 2000 MiB > 64 MiB
    assert mod.rss_verdict(big, cfg)["rss_ok"]
