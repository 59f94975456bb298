"""LCC-style next-line code completion on the running Python's standard library (task ``lcc``).

LongBench's LCC gives a model a long piece of source and asks for the next line, with the prompt
``"Please complete the code given below. \\n{context}Next line of code:\\n"`` (no chat template), a
64-token decode and ``code_sim_score`` (``eval/code_sim.py``). Its code comes from GitHub; here it
is the source every Python ships: the interpreter's own standard library
(``sysconfig.get_paths()["stdlib"]``), so nothing is downloaded, and rows record
``platform.python_version()`` because each Python ships different files.

A sample at length N:

* **Target.** From ``random.Random(f"lcc:{seed}:{index}")`` (so sample i is the same at every
  length and however many samples are drawn): a file drawn uniformly from :func:`stdlib_files`,
  then a line drawn uniformly from its answer lines (:func:`answer_lines`); a file with none is
  drawn again.
* **Answer rule.** A line where a statement starts (an ``ast`` statement's first line), that is not
  a docstring, whose stripped text holds a letter, digit or underscore (no lone bracket), is not a
  bare ``pass``, ``else:``, ``try:``, ``finally:``, ``except:``, ``break``, ``continue``,
  ``return``, ``raise`` or ``...``, and holds none of ``#``, `` ` `` and ``//`` (LongBench's
  scorer skips prediction lines holding them, so a correct prediction of such a line could not
  score). The answer is that line stripped of surrounding whitespace.
* **Context.** The lines before the target, reading backwards: the target file's own lines, and
  when its start is reached, a header line ``# Path: <file relative to the stdlib>`` and whole
  files before it (the target's package siblings in a seeded order, then any stdlib file), each
  with its header, as LongBench's repository-level variants join files. It keeps the most lines
  (a suffix ending just before the target) whose prompt, counted without special tokens as RULER
  and the other tasks count, has at most ``N - MAX_NEW_TOKENS`` tokens; a file cut in the middle
  has no header.
* **Evidence.** The nearest context line before the target that binds a name the answer line
  reads (:func:`answer_names`: loaded variables and attribute names, builtins left out; what the
  line itself only binds does not count): an assignment, augmented or annotated assignment,
  ``for``/``with``/``except ... as`` target, ``def``/``class`` name, parameter, import, or an
  attribute assigned (``obj.name = ...`` binds ``name``), read from each file's ``ast``. Recorded as its file and
  line, the name, its distance in lines (1: the line just before the target), its token span
  ``[start, end)`` among the prompt's ids as the model reads them (``evidence_tokens``, special
  tokens included, as S-NIAH's ``needle_tokens``) and its distance in tokens (from the evidence
  line's first token to the first token after the context). ``None`` when no context line binds
  one (the binding lies outside the context, in another module or among the builtins).

Deviations from LongBench are in :data:`DEVIATIONS` (written into result metadata).
"""

from __future__ import annotations

import ast
import bisect
import builtins
import functools
import os
import platform
import random
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEVIATIONS",
    "MAX_NEW_TOKENS",
    "PROMPT",
    "LccSample",
    "SourceFile",
    "answer_lines",
    "answer_names",
    "bindings",
    "generate_lcc",
    "is_answer_line",
    "python_version",
    "read_source",
    "stdlib_files",
    "stdlib_root",
    "token_span",
]

# LongBench config/dataset2prompt.json and dataset2maxlen.json, "lcc".
PROMPT = "Please complete the code given below. \n{context}Next line of code:\n"
MAX_NEW_TOKENS = 64
HEADER = "# Path: {path}\n"

# Folders that are not library code: tests (a third of the stdlib, and repetitive), generated
# codec tables and pydoc's topic strings, third-party installs, caches, the build's config folder.
SKIPPED_DIRS = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "encodings", "pydoc_data"}
)
BARE_STATEMENTS = frozenset(
    {"pass", "else:", "try:", "finally:", "except:", "break", "continue", "return", "raise", "..."}
)
_BUILTINS = frozenset(dir(builtins))

DEVIATIONS: tuple[str, ...] = (
    "code: the running Python's standard library (tests, codec tables and site-packages left out), "
    "not LCC's GitHub files; one file's tail, or files joined with '# Path:' headers when the target "
    "file's start is reached",
    "answer: the next statement line that is not blank, a comment, a docstring, a lone bracket or a bare "
    "keyword, and holds no '#', '`' or '//'; LCC's answer is whatever line follows its cut",
    "scoring: the prediction's first code line and the answer are stripped of surrounding whitespace "
    "before fuzz.ratio (indentation is not scored)",
    "context: the longest suffix of source lines that fits the length minus 64 reserved tokens, counted "
    "with the evaluated model's tokenizer; LongBench truncates over-long prompts in the middle",
)


