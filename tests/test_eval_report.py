"""The report's intervals, paired comparisons and plots, on small synthetic results lists."""

from __future__ import annotations

import json
import math

import pytest

from sinkwindow.eval.plots import accuracy_figure, accuracy_series
from sinkwindow.eval.report import write_report
from sinkwindow.eval.results import ResultsStore
from sinkwindow.eval.summary import summarize
from sinkwindow.eval.tables import markdown_report

pytest.importorskip("sinkwindow.eval.generators.haystack")


def niah(method: str, length: int, scores: list[int], task: str = "niah_single_3") -> list[dict]:
    """One row per sample; ``scores`` are 0/1, stored as 0/100 like the runner does."""
    return [
        dict(model="m", task=task, method=method, length=length, seed=0, index=i, score=100.0 * s, depth=50.0)
        for i, s in enumerate(scores)
    ]


def ppl_rows(method: str, nats: list[float], n: int = 100) -> list[dict]:
    return [
        dict(
            model="m",
            task="ppl",
            method=method,
            length=n + 1,
            seed=0,
            index=i,
            nll_sum=n * x,
            n_tokens=n,
            bucket_size=n,
            bucket_nll_sum=[n * x],
            bucket_count=[n],
            score=math.exp(x),
        )
        for i, x in enumerate(nats)
    ]


@pytest.fixture
def rows() -> list[dict]:
    """full, swa:256:4 and lolcats:256 at 1K and 2K; lolcats scores 0 at 2K."""
    r = []
    r += niah("full", 1024, [1] * 10) + niah("full", 2048, [1] * 9 + [0])
    # At 1K both fixed-memory methods find the same 5 needles: a zero difference.
    r += niah("swa:256:4", 1024, [1] * 5 + [0] * 5) + niah("swa:256:4", 2048, [1] * 10)
    r += niah("lolcats:256", 1024, [1] * 5 + [0] * 5) + niah("lolcats:256", 2048, [0] * 10)
    r += ppl_rows("full", [2.0, 2.0]) + ppl_rows("swa:256:4", [3.0, 1.0])
    return r


def test_accuracy_cells_carry_wilson_intervals_and_n(rows):
    s = summarize(rows)
    cell = s["accuracy"]["niah_single_3"]["swa:256:4"][1024]
    # Wilson 5/10 by hand: centre 0.5, half 1.96/1.38416 · sqrt(0.025 + 0.009604) = 0.26341.
    assert (cell["mean"], cell["n"], cell["ci"]) == (50.0, 10, "wilson")
    assert cell["lo"] == pytest.approx(23.659, abs=1e-3) and cell["hi"] == pytest.approx(76.341, abs=1e-3)
    full = s["accuracy"]["niah_single_3"]["full"][1024]
    assert full["hi"] == 100.0 and full["lo"] == pytest.approx(72.246, abs=1e-3)


def test_babilong_average_at_one_length_is_wilson_pooled_or_a_stratified_bootstrap():
    def rows(scores: dict) -> list[dict]:
        return [
            dict(model="m", task=t, method="full", length=0, seed=0, index=i, score=100.0 * v)
            for t, values in scores.items()
            for i, v in enumerate(values)
        ]

    # Equal n per task: the pooled count, 3 of 6 (a bootstrap within two constant tasks would give
    # the zero-width [50, 50]).
    cell = summarize(rows({"babilong_qa1": [1, 1, 1], "babilong_qa2": [0, 0, 0]}))["accuracy"]["babilong"][
        "full"
    ][0]
    assert (cell["mean"], cell["n"], cell["ci"]) == (50.0, 6, "wilson")
    assert cell["lo"] == pytest.approx(18.76, abs=0.01) and cell["hi"] == pytest.approx(81.24, abs=0.01)
    # Unequal n: the stratified bootstrap, each task weighing the same (mean of 2/3 and 1/2).
    cell = summarize(rows({"babilong_qa1": [1, 0, 1], "babilong_qa2": [0, 1]}))["accuracy"]["babilong"][
        "full"
    ][0]
    assert (cell["mean"], cell["n"], cell["ci"]) == (pytest.approx(100 * (2 / 3 + 1 / 2) / 2), 5, "bootstrap")
    assert cell["lo"] < cell["mean"] < cell["hi"]


