"""House rules a reviewer would otherwise check by eye: library code never prints (it logs, or
says what a run does through ``sinkwindow.notices``), and no banner comments divide files (a file
that needs sections is two files)."""

import ast
import re
from pathlib import Path

import sinkwindow

PACKAGE = Path(sinkwindow.__file__).parent
REPO = PACKAGE.parents[1]
CLI_MODULES = ("cli.py", "cli_args.py", "cli_errors.py", "__main__.py")  # the CLI's own modules print
BANNER = re.compile(r"^\s*# ?[-=#*~]{10,}")


def test_library_modules_never_print():
    printing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name in CLI_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                printing.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert printing == []


def test_no_banner_comments():
    banners = [
        f"{path.relative_to(REPO)}:{i}"
        for folder in ("src", "tests", "benchmarks")
        for path in sorted((REPO / folder).rglob("*.py"))
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if BANNER.match(line)
    ]
    assert banners == []