def stdlib_root() -> Path:
    """The running interpreter's standard library folder."""
    return Path(sysconfig.get_paths()["stdlib"])


def python_version() -> str:
    """The running interpreter's version: which standard library the samples come from."""
    return platform.python_version()


@functools.cache
def stdlib_files(root: str | None = None) -> tuple[str, ...]:
    """The library's ``.py`` files as sorted POSIX paths relative to ``root`` (default: the stdlib),
    without :data:`SKIPPED_DIRS`, ``config-*`` build folders and ``test_*.py`` files."""
    base = Path(root) if root is not None else stdlib_root()
    out = []
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("config-")]
        rel = Path(folder).relative_to(base)
        out += [(rel / f).as_posix() for f in files if f.endswith(".py") and not f.startswith("test_")]
    return tuple(sorted(out))


@dataclass(frozen=True)
class SourceFile:
    """One source file: ``lines`` without their newlines (``lines[k]`` is line ``k + 1``)."""

    path: str
    lines: tuple[str, ...]
    tree: ast.Module = field(repr=False, compare=False)


@functools.lru_cache(maxsize=256)
def read_source(root: str, path: str) -> SourceFile | None:
    """``root/path`` read as UTF-8 with universal newlines and parsed; ``None`` when it is not
    UTF-8 or not valid syntax for this Python."""
    try:
        with open(Path(root) / path, encoding="utf-8") as f:
            text = f.read()
        tree = ast.parse(text)
    except (UnicodeDecodeError, SyntaxError, ValueError):
        return None
    # ast counts lines at \n only (universal newlines turned \r\n and \r into \n); str.splitlines
    # would also break at form feeds, which some stdlib files hold.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return SourceFile(path, tuple(lines), tree)


def is_answer_line(text: str) -> bool:
    """Whether a statement's first line is worth predicting (the module docstring's answer rule,
    less the statement-start and docstring checks, which need the file)."""
    s = text.strip()
    if not s or s in BARE_STATEMENTS or any(mark in s for mark in ("#", "`", "//")):
        return False
    return any(c.isalnum() or c == "_" for c in s)


@functools.lru_cache(maxsize=256)
def _answer_lines(source: SourceFile) -> tuple[int, ...]:
    starts = set()
    for node in ast.walk(source.tree):
        if not isinstance(node, ast.stmt):
            continue
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            continue  # a docstring (or a bare string statement): prose, not code
        starts.add(node.lineno)
    return tuple(n for n in sorted(starts) if is_answer_line(source.lines[n - 1]))


def answer_lines(source: SourceFile) -> tuple[int, ...]:
    """1-based numbers of the lines of ``source`` that can be a sample's answer (sorted)."""
    return _answer_lines(source)


@functools.lru_cache(maxsize=256)
def _uses(source: SourceFile) -> dict[int, frozenset[str]]:
    out: dict[int, set[str]] = {}
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            out.setdefault(node.lineno, set()).add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            # The attribute's name ends the node: ``obj.\n    name`` puts it on the last line.
            out.setdefault(node.end_lineno or node.lineno, set()).add(node.attr)
    return {line: frozenset(names - _BUILTINS) for line, names in out.items()}


def answer_names(source: SourceFile, line: int) -> frozenset[str]:
    """The names line ``line`` of ``source`` reads (``ast`` loads: variables and attribute names),
    other than builtins; names the line only binds (``def f(x):``, ``for x in``) are not reads."""
    return _uses(source).get(line, frozenset())


def _bound_names(node: ast.AST) -> list[tuple[int, str]]:
    """``(line, name)`` of what ``node`` itself binds."""
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return [(node.lineno, node.id)]
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
        return [(node.end_lineno or node.lineno, node.attr)]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [(node.lineno, node.name)]
    if isinstance(node, ast.arg):
        return [(node.lineno, node.arg)]
    if isinstance(node, ast.alias):
        return [(node.lineno, node.asname or node.name.split(".")[0])]
    if isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
        return [(node.lineno, node.name)]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [(node.lineno, node.rest)]
    return []


@functools.lru_cache(maxsize=256)
def _bindings(source: SourceFile) -> dict[int, frozenset[str]]:
    out: dict[int, set[str]] = {}
    for node in ast.walk(source.tree):
        for line, name in _bound_names(node):
            out.setdefault(line, set()).add(name)
    return {line: frozenset(names) for line, names in out.items()}