def test_recovery_and_the_paper_ratio_are_paired(rows):
    s = summarize(rows)
    rec = s["recovery"]["niah_single_3"]["swa:256:4"]
    # swa ÷ full at 2K: 100 / 90; a method equal to itself would be exactly 1.
    assert rec[2048]["estimate"] == pytest.approx(100 * 10 / 9) and rec[2048]["n"] == 10
    assert rec["avg"]["estimate"] == pytest.approx(100 * 0.75 / 0.95)
    ratio = s["swa_vs_lolcats"]["swa:256:4 / lolcats:256"]["niah_single_3"]
    # Same samples, same scores at 1K: exactly 1 with zero width.
    assert (ratio[1024]["estimate"], ratio[1024]["lo"], ratio[1024]["hi"]) == (1.0, 1.0, 1.0)
    assert ratio[2048]["flag"] == "zero_denominator" and ratio[2048]["estimate"] == math.inf


def test_pairing_uses_only_samples_both_methods_ran():
    r = niah("full", 1024, [1, 1, 1, 1]) + niah("swa:256:4", 1024, [1, 0, 0, 0, 0, 0])
    rec = summarize(r)["recovery"]["niah_single_3"]["swa:256:4"][1024]
    # Indices 4 and 5 have no full-attention twin: 1 of 4 paired samples, 25%.
    assert rec["n"] == 4 and rec["estimate"] == pytest.approx(25.0)


def test_differences_larger_than_noise_are_said_in_words(rows):
    s = summarize(rows)
    d = {(x["a"], x["b"], x["length"]): x for x in s["differences"]}
    d2k, d1k = d[("swa:256:4", "lolcats:256", 2048)], d[("swa:256:4", "lolcats:256", 1024)]
    assert d2k["beyond_noise"] and (d2k["estimate"], d2k["lo"], d2k["hi"]) == (100.0, 100.0, 100.0)
    assert not d1k["beyond_noise"] and d1k["estimate"] == 0.0
    # The decision is the exact test's: 10 of 10 pairs discordant one way, p = 2 / 2**10.
    assert d2k["p"] == pytest.approx(2 * 0.5**10) and d2k["test"] == "exact sign test"
    assert d1k["p"] == 1.0 and d1k["mdd"] == pytest.approx(60.0)  # 6 of 10 pairs one way at least
    md = markdown_report(s, {"model": "m"}, [])
    # A zero-width bootstrap from 10 pairs is not printed as an interval.
    assert (
        "at 2K swa:256:4 beats lolcats:256: 100.0 vs 0.0, difference +100.0 [n too small], n=10, "
        f"p=0.002 [Holm {d2k['p_holm']:.2g}]; the difference at 1K (p=1 [Holm 1], mdd 60.0) is within noise."
    ) in md
    assert "[100.0, 100.0]" not in md


def test_the_header_names_every_method_the_rows_hold_and_what_the_last_run_asked(rows):
    """A folder built up in stages: the last run asked for one method, the rows hold three."""
    s = summarize(rows)
    md = markdown_report(s, {"model": "m", "methods": ["lolcats:256"], "samples": 10}, [])
    assert "Methods: `full`, `swa:256:4`, `lolcats:256`." in md
    assert "the last run asked for `lolcats:256` at 10 samples per task and length" in md
    same = markdown_report(
        s, {"model": "m", "methods": ["full", "swa:256:4", "lolcats:256"], "samples": 10}, []
    )
    assert "the last run asked for 10 samples per task and length" in same


def test_six_pairs_can_be_decided_five_cannot():
    """The exact sign test reaches 5% only from 6 one-way pairs on (2 / 2**6 = 0.031)."""
    six = markdown_report(summarize(niah("full", 1024, [1] * 6) + niah("swa:256:4", 1024, [0] * 6)), {}, [])
    assert "swa:256:4 trails full: 0.0 vs 100.0" in six and "p=0.031" in six
    five = markdown_report(summarize(niah("full", 1024, [1] * 5) + niah("swa:256:4", 1024, [0] * 5)), {}, [])
    assert "trails" not in five and "too few samples to tell at 1K (n=5)" in five


def test_no_difference_is_called_on_too_few_pairs():
    # Two pairs: a bootstrap interval of zero width, which must not read as "beyond noise".
    r = niah("full", 1024, [1, 1]) + niah("swa:256:4", 1024, [0, 0])
    s = summarize(r)
    assert not any(d["beyond_noise"] for d in s["differences"]) and all(
        d["too_few"] for d in s["differences"]
    )
    md = markdown_report(s, {}, [])
    assert "too few samples to tell at 1K (n=2)" in md and "trails full" not in md


