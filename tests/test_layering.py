"""The layering CONTRIBUTING.md promises, read from the source: the core never imports upward, and
no module imports another's private names. Read with ``ast`` (nothing is imported), so a lazy
import inside a function counts as much as one at the top of a file."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "sinkwindow"

# The architecture, bottom to top; a layer imports only itself and the layers below it:
#   runtime <- linear, models <- methods <- eval, bench, train, tuning, serve, runs <- cli
# (methods/ converts to the linear retrofits, so it sits above linear; the runtime below it reads the
# spec's own predicates.)
# ``_lazy`` and ``jsonl`` are plumbing every layer may use. Each area's ``<area>/cli.py`` front end
# registers a subcommand and so belongs to the cli layer.
LAYERS = [
    {"runtime", "_lazy", "jsonl"},
    {"linear", "models"},
    {"methods"},
    {"eval", "bench", "train", "tuning", "serve", "runs"},
    {"cli"},
]
# Known imports against the layering, each with its reason; the methods step removes them.
ALLOWED = {
    # the method switch converts to the trained baselines; it moves to methods/ (which may import linear)
    ("sinkwindow.runtime.method", "sinkwindow.linear"),
    # the sinkwindow-lm-eval console script (pyproject) is the package's own front end, re-exported
    ("sinkwindow.eval.lmeval", "sinkwindow.eval.lmeval.cli"),
}
MAX_ROOT_MODULES = 8


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
                # `from . import cli_args` imports the module sinkwindow.cli.args, not a name of sinkwindow.
                sub = f"{base}.{a.name}"
                out.append((sub, None) if _is_module(sub) else (base, a.name))
    return out


def _layer(dotted: str) -> int | None:
    """The layer of module ``dotted`` (its index in ``LAYERS``); ``None`` for the package itself."""
    parts = dotted.split(".")
    if len(parts) < 2:
        return None
    if parts[-1] in ("cli", "__main__") or (len(parts) > 2 and parts[1] == "eval" and parts[-2] == "cli"):
        return len(LAYERS) - 1  # a front end: <area>/cli.py (and eval/lmeval/cli.py)
    return next((i for i, names in enumerate(LAYERS) if parts[1] in names), None)


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def upward_imports() -> list[str]:
    """Every import of a module in a layer above the importer's."""
    bad = []
    for path in _sources():
        mod = _module_name(path)
        here = _layer(mod)
        if here is None:
            continue
        for target, _ in imports(path):
            there = _layer(target)
            allowed = any(mod == m and (target + ".").startswith(t + ".") for m, t in ALLOWED)
            if there is not None and there > here and not allowed:
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
    root = tmp_path / "sinkwindow"
    for pkg in ("linear", "eval", "cli", "runtime"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "cli" / "args.py").write_text("")
    (root / "linear" / "x.py").write_text(
        "from ..cli import args\nimport sinkwindow.eval\ndef f():\n    from ..eval import _hidden\n"
        "from .ops import _mine\nfrom ..runtime import spec\n"
    )
    (root / "eval" / "y.py").write_text("from ..cli.args import integer\n")  # below the cli: refused
    (root / "eval" / "cli.py").write_text("from ..cli.args import integer\n")  # a front end: allowed
    (root / "runtime" / "z.py").write_text("import sinkwindow.linear\n")
    monkeypatch.setattr(f"{__name__}.SRC", tmp_path)
    monkeypatch.setattr(f"{__name__}.PACKAGE", root)
    got = imports(root / "linear" / "x.py")
    assert ("sinkwindow.cli.args", None) in got and ("sinkwindow.eval", None) in got
    assert ("sinkwindow.eval", "_hidden") in got and ("sinkwindow.linear.ops", "_mine") in got
    assert sorted(upward_imports()) == [
        "sinkwindow.eval.y imports sinkwindow.cli.args",
        "sinkwindow.linear.x imports sinkwindow.cli.args",
        "sinkwindow.linear.x imports sinkwindow.eval",
        "sinkwindow.linear.x imports sinkwindow.eval",
        "sinkwindow.runtime.z imports sinkwindow.linear",
    ]
    assert sorted(private_imports()) == [
        "sinkwindow.linear.x imports sinkwindow.eval._hidden",
        "sinkwindow.linear.x imports sinkwindow.linear.ops._mine",
    ]


def test_no_layer_imports_one_above_it():
    # runtime never imports eval/bench/train/tuning/serve/cli; those never import cli.
    assert sorted(upward_imports()) == []


def test_every_package_and_module_at_the_root_has_a_layer():
    # A new top-level package outside LAYERS would escape the check above.
    names = {p.stem for p in PACKAGE.glob("*.py")} | {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()
    }
    assert sorted(names - {"__init__"} - set().union(*LAYERS)) == []


def test_the_package_root_holds_at_most_eight_modules():
    # The runtime, models and CLI plumbing live in packages; the root is the public API and plumbing.
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= MAX_ROOT_MODULES, modules


def test_no_module_imports_a_private_name_of_another():
    assert private_imports() == []


@pytest.mark.parametrize("name", sorted(set().union(*LAYERS) - {"methods"}))
def test_every_layered_package_exists(name):
    # A renamed package would silently drop out of the check above.
    assert _is_module(f"sinkwindow.{name}"), f"sinkwindow.{name} is gone: update LAYERS"


def test_no_source_file_is_ignored_by_git():
    # A .gitignore pattern that matches a source folder (once `runs/`, meant for output folders,
    # hid sinkwindow/runs/) keeps it out of every commit: this checkout works, a clone does not.
    import shutil
    import subprocess

    root = SRC.parent
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    files = [
        str(p.relative_to(root))
        for d in ("src", "tests", "benchmarks", "tools")
        for p in (root / d).rglob("*.py")
    ]
    files = [f for f in files if "__pycache__" not in f]
    assert len(files) > 100  # the walk found the sources
    ignored = subprocess.run(
        ["git", "-C", str(root), "check-ignore", "--no-index", "--stdin"],
        input="\n".join(files), capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    assert ignored == []
