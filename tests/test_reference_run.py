"""The committed reference run a quick report embeds: found by name and date, rendered from its own
results file (never from numbers typed in), labelled with its n and commit."""

from __future__ import annotations

import argparse
import json

import pytest

from sinkwindow.eval.cli import _reference_dir
from sinkwindow.eval.committed_run import find_reference_run, reference_section
from sinkwindow.eval.report import write_report
from sinkwindow.eval.summary import summarize
from sinkwindow.eval.tables import headline_sections

pytest.importorskip("sinkwindow.eval.generators.haystack")


def niah(
    method: str, length: int, scores: list[int], task: str = "niah_single_3", model: str = "m"
) -> list[dict]:
    return [
        dict(
            model=model, task=task, method=method, length=length, seed=0, index=i, score=100.0 * s, depth=50.0
        )
        for i, s in enumerate(scores)
    ]


def write_run(folder, rows, config=None):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def reference(tmp_path):
    rows = niah("full", 1024, [1] * 30) + niah("swa:256:4", 1024, [1] * 20 + [0] * 10)
    rows += niah("lolcats:256", 1024, [1] * 5 + [0] * 25)
    config = {
        "model": "smollm2-135m",
        "seed": 0,
        "updated": "2026-12-02T10:00:00+00:00",
        "versions": {"sinkwindow-commit": "bbbbbbbbbbbb"},
        "history": [{"versions": {"sinkwindow-commit": "aaaaaaaaaaaa"}}],
    }
    return write_run(tmp_path / "results" / "2026-12-02-smollm2-long", rows, config), rows


def test_the_newest_dated_folder_with_results_is_found(tmp_path):
    root = tmp_path / "results"
    write_run(root / "2026-11-01-smollm2-long", niah("full", 512, [1]))
    newest = write_run(root / "2026-12-02-smollm2-135m-long", niah("full", 512, [1]))
    (root / "2026-12-09-smollm2-long").mkdir()  # no results yet: not a reference
    write_run(root / "2026-12-10-gemma3-long", niah("full", 512, [1]))
    write_run(root / "notes-smollm2-long", niah("full", 512, [1]))  # no date
    assert find_reference_run("smollm2-135m", roots=[root]) == newest
    assert find_reference_run("gemma3-270m", roots=[root]) == root / "2026-12-10-gemma3-long"
    assert find_reference_run("Qwen/Qwen2.5-0.5B", roots=[root]) is None


def test_section_is_computed_from_the_folder_and_labelled_with_n_and_commits(reference, tmp_path):
    folder, rows = reference
    quick = tmp_path / "runs" / "quick"
    quick.mkdir(parents=True)
    lines = reference_section(folder, link_from=quick)
    text = "\n".join(lines)
    assert lines[0] == "## Reference run: 2026-12-02-smollm2-long"
    assert "(../../results/2026-12-02-smollm2-long)" in text
    assert "n = 30 per task" in text and "commit aaaaaaaaaaaa, bbbbbbbbbbbb" in text
    # The tables are those of the folder's own rows, at heading level 3.
    body = "\n".join(headline_sections(summarize(rows), level=3))
    assert body in text
    assert "### SWA ÷ LoLCATs" in text and "66.7" in text  # swa:256:4 found 20 of 30


def test_section_follows_the_file_when_the_run_grows(reference):
    folder, rows = reference
    before = "\n".join(reference_section(folder))
    more = rows + niah("full", 2048, [0] * 30)
    write_run(folder, more)
    after = "\n".join(reference_section(folder))
    assert after != before and "2K" in after and "2K" not in before


def test_quick_report_embeds_the_reference_but_a_reference_never_embeds_itself(reference, tmp_path):
    folder, _ = reference
    quick = write_run(tmp_path / "quick", niah("full", 1024, [1, 0]) + niah("swa:256:4", 1024, [0, 0]))
    md = write_report(quick, reference_run=folder).read_text()
    assert "## Reference run: 2026-12-02-smollm2-long" in md
    own = write_report(folder, reference_run=folder).read_text()
    assert "Reference run" not in own


def test_a_folder_without_results_is_refused_in_one_line(tmp_path):
    assert _reference_dir("none") == "none"
    with pytest.raises(argparse.ArgumentTypeError, match="holds no results.jsonl"):
        _reference_dir(str(tmp_path))
    empty = write_run(tmp_path / "2026-12-02-smollm2-long", [{"foo": 1}])
    with pytest.raises(ValueError, match="no long-context results"):
        reference_section(empty)


def test_config_versions_name_the_source_commit():
    import subprocess
    from pathlib import Path

    from sinkwindow.runs.provenance import library_versions, source_commit

    src = Path(__file__).resolve().parents[1] / "src" / "sinkwindow"
    head = subprocess.run(
        ["git", "-C", str(src), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    )
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    commit = source_commit()
    assert commit is not None and commit.split("+")[0] == head.stdout.strip()
    assert library_versions()["sinkwindow-commit"] == commit


def test_report_command_takes_none_and_a_folder(reference, tmp_path):
    from sinkwindow.cli import main

    folder, _ = reference
    quick = write_run(tmp_path / "quick", niah("full", 1024, [1, 0]) + niah("swa:256:4", 1024, [0, 0]))
    assert main(["report", str(quick), "--reference-run", "none"]) == 0
    assert "Reference run" not in (quick / "report.md").read_text()
    assert main(["report", str(quick), "--reference-run", str(folder)]) == 0
    assert "## Reference run: 2026-12-02-smollm2-long" in (quick / "report.md").read_text()