def bindings(source: SourceFile) -> dict[int, frozenset[str]]:
    """``{line: names bound on that line}`` of ``source`` (the module docstring's binding kinds)."""
    return _bindings(source)


def token_span(
    tokenizer: Any, text: str, start: int, end: int, *, add_special_tokens: bool
) -> tuple[int, int]:
    """``[first, last + 1)``: the tokens of ``tokenizer(text)`` that overlap characters
    ``[start, end)`` (a slow tokenizer without offsets: counted from the text before and inside)."""
    try:
        offsets = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)[
            "offset_mapping"
        ]
    except (NotImplementedError, TypeError, KeyError):
        offsets = None
    if offsets is None:
        before = len(tokenizer(text[:start], add_special_tokens=add_special_tokens).input_ids)
        return before, before + len(tokenizer(text[start:end], add_special_tokens=False).input_ids)
    hits = [i for i, (a, b) in enumerate(offsets) if b > start and a < end and b > a]
    if not hits:
        raise ValueError(f"no token covers characters [{start}, {end}) of the prompt")
    return hits[0], hits[-1] + 1


@dataclass
class LccSample:
    """One ``lcc`` prompt.

    Attributes:
        index, length: the sample's index and its token budget (prompt + ``max_new_tokens``).
        prompt: :data:`PROMPT` around the context: what the model reads (no chat template).
        answer: the target line, stripped.
        target_file, line: the target's file (relative to the stdlib) and 1-based line number.
        files: every file with lines in the context, in prompt order (the target's last).
        python_version: the interpreter whose stdlib the code comes from.
        n_prompt_tokens: tokens of ``prompt`` without special tokens (the budget's count).
        context_lines: lines of the context.
        answer_names: the names the answer line reads (:func:`answer_names`), sorted; empty: an
            answer that depends on no earlier binding (a ``def`` line, an import, ``x = 1``).
        evidence: ``None``, or the nearest binding line: ``file``, ``line`` (in that file),
            ``name``, ``distance_lines``, ``distance_tokens`` and ``tokens`` (``[start, end)``
            among the prompt's ids with special tokens).
    """

    index: int
    length: int
    prompt: str
    answer: str
    target_file: str
    line: int
    files: list[str]
    python_version: str
    n_prompt_tokens: int
    context_lines: int
    answer_names: list[str]
    evidence: dict | None
    max_new_tokens: int = MAX_NEW_TOKENS


def _draw_target(rng: random.Random, root: str, files: tuple[str, ...]) -> tuple[SourceFile, int]:
    for _ in range(1000):
        source = read_source(root, rng.choice(files))
        if source is not None and answer_lines(source):
            return source, rng.choice(answer_lines(source))
    raise ValueError(f"no answer line found in 1000 files drawn from {root}")


def _other_files(rng: random.Random, target: str, files: tuple[str, ...]) -> list[str]:
    """Files that may precede the target, nearest first: its package siblings, then the rest."""
    folder = target.rpartition("/")[0]
    siblings = [f for f in files if f.rpartition("/")[0] == folder and f != target]
    rest = [f for f in files if f.rpartition("/")[0] != folder]
    rng.shuffle(siblings)
    rng.shuffle(rest)
    return siblings + rest


def _backward_lines(root: str, target: SourceFile, line: int, others: list[str]):
    """Context lines from the one before the target backwards: ``(text, file, line)``; a header
    line has line 0."""
    for k in range(line - 1, 0, -1):
        yield target.lines[k - 1], target.path, k
    yield HEADER.format(path=target.path).rstrip("\n"), target.path, 0
    for path in others:
        source = read_source(root, path)
        if source is None:
            continue
        for k in range(len(source.lines), 0, -1):
            yield source.lines[k - 1], path, k
        yield HEADER.format(path=path).rstrip("\n"), path, 0


def _gather(lines_back, chars: int) -> tuple[list[tuple[str, str, int]], bool]:
    """The next context lines (backwards) until ``chars`` characters; ``True`` once the stdlib ran out."""
    out, total = [], 0
    for item in lines_back:
        out.append(item)
        total += len(item[0]) + 1
        if total >= chars:
            return out, False
    return out, True


def _prompt(lines: list[tuple[str, str, int]]) -> str:
    """:data:`PROMPT` around context ``lines`` (reading order)."""
    return PROMPT.format(context="".join(text + "\n" for text, _, _ in lines))


