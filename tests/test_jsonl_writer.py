"""The one JSONL writer (``jsonl.append_jsonl``): rows read back in order, as each file serialized them,
and no module appends to a file any other way."""

import ast
import json
import threading
from pathlib import Path

import sinkwindow
from sinkwindow.jsonl import append_jsonl, read_jsonl

PACKAGE = Path(sinkwindow.__file__).parent


def test_appended_rows_read_back_in_order_in_a_new_folder(tmp_path):
    path = tmp_path / "new" / "rows.jsonl"  # the folder does not exist yet
    append_jsonl(path, {"b": 1, "a": 2})
    append_jsonl(path, {"b": 3, "a": Path("x")}, sort_keys=True, default=str)
    lines = path.read_text().splitlines()
    assert lines == [json.dumps({"b": 1, "a": 2}), json.dumps({"a": "x", "b": 3})]
    assert read_jsonl(path) == ([{"b": 1, "a": 2}, {"a": "x", "b": 3}], [])


def test_concurrent_appenders_never_interleave_within_a_line(tmp_path):
    path = tmp_path / "rows.jsonl"
    big = "x" * 20000  # larger than a pipe buffer: a line written in pieces could interleave

    def write(who):
        for i in range(20):
            append_jsonl(path, {"who": who, "i": i, "pad": big})

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows, bad = read_jsonl(path)
    assert bad == [] and len(rows) == 80
    for w in range(4):
        assert [r["i"] for r in rows if r["who"] == w] == list(range(20))


def test_no_module_appends_to_a_file_but_the_writer():
    # bench.md (a Markdown log, not JSONL) is the one other append.
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "jsonl.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            appends = isinstance(node, ast.Call) and any(
                isinstance(a, ast.Constant) and a.value in ("a", "ab", "a+") for a in node.args
            )
            if appends and getattr(node.func, "attr", getattr(node.func, "id", None)) == "open":
                found.append(path.relative_to(PACKAGE).as_posix())
    assert found == ["bench/report.py"]
