"""Run-folder cases of the input audit (issue 34): a row counts only if the report can use it."""

from __future__ import annotations

import json
import math

import pytest

from sinkwindow.eval.report import write_report
from sinkwindow.eval.results import ResultsStore, row_problem

pytest.importorskip("sinkwindow.eval.generators.haystack")


def _niah(index: int, score=100.0, **kw) -> dict:
    return dict(model="m", task="niah_single_1", method="full", length=512, seed=0, index=index, score=score,
                depth=50.0, **kw)  # fmt: skip


def _ppl(index: int, nll=200.0, n=100, **kw) -> dict:
    return dict(model="m", task="ppl", method="full", length=101, seed=0, index=index, nll_sum=nll, n_tokens=n,
                score=math.exp(nll / n) if n else 1.0, bucket_size=n or 1, bucket_nll_sum=[nll],
                bucket_count=[n], **kw)  # fmt: skip


def _write(folder, rows) -> None:
    (folder / "results.jsonl").write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))


@pytest.mark.parametrize(
    "row, why",
    [
        (_niah(0, "abc"), "score 'abc' is not a number in [0, 100]"),
        (_niah(0, 150.0), "score 150.0 is not a number in [0, 100]"),
        (_niah(0, float("nan")), "score nan"),
        (_niah(0, True), "score True"),
        (_ppl(0, nll=-5.0), "nll_sum -5.0 is not a finite number >= 0"),
        (_ppl(0, n=0), "n_tokens 0 is not a positive whole number"),
        ({**_niah(0), "index": "3"}, "index '3' is not a whole number"),
        ({**_niah(0), "method": None}, "no method"),
    ],
)
def test_unusable_rows_are_named(row, why):
    assert why in row_problem(row)


def test_a_damaged_row_is_not_done_and_the_report_names_its_line(tmp_path):
    """``"score": "abc"`` used to count as done forever, leaving its cell at n = 1 for good."""
    _write(tmp_path, [_niah(0), _niah(1, "abc"), _niah(2, 150.0), _niah(3, 0.0)])
    store = ResultsStore(tmp_path)
    assert [r["index"] for r in store.rows()] == [0, 3]
    assert not store.has(_niah(1)) and store.has(_niah(3))  # index 1 runs again on resume
    assert [line for line, _ in store.rejected] == [2, 3]
    md = write_report(tmp_path).read_text()
    assert "2 row(s) of results.jsonl were left out of this report" in md
    assert "line 2: score 'abc' is not a number in [0, 100]" in md
    assert json.loads((tmp_path / "summary.json").read_text())["rejected_rows"] == 2


def test_a_duplicated_perplexity_row_counts_once(tmp_path):
    _write(tmp_path, [_ppl(0, 200.0), _ppl(0, 200.0), _ppl(1, 300.0)])
    store = ResultsStore(tmp_path)
    assert len(store.rows()) == 2 and store.rejected == [(2, "repeats line 1")]
    summary = json.loads((write_report(tmp_path).parent / "summary.json").read_text())
    ppl = summary["ppl"]["full"]
    (cell,) = ppl.values()
    assert cell["windows"] == 2 and cell["ppl"] == pytest.approx(math.exp(500 / 200))


def test_rows_of_other_settings_are_left_out(tmp_path):
    """A row whose fingerprint is not the one the folder's settings give its (task, method)."""
    from sinkwindow.eval.fingerprint import row_fingerprint
    from sinkwindow.runs.folder import settings_fingerprint

    settings = {"model": "sha256:ab", "seed": 0, "niah_max_new_tokens": 16}
    (tmp_path / "fingerprint.json").write_text(
        json.dumps({"fingerprint": settings_fingerprint(settings), "settings": settings})
    )
    good = row_fingerprint(settings, "niah_single_1", "full")
    _write(
        tmp_path,
        [_niah(0, fingerprint=good), _niah(1, fingerprint="0123456789ab"), _niah(2, fingerprint=good)],
    )
    store = ResultsStore(tmp_path)
    assert [r["index"] for r in store.rows()] == [0, 2]
    assert "made with other settings (fingerprint 0123456789ab" in store.rejected[0][1]


def test_a_damaged_lm_eval_value_is_left_out_not_fatal(tmp_path):
    """One lm-eval row with ``"value": "abc"`` used to stop both resume and report with
    "could not convert string to float"; now the same rule as long-context rows applies."""

    def row(method, value):
        return {"suite": "lm-eval", "model": "m", "task": "piqa", "method": method, "metric": "acc",
                "value": value, "metrics": {"acc": value}, "stderrs": {}, "n": 20, "limit": 20,
                "num_fewshot": 0, "source": "local"}  # fmt: skip

    _write(tmp_path, [row("full", 0.6), row("swa:64:4", "abc"), row("swa:64:4", 0.3)])
    store = ResultsStore(tmp_path)
    assert len(store.rows()) == 2 and store.rejected[0][0] == 2
    md = write_report(tmp_path).read_text()
    assert "Short-context tasks" in md and "50.0" in md


def _store(folder, settings, rows=()):
    store = ResultsStore(folder, {"model": "m"}, settings=settings)
    for r in rows:
        store.append(r)
    return store


