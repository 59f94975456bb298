"""The lcc task's samples (eval/generators/code.py): stdlib next-line completion, its budget and its evidence."""

import ast
import textwrap

import pytest

from sinkwindow.eval.generators import code
from sinkwindow.eval.generators.code import (
    MAX_NEW_TOKENS,
    PROMPT,
    answer_lines,
    answer_names,
    bindings,
    generate_lcc,
    is_answer_line,
    read_source,
    stdlib_root,
)
from sinkwindow.eval.runner import EvalConfig
from sinkwindow.eval.tasks import LCC_ANSWER_TOKENS, TASKS
from test_niah import make_byte_bpe


@pytest.fixture(scope="module")
def tok():
    return make_byte_bpe()


def n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _file_lines(path: str) -> list[str]:
    with open(stdlib_root() / path, encoding="utf-8") as f:
        return f.read().split("\n")


def _context(sample) -> str:
    head, tail = PROMPT.split("{context}")
    assert sample.prompt.startswith(head) and sample.prompt.endswith(tail)
    return sample.prompt[len(head) : -len(tail)]


def test_the_registry_reserves_longbenchs_decode_budget():
    assert LCC_ANSWER_TOKENS == MAX_NEW_TOKENS == 64
    assert TASKS["lcc"].group == "code" and TASKS["lcc"].family == "lcc"


def test_samples_are_deterministic_in_seed_and_index(tok):
    a = generate_lcc(tok, 512, 4, seed=3)
    b = generate_lcc(tok, 512, 4, seed=3)
    assert [(s.target_file, s.line, s.prompt) for s in a] == [(s.target_file, s.line, s.prompt) for s in b]
    other = generate_lcc(tok, 512, 4, seed=4)
    assert [(s.target_file, s.line) for s in a] != [(s.target_file, s.line) for s in other]
    # Sample i has the same target at every length and however many samples are drawn.
    longer = generate_lcc(tok, 1024, 2, seed=3)
    assert [(s.target_file, s.line) for s in longer] == [(s.target_file, s.line) for s in a[:2]]


def test_the_answer_is_the_line_after_the_context_in_the_named_file(tok):
    for s in generate_lcc(tok, 768, 6, seed=11):
        lines = _file_lines(s.target_file)
        assert s.answer == lines[s.line - 1].strip() and s.answer
        context = _context(s)
        # The context ends with the file's lines before the target, as far back as it reaches.
        own = min(s.line - 1, s.context_lines)
        expected = "".join(line + "\n" for line in lines[s.line - 1 - own : s.line - 1])
        assert context.endswith(expected)
        assert s.files[-1] == s.target_file and s.python_version == code.python_version()
        if s.line - 1 < s.context_lines:  # the target file's start was reached: its header is there
            assert f"# Path: {s.target_file}\n" + expected in context


def test_answer_rule_keeps_statements_worth_predicting():
    for line in ["x = compute(a, b)", "    return self._value", "def f(x):", "import os", "else: y = 1"]:
        assert is_answer_line(line), line
    for line in ["", "   ", "# a comment", ")", "]),", "pass", "else:", "  try:", "return", "...",
                 "x = a // b", "y = 1  # why", "s = '`'"]:  # fmt: skip
        assert not is_answer_line(line), line


def test_answer_lines_are_statement_starts_but_not_docstrings(tmp_path):
    source = textwrap.dedent(
        '''\
        """Module doc."""
        import os


        def f(a,
              b):
            """Doc of f."""
            total = (a +
                     b)
            if total:
                pass
            else:
                total = 0
            return os.path.join(
                str(total),
            )
        '''
    )
    (tmp_path / "m.py").write_text(source)
    src = read_source(str(tmp_path), "m.py")
    # import, def, total =, if, total = 0, return: not docstrings, continuations, pass or else:.
    assert answer_lines(src) == (2, 5, 8, 10, 13, 14)


def test_the_prompt_fits_the_budget_and_is_filled(tok):
    for length in (300, 1000):
        samples = generate_lcc(tok, length, 6, seed=5)
        limit = length - MAX_NEW_TOKENS
        checked = 0
        for s in samples:
            assert s.n_prompt_tokens == n_tokens(tok, s.prompt) <= limit
            first = s.line - s.context_lines  # the first context line, when it is the target file's
            if first > 1:
                # One more line of the file would not have fit.
                lines = _file_lines(s.target_file)
                head, tail = PROMPT.split("{context}")
                bigger = head + lines[first - 2] + "\n" + _context(s) + tail
                assert n_tokens(tok, bigger) > limit
                checked += 1
        assert checked  # the check ran on at least one sample