def test_averages_of_single_samples_keep_a_real_interval():
    # One sample per length: the pooled Wilson interval, not a zero-width bootstrap.
    r = niah("swa:256:4", 1024, [1]) + niah("swa:256:4", 2048, [0]) + niah("swa:256:4", 4096, [0])
    avg = summarize(r)["accuracy_avg"]["niah_single_3"]["swa:256:4"]
    assert avg["mean"] == pytest.approx(100 / 3) and avg["lo"] < 10 and avg["hi"] > 75


def test_an_all_zero_average_over_unequal_cells_keeps_a_real_interval():
    # 30 and 10 samples, all wrong (a staged run mid-way): no zero-width bootstrap; Wilson on the
    # equal-weight mean's effective size, n_eff = 2² / (1/30 + 1/10) = 30: upper bound 1.96² / (30 + 1.96²).
    r = niah("liger:256", 512, [0] * 30) + niah("liger:256", 1024, [0] * 10)
    avg = summarize(r)["accuracy_avg"]["niah_single_3"]["liger:256"]
    assert (avg["mean"], avg["lo"], avg["n"]) == (0.0, 0.0, 40)
    assert avg["hi"] == pytest.approx(100 * 1.96**2 / (30 + 1.96**2))
    # All right: the mirror image. Equal sizes: still the pooled Wilson (n_eff = the pooled n).
    full = summarize(niah("full", 512, [1] * 30) + niah("full", 1024, [1] * 10))["accuracy_avg"][
        "niah_single_3"
    ]
    assert full["full"]["hi"] == 100.0 and full["full"]["lo"] == pytest.approx(100 * 30 / (30 + 1.96**2))
    same = summarize(niah("full", 512, [0] * 10) + niah("full", 1024, [0] * 10))["accuracy_avg"][
        "niah_single_3"
    ]
    assert same["full"]["hi"] == pytest.approx(100 * 1.96**2 / (20 + 1.96**2))


def test_markdown_tables_show_intervals(rows):
    md = markdown_report(summarize(rows), {"model": "m"}, [])
    assert "| swa:256:4 | 50.0 [23.7, 76.3] <sub>n=10</sub> | 100.0 [72.2, 100.0] <sub>n=10</sub> |" in md
    # The paper's ratio per length: 1.00× with zero width at 1K, and lolcats at 0 at 2K.
    assert "| S-NIAH-3 | 1.00× [n too small] <sub>n=10</sub> | ∞ (÷0) <sub>n=10</sub> |" in md
    assert "S-NIAH-3, paper (Llama-3.1-8B) | 2.22× | 8.37× |" in md
    assert "Recovery vs full by length" in md
    # Perplexity: windows at 3 and 1 nats/token give exp(2), replicates exp(1) .. exp(3).
    assert f"| swa:256:4 | {math.exp(2):.2f} [{math.exp(1):.2f}, {math.exp(3):.2f}]" in md


def test_no_paper_ratio_without_a_same_window_lolcats(rows):
    r = [x for x in rows if x["method"] != "lolcats:256"] + niah("lolcats:64", 1024, [0] * 10)
    s = summarize(r)
    assert s["swa_vs_lolcats"] == {}
    assert "SWA ÷ LoLCATs" not in markdown_report(s, {}, [])


def test_summary_json_has_the_intervals_and_is_strict_json(rows, tmp_path):
    store = ResultsStore(tmp_path, {"model": "m", "methods": ["full", "swa:256:4", "lolcats:256"], "seed": 0})
    store.extend(rows)
    write_report(tmp_path)

    def no_nan(name):
        raise AssertionError(f"summary.json holds {name}")

    j = json.loads((tmp_path / "summary.json").read_text(), parse_constant=no_nan)
    cell = j["accuracy"]["niah_single_3"]["swa:256:4"]["1024"]
    assert cell["lo"] == pytest.approx(23.659, abs=1e-3) and cell["n"] == 10
    zero = j["swa_vs_lolcats"]["swa:256:4 / lolcats:256"]["niah_single_3"]["2048"]
    assert zero["estimate"] is None and zero["flag"] == "zero_denominator"
    assert j["ppl"]["swa:256:4"]["101"]["hi"] == pytest.approx(math.exp(3))
    assert any(d["beyond_noise"] for d in j["differences"])
    md = (tmp_path / "report.md").read_text()
    assert "[23.7, 76.3]" in md and "](accuracy_vs_context.png)" in md
    assert (tmp_path / "accuracy_vs_context.png").stat().st_size > 1000


def test_summary_is_deterministic(rows):
    assert json.dumps(summarize(rows), default=str) == json.dumps(summarize(rows), default=str)