def test_settings_of_a_run_that_stored_no_row_do_not_refuse_the_next(tmp_path):
    """A run that failed or was stopped before its first sample recorded its settings, and the
    correct run was then refused ("holds results made with other settings")."""
    base = {"model": "sha256:ab", "seed": 0, "niah_max_new_tokens": 16}
    _store(tmp_path, base, [_niah(0)])
    # A run with a bad checkpoint for a method with no rows here, stopped before any row.
    bad = {**base, "checkpoint[lolcats:256]": "sha256:e3b0"}
    ResultsStore(tmp_path, {"model": "m"}, settings=bad)
    assert (
        "checkpoint[lolcats:256]" not in json.loads((tmp_path / "fingerprint.json").read_text())["settings"]
    )
    # Even had it been recorded, no lolcats row depends on it: the shipped adapter's run goes ahead.
    recorded = json.loads((tmp_path / "fingerprint.json").read_text())
    recorded["settings"] = bad
    (tmp_path / "fingerprint.json").write_text(json.dumps(recorded))
    store = _store(tmp_path, {**base, "checkpoint[lolcats:256]": "sha256:9ae2"})
    assert store.settings["checkpoint[lolcats:256]"] == "sha256:9ae2"
    # A setting that the stored rows do depend on is still refused.
    from sinkwindow.runs.folder import RunMismatchError

    with pytest.raises(RunMismatchError, match="niah_max_new_tokens 16 → 8"):
        ResultsStore(tmp_path, {"model": "m"}, settings={**base, "niah_max_new_tokens": 8})


def test_a_folder_with_a_report_but_no_run_is_not_overwritten(tmp_path):
    (tmp_path / "report.md").write_text("my notes")
    from sinkwindow.runs.folder import RunMismatchError

    with pytest.raises(RunMismatchError, match="holds report.md but no run"):
        ResultsStore(tmp_path, {"model": "m"}, settings={"seed": 0})
    assert (tmp_path / "report.md").read_text() == "my notes"
    ResultsStore(tmp_path, {"model": "m"}, settings={"seed": 0}, new_run=True)  # moved aside, as asked
    assert not (tmp_path / "report.md").exists() and any(tmp_path.glob("previous-*/report.md"))


def test_rows_from_uncommitted_source_are_refused_unless_allowed(tiny_folder, tmp_path, monkeypatch, capsys):
    """A run refuses to write rows from a dirty src/ tree; --allow-dirty stamps each row with the diff's sha256."""
    from sinkwindow.cli import main
    from sinkwindow.runs import provenance

    monkeypatch.setattr(
        provenance, "source_state", lambda: {"commit": "abc", "dirty": True, "diff_sha256": "d" * 64}
    )
    monkeypatch.delenv("SINKWINDOW_ALLOW_DIRTY", raising=False)
    argv = ["eval", "ppl", "--model", str(tiny_folder), "--methods", "full", "--lengths", "16", "--samples", "1",
            "--no-progress", "--out", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 2
    assert "uncommitted changes" in capsys.readouterr().err and not (tmp_path / "run").exists()
    assert main([*argv, "--allow-dirty"]) == 0
    (row,) = ResultsStore(tmp_path / "run").rows()
    assert row["source_diff"] == "d" * 64


def test_a_damaged_fingerprint_is_named_as_such(tmp_path):
    from sinkwindow.runs.folder import RunMismatchError

    _store(tmp_path, {"seed": 0}, [_niah(0)])
    (tmp_path / "fingerprint.json").write_text("{torn")
    with pytest.raises(RunMismatchError, match="its fingerprint.json is damaged"):
        ResultsStore(tmp_path, {"model": "m"}, settings={"seed": 0})


def test_a_run_that_wrote_nothing_leaves_no_folder(tmp_path):
    from sinkwindow.runs.folder import RunLock

    with RunLock(tmp_path / "a" / "b"):
        assert (tmp_path / "a" / "b" / ".lock").exists()
    assert not (tmp_path / "a").exists()  # the folders the lock made are gone again
    with RunLock(tmp_path / "c"):
        (tmp_path / "c" / "rows.jsonl").write_text("{}\n")
    assert (tmp_path / "c" / "rows.jsonl").exists()  # a run that wrote something keeps its folder
    (tmp_path / "d").mkdir()
    with RunLock(tmp_path / "d"):
        pass
    assert (tmp_path / "d").is_dir()  # a folder that was there stays


def test_a_perplexity_row_whose_score_disagrees_with_its_nll_is_left_out(tmp_path):
    # exp(200 / 100) is the perplexity; a hand-edited or damaged score of 1e300 must not be averaged.
    good, bad = _ppl(0), {**_ppl(1), "score": 1e300}
    store = _store(tmp_path, {"seed": 0}, [good, bad])
    reopened = ResultsStore(tmp_path)
    assert [r["index"] for r in reopened.rows()] == [0]
    ((line, why),) = reopened.rejected
    assert line == 2 and "is not exp(nll_sum / n_tokens)" in why
    assert store is not None


def test_a_torn_last_line_cut_on_resume_is_not_reported_as_skipped(tmp_path):
    _store(tmp_path, {"seed": 0}, [_niah(0)])
    with (tmp_path / "results.jsonl").open("a") as f:
        f.write('{"task": "niah_single_1", "meth')  # a kill mid-append
    writer = ResultsStore(tmp_path, {"model": "m"}, settings={"seed": 0})
    assert writer.skipped_lines == 0 and len(writer) == 1  # cut off, not "skipped": its sample runs again
    assert ResultsStore(tmp_path).skipped_lines == 0