def test_a_too_small_length_is_refused_in_one_line(tok):
    with pytest.raises(ValueError, match="leaves no room for a line of code"):
        generate_lcc(tok, 70, 1, seed=0)


EVIDENCE_SOURCE = """\
import os
LIMIT = 3
{filler}
print(os.path.join("a", str(LIMIT)))
"""


def test_names_read_and_bound_come_from_the_ast(tmp_path):
    (tmp_path / "m.py").write_text(
        "import os.path as osp\nclass A:\n    def f(self, n):\n        self.size = n\n"
        "        for i in range(n):\n            yield osp.join(self.size, i)\n"
    )
    src = read_source(str(tmp_path), "m.py")
    assert bindings(src) == {1: {"osp"}, 2: {"A"}, 3: {"f", "self", "n"}, 4: {"size"}, 5: {"i"}}
    assert answer_names(src, 6) == {"osp", "join", "self", "size", "i"}  # range, a builtin, is left out
    assert answer_names(src, 3) == frozenset()  # a def line binds its names, it reads none


@pytest.mark.parametrize("filler_lines", [0, 300])
def test_evidence_is_the_nearest_binding_line_or_none_beyond_the_context(tmp_path, tok, filler_lines):
    filler = "\n".join(f"# filler line {k} of comments" for k in range(filler_lines))
    (tmp_path / "m.py").write_text(EVIDENCE_SOURCE.format(filler=filler))
    ast.parse((tmp_path / "m.py").read_text())
    lines = (tmp_path / "m.py").read_text().split("\n")
    target = 1 + next(k for k, line in enumerate(lines) if line.startswith("print("))
    # The print line; 1 (import os) and 2 (LIMIT = 3) are the other answer lines.
    samples = generate_lcc(tok, 512, 12, seed=0, root=tmp_path)
    prints = [s for s in samples if s.line == target]
    assert prints and {s.line for s in samples} <= {1, 2, target}
    for s in prints:
        if filler_lines == 0:
            ev = s.evidence
            assert (ev["file"], ev["line"], ev["name"], ev["distance_lines"]) == ("m.py", 2, "LIMIT", 2)
            ids = tok(s.prompt, add_special_tokens=True)["input_ids"]
            assert tok.decode(ids[ev["tokens"][0] : ev["tokens"][1]]).strip() == "LIMIT = 3"
            assert s.prompt.startswith(PROMPT.split("{context}")[0] + "# Path: m.py\nimport os\n")
            # From the evidence line's first token to the first token past the context.
            context_end = len(s.prompt) - len(PROMPT.split("{context}")[1])
            offsets = tok(s.prompt, add_special_tokens=True, return_offsets_mapping=True)["offset_mapping"]
            end = next(i for i, (a, b) in enumerate(offsets) if b > context_end and b > a)
            assert ev["distance_tokens"] == end - ev["tokens"][0] > 0
        else:
            assert s.evidence is None  # LIMIT = 3 lies 300 comment lines back, outside 512 tokens
    for s in samples:
        if s.line == 2:
            assert s.evidence is None and s.answer_names == []  # LIMIT = 3 reads no name
        if s.line == target:
            assert s.answer_names == ["LIMIT", "join", "os", "path"]


def test_the_task_scores_a_prediction_into_a_row(tok):
    config = EvalConfig(model="m", methods=["full"], tasks=["lcc"], lengths=[512], samples=3, seed=2)
    task = TASKS["lcc"]
    assert task.settings(config) == {"lcc_python": code.python_version()}
    assert any("stdlib" in d for d in task.deviations(config))
    for s in task.build_samples(tok, 512, config):
        ids, cap, finish = task.prepare(tok, s, config)
        assert cap == 64 and ids.shape[1] == len(tok(s.prompt)["input_ids"])
        row = finish("    " + s.answer + "\n    more()")
        assert (row["score"], row["exact_match"], row["metric"]) == (100, 100, "code_sim")
        assert (row["file"], row["line"], row["answer"], row["prompt"]) == (
            s.target_file,
            s.line,
            s.answer,
            s.prompt,
        )
        assert row["evidence_tokens"] == (s.evidence["tokens"] if s.evidence else None)
        assert row["answer_names"] == s.answer_names and (
            s.evidence is None or s.evidence["name"] in s.answer_names
        )
        wrong = finish("# nothing\n")
        assert (wrong["score"], wrong["exact_match"]) == (0, 0)