def test_accuracy_plot_has_error_bars_and_a_legend_on_every_panel(rows):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    r = (
        rows
        + niah("full", 1024, [1, 0], task="niah_single_1")
        + niah("swa:256:4", 1024, [1, 1], "niah_single_1")
    )
    s = summarize(r)
    series = accuracy_series(s, "niah_single_3")
    assert series["swa:256:4"]["lo"] == [pytest.approx(23.659, abs=1e-3), pytest.approx(72.246, abs=1e-3)]
    assert series["lolcats:256"]["hi"][1] == pytest.approx(27.754, abs=1e-3)
    fams = ["niah_single_1", "niah_single_3"]
    fig = accuracy_figure(s, fams)
    try:
        assert len(fig.axes) == len(fams)
        for ax, fam in zip(fig.axes, fams):
            bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
            assert len(bars) == len(s["accuracy"][fam]) and all(c.has_yerr for c in bars)
            assert [t.get_text() for t in ax.get_legend().get_texts()] == list(s["accuracy"][fam])
            # ... and the legend covers none of the data: it sits below the panel.
            fig.canvas.draw()
            legend = ax.get_legend().get_window_extent()
            assert legend.y1 < ax.get_window_extent().y0
        # Methods are offset sideways so that equal scores do not hide each other.
        bars = [c for c in fig.axes[1].containers if isinstance(c, ErrorbarContainer)]
        assert len({tuple(c.lines[0].get_xdata()) for c in bars}) == 3
    finally:
        plt.close(fig)


def test_hybrid_section_gives_niah_average_recovery_and_kv_share():
    """Hybrids are compared with full (recovery, KV share) and with the plain SWA they extend."""
    hyb, base = "swa:256:4+full:3,11", "swa:256:4"
    rows = []
    kv = {"full": 4000, base: 1000, hyb: 1600}
    scores = {"full": [1] * 10, base: [0] * 10, hyb: [1] * 8 + [0] * 2}
    for task in ("niah_single_1", "niah_single_2", "niah_single_3"):
        for m, sc in scores.items():
            for r in niah(m, 4096, sc, task=task):
                rows.append({**r, "kv_bytes": kv[m]})
    s = summarize(rows)
    cell = s["hybrid"][4096]
    assert set(cell) == {"full", base, hyb}
    assert cell[hyb]["units"] == 2 and cell[hyb]["kv_share"] == pytest.approx(0.4)
    assert cell[hyb]["avg"]["mean"] == pytest.approx(80.0) and cell[hyb]["avg"]["n"] == 30
    assert cell[hyb]["recovery"]["estimate"] == pytest.approx(80.0)
    assert cell[hyb]["recovery"]["lo"] < 80.0 < cell[hyb]["recovery"]["hi"]
    # Compared with its own SWA, and that difference is beyond the noise.
    d = [x for x in s["differences"] if x["a"] == hyb and x["b"] == base and x["family"] == "niah_single_1"]
    assert d and d[0]["beyond_noise"] and d[0]["estimate"] == pytest.approx(80.0)
    md = markdown_report(s, {"model": "m"}, [])
    assert "## Hybrid specs" in md and f"| `{hyb}` | 2 | " in md and "40.0%" in md
    # A method that ran fewer tasks says so beside its average.
    part = summarize(
        rows + [{**r, "method": "swa:256:4+full:5"} for r in niah("swa:256:4+full:5", 4096, [1] * 10)]
    )
    assert "(1 of 3 tasks)" in markdown_report(part, {"model": "m"}, [])
    # A run without hybrids has no such section.
    plain = summarize([r for r in rows if r["method"] != hyb])
    assert plain["hybrid"] == {} and "## Hybrid specs" not in markdown_report(plain, {}, [])