def _estimate(tokenizer: Any, back: list[tuple[str, str, int]], limit: int) -> int:
    """Lines of ``back`` (nearest first) whose prompt has about ``limit`` tokens, from one
    tokenization with offsets: the template's tokens plus the context tokens starting at or after
    the first kept line."""
    text = _prompt(back[::-1])
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = sorted(a for a, b in enc["offset_mapping"] if b > a)
    head, tail = PROMPT.split("{context}")
    fixed = len(tokenizer(head + tail, add_special_tokens=False)["input_ids"])
    context_end = len(text) - len(tail)
    end_token = bisect.bisect_left(starts, context_end)
    pos, k = context_end, 0
    while k < len(back):
        pos -= len(back[k][0]) + 1
        if fixed + end_token - bisect.bisect_left(starts, pos) > limit:
            break
        k += 1
    return k


def _fit(tokenizer: Any, back: list[tuple[str, str, int]], limit: int) -> int:
    """How many of the gathered lines (``back``, nearest first) the prompt holds within ``limit``
    tokens: the estimate, then moved line by line until the exact count of the prompt agrees."""

    def fits(k: int) -> bool:
        return len(tokenizer(_prompt(back[:k][::-1]), add_special_tokens=False)["input_ids"]) <= limit

    try:
        k = _estimate(tokenizer, back, limit)
    except (NotImplementedError, TypeError, KeyError):  # a slow tokenizer: bisect on exact counts
        lo, hi = 0, len(back)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        k = lo
    while k > 0 and not fits(k):
        k -= 1
    while k < len(back) and fits(k + 1):
        k += 1
    return k


def _evidence(tokenizer: Any, root: str, kept: list[tuple[str, str, int]], prompt: str, names) -> dict | None:
    """The nearest kept line before the target that binds one of ``names`` (module docstring)."""
    head = len(PROMPT.split("{context}")[0])
    offsets, pos = [], head
    for text, _, _ in kept:
        offsets.append(pos)
        pos += len(text) + 1
    for i in range(len(kept) - 1, -1, -1):
        text, path, line = kept[i]
        source = read_source(root, path) if line else None
        hit = sorted(bindings(source).get(line, frozenset()) & names) if source is not None else []
        if not hit:
            continue
        start = offsets[i] + len(text) - len(text.lstrip())
        span = token_span(tokenizer, prompt, start, offsets[i] + len(text.rstrip()), add_special_tokens=True)
        end_token = token_span(tokenizer, prompt, pos, len(prompt), add_special_tokens=True)[0]
        return {
            "file": path,
            "line": line,
            "name": hit[0],
            "distance_lines": len(kept) - i,
            "distance_tokens": end_token - span[0],
            "tokens": list(span),
        }
    return None


def _sample(
    tokenizer: Any, root: str, files: tuple[str, ...], length: int, seed: int, index: int
) -> LccSample:
    rng = random.Random(f"lcc:{seed}:{index}")
    target, line = _draw_target(rng, root, files)
    limit = length - MAX_NEW_TOKENS
    lines_back = _backward_lines(root, target, line, _other_files(rng, target.path, files))
    back, want = [], 8 * max(limit, 1)
    while True:
        more, done = _gather(lines_back, want)
        back += more
        k = _fit(tokenizer, back, limit)
        if k < len(back) or done:
            break
        want *= 2
    if k == 0:
        raise ValueError(f"lcc: a length of {length} leaves no room for a line of code; use a larger length")
    kept = back[:k][::-1]
    prompt = _prompt(kept)
    answer = target.lines[line - 1].strip()
    return LccSample(
        index=index,
        length=length,
        prompt=prompt,
        answer=answer,
        target_file=target.path,
        line=line,
        files=list(dict.fromkeys(path for _, path, _ in kept)),
        python_version=python_version(),
        n_prompt_tokens=len(tokenizer(prompt, add_special_tokens=False)["input_ids"]),
        context_lines=k,
        answer_names=sorted(answer_names(target, line)),
        evidence=_evidence(tokenizer, root, kept, prompt, answer_names(target, line)),
    )


def generate_lcc(
    tokenizer: Any, length: int, num_samples: int, seed: int = 42, *, root: str | os.PathLike | None = None
) -> list[LccSample]:
    """``num_samples`` LCC samples of ``length`` tokens (prompt + :data:`MAX_NEW_TOKENS`).

    Args:
        root: the source folder (default: the running Python's stdlib); tests pass a small one.

    Raises:
        ValueError: ``length`` too small for the template, the reserve and one line of code.
    """
    base = str(root if root is not None else stdlib_root())
    files = stdlib_files(base)
    if not files:
        raise ValueError(f"no Python files under {base}")
    return [_sample(tokenizer, base, files, length, seed, i) for i in range(num_samples)]
