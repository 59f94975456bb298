"""Where the needle was: the window split of S-NIAH scores, and the training-length marks."""

from __future__ import annotations

import pytest

from sinkwindow.eval.summary import summarize
from sinkwindow.eval.tables import markdown_report
from sinkwindow.eval.window_split import method_window, needle_in_window, window_split
from sinkwindow.runtime.spec import parse_spec


def test_needle_in_window_boundaries():
    # SWA(8, 2) over a 20-token prompt: the sinks 0-1 and the last 6 positions, 14-19.
    assert needle_in_window(14, 16, 20, (8, 2)) and not needle_in_window(13, 16, 20, (8, 2))
    assert needle_in_window(0, 2, 20, (8, 2)) and not needle_in_window(1, 3, 20, (8, 2))
    assert method_window(parse_spec("lolcats:256")) == (256, 0)
    assert method_window(parse_spec("swa:256:4")) == (256, 4)
    assert method_window(parse_spec("full")) is None and method_window(parse_spec("swa:8:2+full:1")) is None


def _row(method, index, start, score, n=100, task="niah_single_1", length=512):
    return dict(model="m", task=task, method=method, length=length, seed=0, index=index, score=score,
                n_prompt_tokens=n, needle_tokens=[start, start + 3], depth=50.0)  # fmt: skip


def test_split_counts_each_methods_window_and_full_by_swas():
    # n = 100: SWA(16, 4) sees positions 0-3 and 88-99; lolcats:16 sees 84-99.
    starts = [90, 85, 40, 1]
    rows = []
    for i, st in enumerate(starts):
        rows += [_row("full", i, st, 100.0), _row("swa:16:4", i, st, 100.0 if st in (90, 1) else 0.0),
                 _row("lolcats:16", i, st, 100.0 if st >= 84 else 0.0)]  # fmt: skip
    split = window_split(rows)["niah_single_1"]
    swa, lol, full = split["swa:16:4"][512], split["lolcats:16"][512], split["full"][512]
    assert (swa["inside"], swa["beyond"]) == ({"n": 2, "found": 2}, {"n": 2, "found": 0})
    assert (lol["inside"], lol["beyond"]) == ({"n": 2, "found": 2}, {"n": 2, "found": 0})
    assert full["by"] == "swa:16:4" and full["beyond"] == {"n": 2, "found": 2}
    assert swa["expected_share"] == pytest.approx(0.16)


def test_rows_without_positions_take_them_from_needles_jsonl():
    row = _row("swa:16:4", 0, 90, 100.0)
    del row["needle_tokens"]
    assert window_split([row]) == {}
    key = ("m", "niah_single_1", 512, 0, 0)
    split = window_split([row], {key: {"needle_tokens": [90, 93], "n_prompt_tokens": 100}})
    assert split["niah_single_1"]["swa:16:4"][512]["inside"] == {"n": 1, "found": 1}


def test_report_marks_cells_past_a_baselines_training_length():
    rows = [
        _row(m, i, 90, 100.0, length=L) for m in ("full", "lolcats:16") for L in (512, 2048) for i in range(3)
    ]
    md = markdown_report(summarize(rows, trained={"lolcats:16": 1024}), {"model": "m"}, [])
    assert "† past the sequence length the method's adapter was trained on (tokens: lolcats:16 1,024)" in md
    lol = next(line for line in md.splitlines() if line.startswith("| lolcats:16 |") and "†" in line)
    assert lol.count("†") == 1  # 2K only, not 0.5K
    assert "## Where the needle was" in md and "in 3/3 · beyond 0/0" in md


def test_report_names_what_each_trained_method_is_from_its_adapters_provenance():
    from sinkwindow.eval.report import adapter_facts
    from sinkwindow.linear.adapters import read_provenance, shipped_adapter

    rows = [_row(m, 0, 90, 100.0) | {"model": "smollm2-135m"} for m in ("full", "swa:16:4", "lolcats:256")]
    lengths, labels = adapter_facts(rows, {})
    prov = read_provenance(shipped_adapter("smollm2-135m", "lolcats:256"))
    assert lengths == {"lolcats:256": prov["train_config"]["seq_len"]}
    assert labels == {"lolcats:256": prov["label"]} and "paper's recipe" in labels["lolcats:256"]
    md = markdown_report(summarize(rows, labels=labels), {"model": "smollm2-135m"}, [])
    assert f"`lolcats:256` ({prov['label']})" in md and "`swa:16:4`," in md
