"""The layering CONTRIBUTING.md promises, read from the source: the core never imports upward, and
no module imports another's private names. Read with ``ast`` (nothing is imported), so a lazy
import inside a function counts as much as one at the top of a file."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "sinkwindow"

# The runtime and the retrofits' kernels: what a user's own code imports to run a method.
CORE = {
    "spec", "masks", "cache", "static_cache", "hybrid", "flex", "patch", "prefill", "rope", "threads",
    "memory", "method", "registry", "attributes", "reference", "models", "generate", "jsonl", "_lazy", "probe",
    "notices", "resolve", "linear", "plan",
}  # fmt: skip
# What sits above it: evaluation, benchmarks, tuning, training, and every command-line module.
ABOVE = {"eval", "bench", "tuning", "train", "runs", "serve", "cli", "cli_args", "cli_errors", "check"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    p = SRC.joinpath(*dotted.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def imports(path: Path) -> list[tuple[str, str | None]]:
    """Every ``sinkwindow`` import in ``path``: (imported module, imported name or ``None``)."""
    mod = _module_name(path)
    package = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.split(".")[0] == "sinkwindow"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            if base.split(".")[0] != "sinkwindow":
                continue
            for a in node.names:
                # `from . import cli_args` imports the module sinkwindow.cli_args, not a name of sinkwindow.
                sub = f"{base}.{a.name}"
                out.append((sub, None) if _is_module(sub) else (base, a.name))
    return out


def _layer(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else None


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def upward_imports() -> list[str]:
    bad = []
    for path in _sources():
        mod = _module_name(path)
        if _layer(mod) not in CORE:
            continue
        for target, _ in imports(path):
            parts = target.split(".")
            if _layer(target) in ABOVE or parts[-1] == "cli":
                bad.append(f"{mod} imports {target}")
    return bad


def private_imports() -> list[str]:
    bad = []
    for path in _sources():
        mod = _module_name(path)
        for target, name in imports(path):
            if name and name.startswith("_") and not name.startswith("__") and target != mod:
                bad.append(f"{mod} imports {target}.{name}")
    return bad


def test_the_checker_sees_imports_of_every_form(tmp_path, monkeypatch):
    # A checker that read nothing would pass everything: hold it to a file with each form of import.
    pkg = tmp_path / "sinkwindow" / "linear"
    pkg.mkdir(parents=True)
    (tmp_path / "sinkwindow" / "__init__.py").write_text("")
    (tmp_path / "sinkwindow" / "cli_args.py").write_text("")
    (tmp_path / "sinkwindow" / "eval").mkdir()
    (tmp_path / "sinkwindow" / "eval" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "x.py").write_text(
        "from .. import cli_args\nimport sinkwindow.eval\ndef f():\n    from ..eval import _hidden\n"
        "from .ops import _mine\n"
    )
    monkeypatch.setattr(f"{__name__}.SRC", tmp_path)
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path / "sinkwindow")
    got = imports(pkg / "x.py")
    assert ("sinkwindow.cli_args", None) in got and ("sinkwindow.eval", None) in got
    assert ("sinkwindow.eval", "_hidden") in got and ("sinkwindow.linear.ops", "_mine") in got
    assert sorted(upward_imports()) == [
        "sinkwindow.linear.x imports sinkwindow.cli_args",
        "sinkwindow.linear.x imports sinkwindow.eval",
        "sinkwindow.linear.x imports sinkwindow.eval",
    ]
    assert sorted(private_imports()) == [
        "sinkwindow.linear.x imports sinkwindow.eval._hidden",
        "sinkwindow.linear.x imports sinkwindow.linear.ops._mine",
    ]


def test_the_core_never_imports_evaluation_benchmarks_tuning_training_or_a_cli():
    assert sorted(upward_imports()) == []


def test_no_module_imports_a_private_name_of_another():
    assert private_imports() == []


@pytest.mark.parametrize("layer", sorted(CORE))
def test_every_core_layer_exists(layer):
    # A renamed core module would silently drop out of the check above.
    assert _is_module(f"sinkwindow.{layer}"), f"sinkwindow.{layer} is gone: update CORE"


def test_no_source_file_is_ignored_by_git():
    # A .gitignore pattern that matches a source folder (once `runs/`, meant for output folders,
    # hid sinkwindow/runs/) keeps it out of every commit: this checkout works, a clone does not.
    import shutil
    import subprocess

    root = SRC.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    files = [
        str(p.relative_to(root)) for d in ("src", "tests", "benchmarks") for p in (root / d).rglob("*.py")
    ]
    files = [f for f in files if "__pycache__" not in f]
    assert len(files) > 100  # the walk found the sources
    ignored = subprocess.run(
        ["git", "-C", str(root), "check-ignore", "--no-index", "--stdin"],
        input="\n".join(files), capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    assert ignored == []
