"""House rules a reviewer would otherwise check by eye: library code never prints (it logs, or
says what a run does through ``sinkwindow.runtime.notices``), no banner comments divide files (a file
that needs sections is two files), and no function runs past 80 lines of code unless it says why."""

import ast
import re
from pathlib import Path

import sinkwindow

PACKAGE = Path(sinkwindow.__file__).parent
REPO = PACKAGE.parents[1]
# The CLI's own modules print: each area's front end, and the command's parser, flags and errors.
CLI_MODULES = ("cli.py", "__main__.py", "cli/app.py", "cli/args.py", "cli/errors.py")
BANNER = re.compile(r"^\s*# ?[-=#*~]{10,}")


def test_library_modules_never_print():
    printing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in CLI_MODULES or path.relative_to(PACKAGE).as_posix() in CLI_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                printing.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert printing == []


def test_no_banner_comments():
    banners = [
        f"{path.relative_to(REPO)}:{i}"
        for folder in ("src", "tests", "benchmarks", "tools")
        for path in sorted((REPO / folder).rglob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if BANNER.match(line)
    ]
    assert banners == []


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's lines from ``def`` to its end, less its docstring (the shapes and arguments the
    house style asks every public function to document)."""
    total = node.end_lineno - node.lineno + 1
    first = node.body[0] if node.body else None
    value = getattr(first, "value", None) if isinstance(first, ast.Expr) else None
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        total -= first.end_lineno - first.lineno + 1
    return total


def test_no_function_is_longer_than_a_reader_can_hold():
    # 80 lines of code; a function that must stay one piece says why in a "# One piece:" comment.
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _code_lines(node) > 80:
                body = lines[node.lineno - 1 : node.end_lineno]
                if not any(line.strip().startswith("# One piece:") for line in body):
                    long.append(
                        f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name} ({_code_lines(node)})"
                    )
    assert long == []


def test_the_length_check_counts_code_not_docstrings():
    tree = ast.parse('def f():\n    """doc\n\n    more\n    """\n    x = 1\n    return x\n')
    assert _code_lines(tree.body[0]) == 3