def test_lcc_edit_similarity_gets_a_column_a_section_and_a_bootstrap_interval():
    # Graded 0-100 scores: Wilson's interval is for 0/1 counts, so one LCC cell takes the bootstrap.
    sims = {"full": [100, 80, 64, 90, 100, 72], "swa:256:4": [40, 55, 100, 30, 61, 20]}
    r = [
        dict(model="m", task="lcc", method=m, length=1024, seed=0, index=i, score=float(v), exact_match=0)
        for m, vs in sims.items()
        for i, v in enumerate(vs)
    ]
    s = summarize(r + niah("full", 1024, [1, 0]) + niah("swa:256:4", 1024, [0, 0]))
    cell = s["accuracy"]["lcc"]["full"][1024]
    assert cell["ci"] == "bootstrap" and cell["n"] == 6
    assert (
        cell["mean"] == pytest.approx(sum(sims["full"]) / 6) and cell["lo"] < cell["mean"] < cell["hi"] <= 100
    )
    assert s["accuracy"]["niah_single_3"]["full"][1024]["ci"] == "wilson"  # 0/1 cells keep Wilson
    md = markdown_report(s, {"model": "m"}, [])
    assert "## LCC (next-line code completion" in md and "edit similarity to the true next line" in md
    header = next(line for line in md.split("## Summary")[1].splitlines() if line.startswith("| method"))
    assert header.endswith("| LCC |")
    assert "edit similarity" not in markdown_report(summarize(niah("full", 1024, [1, 0])), {"model": "m"}, [])


def _write_run(folder, rows):
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def _sections(md: str) -> list[str]:
    return [line for line in md.splitlines() if line.startswith("## ")]


@pytest.fixture
def reference_rows() -> list[dict]:
    """30 samples a cell: swa:256:4 finds 25 needles, lolcats:256 5 of the same (an exact test decides),
    liger:256 24 (within noise)."""
    r = niah("full", 1024, [1] * 30) + niah("swa:256:4", 1024, [1] * 25 + [0] * 5)
    r += niah("lolcats:256", 1024, [1] * 5 + [0] * 25) + niah("liger:256", 1024, [1] * 24 + [0] * 6)
    return r


def test_a_quick_report_opens_with_the_reference_runs_decisions(reference_rows, tmp_path):
    ref = _write_run(tmp_path / "2026-12-02-m-long", reference_rows)
    # The quick run's samples are the reference's first two per cell, with the same scores.
    quick_rows = [r for r in reference_rows if r["index"] < 2]
    quick = _write_run(tmp_path / "quick", quick_rows)
    md = write_report(quick, reference_run=ref).read_text()
    sections = _sections(md)
    assert sections[0] == "## The answer: what the reference run 2026-12-02-m-long decides"
    assert sections[1] == "## What this run measured"
    answer = md.split(sections[0])[1].split(sections[1])[0]
    # The reference's decision (25 vs 5 of 30: +66.7) is there, and liger's difference is not one.
    assert "- against `lolcats:256`: wins 1, loses 0, no difference 0 of 1" in answer
    assert "- against `liger:256`: wins 0, loses 0, no difference 1 of 1" in answer
    assert "**+66.7 wins**" in answer and "wins** <sub>" not in answer.split("`liger:256` |")[1]
    assert "too few" not in answer.lower()
    measured = md.split(sections[1])[1]
    assert "8 of this run's 8 task samples are samples of `2026-12-02-m-long`" in measured
    assert "every one scores the same" in measured
    # The demo-size caveat comes below the answer, before this run's tables.
    caveat = md.index("**Too few samples to decide:**")
    assert md.index(sections[1]) < caveat < md.index("## Summary")
    assert "5 of this run's 5 compared (pair, task, length) cells" in md  # 2 baselines and 3 against full
    # A sample that scores differently from the reference's is named, not hidden.
    quick_rows[1] = {**quick_rows[1], "score": 100.0 - quick_rows[1]["score"]}
    (quick / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in quick_rows))
    md = write_report(quick, reference_run=ref).read_text()
    assert "and 7 of them score the same there (largest gap 100.0 points)" in md


def test_a_run_large_enough_to_decide_opens_with_its_own_decisions(reference_rows, tmp_path):
    md = write_report(_write_run(tmp_path / "long", reference_rows)).read_text()
    assert _sections(md)[:3] == [
        "## The answer: what this run decides",
        "## What this run measured",
        "## Summary",
    ]
    assert "**+66.7 wins**" in md and "Too few samples" not in md
    # The long sections are folded under their headings; every number is still on the page.
    after = md.split("## Which differences are larger than their noise")[1]
    assert after.lstrip().startswith("<details><summary>")
    assert "swa:256:4 beats lolcats:256: 83.3 vs 16.7" in after


def test_a_small_run_without_a_reference_has_no_answer_section(tmp_path):
    small = niah("full", 1024, [1, 1]) + niah("swa:256:4", 1024, [1, 0]) + niah("lolcats:256", 1024, [0, 0])
    md = write_report(_write_run(tmp_path / "small", small)).read_text()
    assert _sections(md)[0] == "## Summary"
    assert md.index("**Too few samples to decide:**") < md.index("## Summary")
    assert "a run with more samples per cell" in md
