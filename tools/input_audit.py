"""Input audit: feed ~300 bad or unusual inputs to sinkwindow the way a new user would, and classify each outcome.

What it checks, in four groups of cases:

- ``cli``: every subcommand's flags (generate, check, models, eval niah/babilong/ppl/lm-eval, compare,
  report, bench, train, calibrate, tune) with negative, zero, huge, non-numeric and empty values and
  unknown units ("4 parsecs", "-5MiB", "1e6"); bad method specs; missing, misnamed (a text file called
  x.gguf) and empty model and checkpoint paths; ``--out`` on an existing file and in a read-only folder;
  duplicate methods; conflicting flags (``--device`` with ``--device-map``); unknown tasks.
- ``api``: ``parse_spec``, ``apply``, ``generate``, ``prefill``, ``make_cache`` and ``load`` with bad
  arguments.
- ``runs``: a finished run folder with a torn last line, a row whose score is ``"abc"``, a duplicated row,
  a corrupt ``fingerprint.json``; then ``sinkwindow report DIR`` and a resume of the same command.
- ``real``: a handful of cases (at most five) that need the packaged SmolLM2 model; the rest run on a
  tiny random Llama folder (``tests/conftest.py:make_tiny_folder``; its words are w1..w100).

Each case runs in its own process with a wall-clock limit (``--timeout``, 120 s) and a 6 GiB
address-space limit, one torch thread, in its own folder under ``OUT/work/ID`` (so relative default
``--out`` folders land there). By default a case is a ``fork`` of one interpreter that has imported the
CLI already (``sinkwindow --help`` alone costs ~12 s of imports on a loaded 2-core machine); ``--fresh``
runs every CLI case as a real ``sinkwindow`` process instead. Cases whose environment is read at import
time (``HF_HUB_OFFLINE``) and the read-only-folder cases always run as real processes; the read-only
ones without CAP_DAC_OVERRIDE (``setpriv``), since root ignores a chmod 555.

Classes (``audit.jsonl``: one line per case; ``summary.json``: the counts and the non-clear cases):

- ``clear``: refused (nonzero exit, or for the API one of ValueError / TypeError / FileNotFoundError /
  KeyError with a message) with one line that names the problem, no traceback;
- ``traceback``: the CLI printed a Python traceback, or the API raised another exception type;
- ``accepted``: exit 0, and accepting it is right;
- ``silent-wrong``: exit 0 although the input is bad, or a result computed from it is wrong;
- ``hang``: not finished within the timeout;
- ``misleading``: a one-line refusal that does not name the problem (none of the case's expected words:
  the flag or the value), names the wrong one, or refuses a valid input.

    .venv/bin/python tools/input_audit.py                 # all cases -> /tmp/audit
    .venv/bin/python tools/input_audit.py --only spec-    # cases whose id contains 'spec-'
    .venv/bin/python tools/input_audit.py --list          # ids and command lines, runs nothing

Re-running replaces the rows of the cases it ran and keeps the others, then rewrites the summary.
Every case gets ``SINKWINDOW_ALLOW_DIRTY=1`` (the audit is about inputs, and the checkout may have
uncommitted changes while it runs) and ``HF_HUB_OFFLINE=1`` unless the case says otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SINKWINDOW = REPO / ".venv" / "bin" / "sinkwindow"
CLASSES = ("clear", "traceback", "accepted", "silent-wrong", "hang", "misleading")
MEMORY_LIMIT = 6 * 2**30  # address space of one case; the machine's other jobs need the rest
HUGE = "99999999999999999999"
PROMPT = " ".join(f"w{i}" for i in range(2, 22))  # 20 tokens of the tiny model's word-level vocabulary
# The real model (SmolLM2-135M) in at most this many cases; every other case uses the tiny folder.
REAL_MODEL_CASES = 5

# Every case's environment: one thread, offline (a hub id must not wait on a network), and a source tree
# with uncommitted changes allowed (another engineer may be editing src/ while the audit runs).
BASE_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "SINKWINDOW_ALLOW_DIRTY": "1",
    "MPLBACKEND": "Agg",
    "PYTHONWARNINGS": "ignore",
}


@dataclass
class Case:
    """One input. ``argv`` (a CLI command line without the program) or ``code`` (Python, API cases).

    ``expect``: ``refuse`` (bad input: exit 0 is silent-wrong), ``accept`` (valid: a refusal is
    misleading) or ``either`` (judged by ``check`` when accepted). ``names``: words one of which a clear
    refusal's message must contain (case-insensitive); ``wrong_words``: phrases that make it misleading
    (a wrong diagnosis or a fix that does not work, found by reading the message). ``check(result)`` returns why an accepted case's
    output is wrong, or None. ``setup(case_dir)`` prepares files before the case runs.
    """

    id: str
    category: str
    argv: list[str] | None = None
    code: str | None = None
    expect: str = "refuse"
    names: tuple[str, ...] = ()
    wrong_words: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    mode: str = "fork"  # fork | process | readonly
    setup: Callable[[Path], None] | None = None
    check: Callable[[Result], str | None] | None = None
    note: str = ""


@dataclass
class Result:
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool
    workdir: Path
    api: dict | None = None

    def last_json(self) -> dict | None:
        for line in reversed(self.stdout.strip().splitlines()):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
        return None


class Paths:
    """Where the audit keeps its fixtures and outputs."""

    def __init__(self, out: Path):
        self.out = out
        self.fix = out / "fixtures"
        self.tiny = out / "model" / "tiny"
        self.work = out / "work"
        self.cache = out / "cache"
        self.base_run = self.fix / "base-run"
        self.lmdata = self.fix / "lmdata"
        self.readonly = self.fix / "readonly"

    def fill(self, text: str, workdir: Path) -> str:
        return (
            text.replace("{TINY}", str(self.tiny))
            .replace("{FIX}", str(self.fix))
            .replace("{W}", str(workdir))
            .replace("{RUN}", str(self.base_run))
            .replace("{LM}", str(self.lmdata))
            .replace("{RO}", str(self.readonly))
        )


# Base commands: small valid runs on the tiny model; a flag case changes or adds one flag.
def base(cmd: str) -> list[str]:
    tiny = ["--model", "{TINY}"]
    run = ["--threads", "1", "--no-progress", "--out", "{W}/out"]
    return {
        "generate": ["generate", *tiny, "--method", "swa:8:2", "--prompt", PROMPT, "--max-new-tokens", "4",
                     "--no-progress"],
        "check": ["check", *tiny, "--method", "swa:8:2"],
        "ppl": ["eval", "ppl", *tiny, "--methods", "full,swa:8:2", "--lengths", "16", "--samples", "1", *run],
        "niah": ["eval", "niah", *tiny, "--methods", "swa:8:2", "--tasks", "niah_single_1", "--lengths", "256",
                 "--samples", "1", "--niah-max-new-tokens", "4", *run],
        "babilong": ["eval", "babilong", *tiny, "--methods", "swa:8:2", "--tasks", "babilong_qa1", "--lengths",
                     "0", "--samples", "1", *run],
        "lm-eval": ["eval", "lm-eval", *tiny, "--methods", "swa:8:2", "--tasks", "arc_easy", "--data-dir", "{LM}",
                    "--limit", "2", "--threads", "1", "--out", "{W}/out"],
        "compare": ["compare", *tiny, "--methods", "full,swa:8:2", "--samples", "1", "--threads", "1",
                    "--no-progress", "--dry-run", "--out", "{W}/out"],
        "bench": ["bench", "--model", "synthetic", "--methods", "swa:8:2", "--contexts", "32", "--prefill-contexts",
                  "none", "--steps", "2", "--warmup", "0", "--layers", "1", "--hidden", "64", "--heads", "2",
                  "--intermediate", "128", "--vocab", "128", "--bandwidth-mib", "0", "--no-plots", "--threads", "1",
                  "--device", "cpu", "--out", "{W}/out"],
        "train": ["train", *tiny, "--method", "lolcats:8", "--data", "essays", "--tokens", "1k", "--seq-len", "64",
                  "--grad-accum", "1", "--eval-every", "4", "--save-every", "4", "--val-batches", "1", *run],
        "calibrate": ["calibrate", *tiny, "--method", "swa:8:2", "--full-layers", "1", "--samples", "1",
                      "--length", "256", *run],
        "tune": ["tune", *tiny, "--kv-budget", "64KiB", "--context", "256", "--task", "ppl", "--windows", "16",
                 "--sinks", "4", "--max-k", "1", "--samples", "1", "--heldout-samples", "1", "--calib-samples", "1",
                 "--calib-length", "256", *run],
    }[cmd]  # fmt: skip


def with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag`` set to ``value`` (replaced where present, else appended); the value is
    passed as its own word, as a shell user types ``--flag VALUE``."""
    argv = list(argv)
    if flag in argv:
        i = argv.index(flag)
        argv[i + 1] = value
        return argv
    return [*argv, flag, value]


def without(argv: list[str], *flags: str) -> list[str]:
    argv = list(argv)
    for flag in flags:
        if flag in argv:
            i = argv.index(flag)
            del argv[i : i + 2]
    return argv


def drop(argv: list[str], flag: str) -> list[str]:
    """``argv`` without the boolean ``flag``."""
    return [a for a in argv if a != flag]


def _unmentioned(flag: str) -> Callable[[Result], str | None]:
    """For a flag the command may ignore: wrong when it finished without naming the flag."""

    def check(r: Result) -> str | None:
        text = (r.stderr + r.stdout).replace(str(r.workdir), "")  # the case folder's name holds the flag
        said = re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text)
        return None if said else f"{flag} was ignored without a word"

    return check


def _json_field_is(key: str, want) -> Callable[[Result], str | None]:
    def check(r: Result) -> str | None:
        info = r.last_json() or {}
        got = info.get(key)
        return None if got == want else f"JSON {key} = {got!r}, expected {want!r}"

    return check


def _results_at_least(n: int) -> Callable[[Result], str | None]:
    def check(r: Result) -> str | None:
        info = r.last_json() or {}
        got = info.get("results")
        return None if isinstance(got, int) and got >= n else f"{got!r} results stored, asked for {n}"

    return check


# Flag kinds: which values are valid. A kind is (parse, minimum); None: not a number at all.
def _as_int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _as_size(text: str) -> int | None:
    text = text.strip()
    scale = 1
    if text[-1:].lower() in ("k", "m"):
        scale = 1024 if text[-1].lower() == "k" else 1024**2
        text = text[:-1]
    try:
        value = float(text.replace("_", "")) * scale
    except ValueError:
        return None
    if "e" in text.lower() or value != value or abs(value) == float("inf") or value != int(value):
        return None
    return int(value)


def _as_real(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None


KINDS = {
    # kind: (parser, is_valid(value))
    "int1": (_as_int, lambda v: v >= 1),
    "int0": (_as_int, lambda v: v >= 0),
    "size1": (_as_size, lambda v: v >= 1),
    "size0": (_as_size, lambda v: v >= 0),
    "real+": (_as_real, lambda v: v > 0),
    "real0": (_as_real, lambda v: v >= 0),
}

# Bad values, by group: the audit gives each flag one value of each group, in turn, so that every
# value meets several flags.
BOUNDARY = ["0", "-3", "-1"]
GARBAGE = ["abc", "", "4 parsecs", "nan", "inf"]
UNITS = ["-5MiB", "1e6", "1.5", "4k", "0x10", " 7 "]

# (command, flag, kind, huge-ok) for every numeric flag; huge-ok: the HUGE value is also tried.
FLAGS = [
    ("generate", "--max-new-tokens", "int1", True),
    ("generate", "--chunk-size", "int1", False),
    ("check", "--seq-len", "int1", True),
    ("check", "--layers", "int1", False),
    ("check", "--seed", "int0", False),
    ("ppl", "--samples", "int1", True),
    ("ppl", "--batch-size", "int1", False),
    ("ppl", "--threads", "int1", True),
    ("ppl", "--lengths", "size1", True),
    ("ppl", "--workers", "int1", False),
    ("niah", "--lengths", "size1", False),
    ("niah", "--niah-max-new-tokens", "int1", True),
    ("babilong", "--lengths", "size0", False),
    ("lm-eval", "--limit", "real+", False),
    ("lm-eval", "--num-fewshot", "int0", True),
    ("lm-eval", "--max-length", "int1", False),
    ("lm-eval", "--max-batch-tokens", "int0", False),
    ("compare", "--samples", "int1", True),
    ("compare", "--short-limit", "int1", False),
    ("bench", "--contexts", "size1", True),
    ("bench", "--prefill-contexts", "size1", False),
    ("bench", "--steps", "int1", True),
    ("bench", "--warmup", "int0", False),
    ("bench", "--real-prefill-max", "size0", False),
    ("bench", "--time-cap", "real+", False),
    ("bench", "--mem-budget-gib", "real+", False),
    ("bench", "--bandwidth-mib", "int0", False),
    ("bench", "--layers", "int1", False),
    ("bench", "--hidden", "int1", True),
    ("bench", "--heads", "int1", False),
    ("bench", "--vocab", "int1", False),
    ("train", "--tokens", "size1", True),
    ("train", "--transfer-tokens", "size0", False),
    ("train", "--finetune-tokens", "size0", False),
    ("train", "--seq-len", "int1", False),
    ("train", "--grad-accum", "int1", False),
    ("train", "--lr-transfer", "real+", False),
    ("train", "--lora-r", "int1", True),
    ("train", "--lora-alpha", "real+", False),
    ("train", "--eval-every", "int1", False),
    ("train", "--layer-group", "int1", False),
    ("train", "--max-minutes", "real+", False),
    ("calibrate", "--full-layers", "int1", True),
    ("calibrate", "--samples", "int1", False),
    ("calibrate", "--length", "size1", False),
    ("calibrate", "--last-queries", "int1", False),
    ("calibrate", "--seed", "int0", False),
    ("tune", "--kv-budget", "real+", False),
    ("tune", "--context", "size1", True),
    ("tune", "--windows", "size1", False),
    ("tune", "--sinks", "int0", False),
    ("tune", "--max-k", "int0", False),
    ("tune", "--samples", "int1", False),
    ("tune", "--calib-length", "size1", False),
    ("tune", "--heldout-seed", "int0", False),
]

# Minimums beyond the kind (a value the kind allows that the flag refuses on purpose, with a reason).
FLAG_MINIMUM = {
    ("ppl", "--lengths"): 2,
    ("niah", "--lengths"): 256,
    ("babilong", "--lengths"): 400,  # or 0
    ("calibrate", "--length"): 256,
    ("check", "--seq-len"): 10,  # W + 2 for swa:8:2
    ("tune", "--windows"): 2,
}
# Values the flag refuses on purpose although its kind allows them.
FLAG_REFUSES = {
    ("calibrate", "--seed"): lambda v: v <= 999_999,  # evaluation's seeds
    ("tune", "--heldout-seed"): lambda v: v <= 999_999,
    ("niah", "--niah-max-new-tokens"): lambda v: v > 128,
    ("bench", "--vocab"): lambda v: v < 2,
    ("train", "--seq-len"): lambda v: v < 2,
    ("tune", "--windows"): lambda v: v >= 256,  # every window must be below --context 256
    ("tune", "--kv-budget"): lambda v: True,  # a byte size: tried with units of its own below
}


# The tiny model's max_position_embeddings, and the flags whose value is a context on it.
TINY_CONTEXT = 1024
CONTEXT_FLAGS = {("ppl", "--lengths"), ("niah", "--lengths"), ("babilong", "--lengths"), ("calibrate", "--length"),
                 ("tune", "--context"), ("tune", "--calib-length"), ("train", "--seq-len"), ("check", "--seq-len")}  # fmt: skip


def expectation(cmd: str, flag: str, kind: str, value: str) -> str:
    """``accept`` when ``value`` is a valid value of the flag, else ``refuse``."""
    parse, ok = KINDS[kind]
    parsed = parse(value) if value.strip() else None
    if parsed is None or not ok(parsed):
        return "refuse"
    if (cmd, flag) == ("babilong", "--lengths") and parsed == 0:
        return "accept"
    if parsed < FLAG_MINIMUM.get((cmd, flag), parsed):
        return "refuse"
    if FLAG_REFUSES.get((cmd, flag), lambda v: False)(parsed):
        return "refuse"
    if (cmd, flag) in CONTEXT_FLAGS and parsed > TINY_CONTEXT:
        return "refuse"  # past the tiny model's positions: a refusal must say so
    return "accept"


def flag_cases() -> list[Case]:
    cases = []
    for i, (cmd, flag, kind, huge_ok) in enumerate(FLAGS):
        odd = GARBAGE + UNITS
        values = [BOUNDARY[i % len(BOUNDARY)], odd[i % len(odd)]]
        if huge_ok:
            values.append(HUGE)
        for value in values:
            argv = with_flag(base(cmd), flag, value)
            expect = expectation(cmd, flag, kind, value)
            names = (flag, value.strip() or "empty") if value.strip() else (flag,)
            if (cmd, flag) in CONTEXT_FLAGS:
                names += ("positions", "limit")
            check = None
            if value == HUGE:
                expect = "either"
                check = _huge_check(cmd, flag)
            cases.append(
                Case(
                    id=f"flag-{cmd}{flag}={value.strip() or 'EMPTY'}".replace(" ", "_"),
                    category="cli-flag",
                    argv=argv,
                    expect=expect,
                    names=names,
                    check=check,
                )
            )
    # Byte sizes of tune --kv-budget, and the byte-size flags' own units.
    for value, expect in [("-5MiB", "refuse"), ("4 parsecs", "refuse"), ("24 MiB", "accept"), ("1e6", "refuse"),
                          ("5", "either")]:  # fmt: skip
        cases.append(
            Case(
                id=f"flag-tune--kv-budget={value}".replace(" ", "_"),
                category="cli-flag",
                argv=with_flag(base("tune"), "--kv-budget", value),
                expect=expect,
                names=("--kv-budget", "budget", value),
                note="5 bytes holds no KV cache at all: a refusal naming the budget is right"
                if value == "5"
                else "",
            )
        )
    return cases


def _huge_check(cmd: str, flag: str) -> Callable[[Result], str | None] | None:
    """How to judge a command that accepted ``flag HUGE`` and finished."""

    def check(r: Result) -> str | None:
        info = r.last_json() or {}
        if cmd == "generate" and flag == "--max-new-tokens":
            return f"finished with {info.get('new_tokens')} new tokens for {HUGE} asked, no message"
        if cmd in ("ppl", "niah", "babilong") and flag == "--samples":
            return f"finished with {info.get('results')} results for {HUGE} samples asked"
        if cmd == "compare" and flag == "--samples":
            return f"the dry run priced {HUGE} samples per cell without a word: {r.stdout.strip()[-200:]}"
        if cmd == "bench" and flag == "--steps":
            return None if "skip" in (r.stdout + r.stderr).lower() else "timed 1e20 steps in seconds?"
        return None  # accepted; a huge chunk, batch or seed is harmless

    return check


def spec_cases() -> list[Case]:
    """Method specs, through the flags that take them and through parse_spec."""
    bad = ["swa:", "swa:0:4", "swa:8:9", "swa:8:8", "swa:+64", "liger:0", "full:3", "swa:8:2+full:99",
           "evict:8:2:bogus", "", "swa:8:2+full:1,1", "swa:8:2+full:1.9", "swa:8:-1", "swa:8.5:2", "lolcats:8:2",
           "swa:8:2@", "swa:8:2@Bad_Name", "swa:99999999999", "swa:8:2,,full", "sliding:8"]  # fmt: skip
    good = ["SWA:8:4", "swa:8", "swa:8:2:CACHE", "swa:8:2+full:1,0"]
    cases = []
    for spec in bad:
        cases.append(
            Case(
                id=f"spec-ppl={spec or 'EMPTY'}".replace(" ", "_"),
                category="cli-spec",
                argv=with_flag(base("ppl"), "--methods", spec),
                names=("method", "spec", "window", "sinks", "layer", spec.strip() or "empty"),
            )
        )
    for spec in good:
        cases.append(
            Case(
                id=f"spec-ppl-good={spec}".replace(" ", "_"),
                category="cli-spec",
                argv=with_flag(base("ppl"), "--methods", spec),
                expect="accept",
                check=_spec_row_check(spec),
            )
        )
    # The other commands' --method with a spec each of them does not run.
    for cmd, spec, names in [
        ("generate", "swa:8:9", ("sinks", "window")),
        ("generate", "lolcats:8", ("checkpoint", "lolcats", "train")),
        ("generate", "swa:8:2+full:99", ("layer", "99")),
        ("check", "evict:8:2", ("swa", "evict")),
        ("train", "swa:8:2+full:1", ("not trained", "swa", "hybrid")),
        ("train", "evict:8:2", ("not trained", "evict")),
        ("calibrate", "evict:8:2", ("swa", "evict")),
        ("calibrate", "swa:8:2+full:1", ("full units", "plain")),
        ("bench", "peer:bogus", ("peer",)),
        ("bench", "swa:8:9", ("sinks", "window")),
    ]:
        flag = "--methods" if cmd == "bench" else "--method"
        cases.append(
            Case(
                id=f"spec-{cmd}={spec}",
                category="cli-spec",
                argv=with_flag(base(cmd), flag, spec),
                names=names,
            )
        )
    return cases


def _spec_row_check(spec: str) -> Callable[[Result], str | None]:
    want = {"SWA:8:4": "swa:8:4", " swa:8:2 ": "swa:8:2", "swa:8": "swa:8:4", "swa:8:2:CACHE": "swa:8:2:cache",
            "swa:8:0": "swa:8:0", "swa:8:2+full:1,0": "swa:8:2+full:0,1"}[spec]  # fmt: skip

    def check(r: Result) -> str | None:
        rows = _rows(r.workdir / "out" / "results.jsonl")
        methods = sorted({row.get("method") for row in rows})
        return None if methods == [want] else f"rows hold methods {methods}, expected [{want!r}]"

    return check


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def path_cases() -> list[Case]:
    """Model and checkpoint paths, data folders, --out, devices and dtypes."""
    cases = []
    models = [
        ("nonexistent", "/tmp/audit/no/such/folder", ("/tmp/audit/no/such/folder", "not found", "no such")),
        ("gguf-text", "{FIX}/x.gguf", ("gguf", "x.gguf")),
        ("empty-folder", "{FIX}/empty", ("empty", "config")),
        ("text-file", "{FIX}/file.txt", ("file.txt",)),
        ("hub-id-offline", "no-such-org/no-such-model", ("no-such-org/no-such-model", "offline")),
        ("packaged-typo", "smollm2-136m", ("smollm2-136m",)),
        ("dot", ".", ("config", "'.'", " . ")),
    ]
    for cmd in ("generate", "check", "ppl", "train", "calibrate"):
        for key, model, names in models:
            if (cmd != "generate" and key not in ("nonexistent", "gguf-text", "empty-folder")) or (
                cmd in ("train", "calibrate") and key != "nonexistent"
            ):
                continue  # once is enough for the others
            cases.append(
                Case(
                    id=f"path-{cmd}--model={key}",
                    category="cli-path",
                    argv=with_flag(base(cmd), "--model", model),
                    names=names,
                    # The file exists: "no ... file at" sends the user to check a path that is right.
                    wrong_words=("no model folder or file at",) if key == "text-file" else (),
                )
            )
    cases.append(
        Case(
            id="path-bench--model=nonexistent",
            category="cli-path",
            argv=with_flag(base("bench"), "--model", "/tmp/audit/no/such/folder"),
            names=("/tmp/audit/no/such/folder", "not found"),
            note="bench skips a model it cannot load, with a WARNING; with no model left it still exits 0",
        )
    )
    cases.append(
        Case(
            id="path-generate--model=empty-string",
            category="cli-path",
            argv=with_flag(base("generate"), "--model", ""),
            names=("--model", "empty"),
        )
    )
    # Checkpoints.
    lolcats_gen = with_flag(base("generate"), "--method", "lolcats:8")
    for key, value, names in [
        ("empty-folder", "{FIX}/empty", ("empty", "checkpoint", "safetensors")),
        ("nonexistent", "/tmp/audit/no/ckpt", ("/tmp/audit/no/ckpt",)),
        ("gguf-text", "{FIX}/x.gguf", ("x.gguf", "checkpoint", "safetensors")),
        ("text-safetensors", "{FIX}/bad.safetensors", ("bad.safetensors", "safetensors")),
        ("method-eq-empty", "lolcats:8=", ("path",)),
        ("eq-path", "={FIX}/empty", ("method", "=")),
        ("untrained-method", "swa:8:2={FIX}/empty", ("takes no checkpoint", "swa:8:2")),
        ("other-method", "liger:8={FIX}/empty", ("liger", "checkpoint", "empty")),
    ]:
        cases.append(
            Case(
                id=f"path-generate--checkpoint={key}",
                category="cli-path",
                argv=[*lolcats_gen, "--checkpoint", value],
                names=names,
                # A text file is neither empty nor truncated, and training again is not the fix.
                wrong_words=("empty or truncated",) if key in ("gguf-text", "text-safetensors") else (),
            )
        )
    cases.append(
        Case(
            id="path-ppl--checkpoint-without-trained-method",
            category="cli-path",
            argv=[*base("ppl"), "--checkpoint", "{FIX}/bad.safetensors"],
            names=("checkpoint", "bad.safetensors"),
        )
    )
    # --out on an existing file, a read-only folder, and odd places.
    for cmd in ("ppl", "compare", "bench", "train", "calibrate", "tune", "lm-eval"):
        cases.append(
            Case(
                id=f"path-{cmd}--out=existing-file",
                category="cli-out",
                argv=with_flag(base(cmd), "--out", "{FIX}/file.txt"),
                names=("file.txt", "--out", "file"),
            )
        )
    for cmd in ("ppl", "bench", "train", "tune"):
        cases.append(
            Case(
                id=f"path-{cmd}--out=read-only-folder",
                category="cli-out",
                argv=with_flag(base(cmd), "--out", "{RO}/run"),
                names=("permission", "read-only", "{RO}"),
                mode="readonly",
            )
        )
    cases += [
        Case(id="path-ppl--out=empty", category="cli-out", argv=with_flag(base("ppl"), "--out", ""),
             names=("--out", "empty")),
        Case(id="path-ppl--out=under-a-file", category="cli-out",
             argv=with_flag(base("ppl"), "--out", "{FIX}/file.txt/run"), names=("file.txt", "not a directory")),
        Case(id="path-compare-default-out-is-relative", category="cli-out",
             argv=without(base("compare"), "--out"), expect="accept",
             note="--dry-run with the default --out runs/compare (relative: lands in the case folder)"),
    ]  # fmt: skip
    # Data folders and files.
    cases += [
        Case(id="path-train--data=nonexistent", category="cli-path",
             argv=with_flag(base("train"), "--data", "/tmp/audit/no/data.jsonl"), names=("data.jsonl",)),
        Case(id="path-train--data=empty-file", category="cli-path",
             argv=with_flag(base("train"), "--data", "{FIX}/empty.jsonl"), names=("empty.jsonl", "empty", "rows")),
        Case(id="path-train--data=folder", category="cli-path",
             argv=with_flag(base("train"), "--data", "{FIX}/empty"), names=("folder",)),
        Case(id="path-train--data=gguf-text", category="cli-path",
             argv=with_flag(base("train"), "--data", "{FIX}/x.gguf"), expect="either", names=("x.gguf",)),
        Case(id="path-train--data=bad-jsonl", category="cli-path",
             argv=with_flag(base("train"), "--data", "{FIX}/bad.jsonl"), names=("bad.jsonl",),
             note="the torn row is line 2 of the file"),
        Case(id="path-train--start-from=nonexistent", category="cli-path",
             argv=[*base("train"), "--start-from", "/tmp/audit/no/best.safetensors"], names=("best.safetensors",)),
        Case(id="path-train--start-from=empty-folder", category="cli-path",
             argv=[*base("train"), "--start-from", "{FIX}/empty"], names=("empty", "safetensors", "checkpoint")),
        Case(id="path-babilong--babilong-data=empty-folder", category="cli-path",
             argv=[*base("babilong"), "--babilong-data", "{FIX}/empty"], names=("empty", "qa1", "babilong")),
        Case(id="path-compare--short-data=nonexistent", category="cli-path",
             argv=[*base("compare"), "--short-data", "/tmp/audit/no/short"], names=("/tmp/audit/no/short",)),
        Case(id="path-lm-eval--data-dir=empty-folder", category="cli-path",
             argv=with_flag(base("lm-eval"), "--data-dir", "{FIX}/empty"), names=("arc_easy", "empty")),
        Case(id="path-compare--reference-run=empty-folder", category="cli-path",
             argv=[*base("compare"), "--reference-run", "{FIX}/empty"], names=("results.jsonl", "empty")),
        Case(id="path-report=nonexistent", category="cli-path", argv=["report", "/tmp/audit/no/run"],
             names=("/tmp/audit/no/run",)),
        Case(id="path-report=empty-folder", category="cli-path", argv=["report", "{FIX}/empty"],
             names=("results.jsonl", "empty", "no results")),
        Case(id="path-report=a-file", category="cli-path", argv=["report", "{FIX}/file.txt"],
             names=("file.txt", "folder")),
        Case(id="path-bench--report-only=empty-folder", category="cli-path",
             argv=["bench", "--report-only", "--out", "{FIX}/empty"], names=("bench.jsonl",)),
    ]  # fmt: skip
    # Devices, device maps and dtypes.
    for cmd, flag, value, names in [
        ("generate", "--device", "cuda", ("cuda",)),
        ("generate", "--device", "cuda:7", ("cuda",)),
        ("generate", "--device", "mps", ("mps",)),
        ("generate", "--device", "gpu", ("gpu", "--device")),
        ("ppl", "--device", "tpu", ("tpu", "--device")),
        ("generate", "--dtype", "int8", ("int8", "--dtype")),
        ("bench", "--dtype", "float64", ("float64", "--dtype")),
        ("check", "--device-map", "bogus", ("bogus", "device map", "--device-map")),
        ("ppl", "--device-map", "{FIX}/bad-map.json", ("bad-map.json", "json", "device")),
        ("ppl", "--device-map", "{FIX}/file.txt", ("file.txt", "device map", "json")),
        ("bench", "--device", "cuda", ("cuda",)),
    ]:
        cases.append(
            Case(
                id=f"path-{cmd}{flag}={value or 'EMPTY'}".replace("/", "_"),
                category="cli-device",
                argv=with_flag(base(cmd), flag, value),
                names=names,
            )
        )
    return cases


def conflict_cases() -> list[Case]:
    """Conflicting, duplicated and unknown options; unknown tasks; commands used wrongly."""
    ppl = base("ppl")
    c = [
        Case(id="conflict-check--device+--device-map", category="cli-conflict",
             argv=[*base("check"), "--device", "cpu", "--device-map", "auto"], names=("--device-map", "--device")),
        Case(id="conflict-ppl--device+--device-map", category="cli-conflict",
             argv=[*ppl, "--device", "cpu", "--device-map", "sequential"], names=("--device-map", "--device")),
        Case(id="conflict-compare--quick+--full", category="cli-conflict", argv=[*base("compare"), "--quick", "--full"],
             names=("--full", "--quick")),
        Case(id="conflict-ppl--new-run+--redo", category="cli-conflict", argv=[*ppl, "--new-run", "--redo", "full"],
             names=("--redo", "--new-run")),
        Case(id="conflict-ppl--workers+--ray", category="cli-conflict", argv=[*ppl, "--workers", "2", "--ray", "x:1"],
             names=("--ray", "--workers")),
        Case(id="conflict-calibrate--full-layers+--full-heads", category="cli-conflict",
             argv=[*base("calibrate"), "--full-heads", "1"], names=("--full-heads", "--full-layers")),
        Case(id="conflict-calibrate-neither-K", category="cli-conflict",
             argv=without(base("calibrate"), "--full-layers"), names=("--full-layers", "--full-heads")),
        Case(id="conflict-train--no-finetune+--finetune-tokens", category="cli-conflict",
             argv=[*base("train"), "--no-finetune", "--finetune-tokens", "2k"], expect="either",
             names=("--no-finetune", "--finetune-tokens"),
             note="--finetune-tokens 2k silently dropped by --no-finetune would be silent-wrong",
             check=_unmentioned("--finetune-tokens")),
        Case(id="conflict-train--paper-budget+--tokens", category="cli-conflict",
             argv=[*base("train"), "--paper-budget", "--max-minutes", "0.05"], expect="either",
             names=("--paper-budget", "--tokens"),
             note="--tokens 1k given and --paper-budget: which wins is not said", check=_unmentioned("--tokens")),
        Case(id="conflict-train-liger--transfer-tokens", category="cli-conflict",
             argv=[*with_flag(base("train"), "--method", "liger:8"), "--transfer-tokens", "2k"], expect="either",
             names=("--transfer-tokens", "liger"),
             note="liger:W has no transfer stage: --transfer-tokens ignored silently would be silent-wrong",
             check=_unmentioned("--transfer-tokens")),
        Case(id="conflict-calibrate--pool-without-greedy", category="cli-conflict",
             argv=[*base("calibrate"), "--pool", "2"], expect="either", names=("--pool", "greedy"),
             note="--pool only means something with --select greedy"),
        Case(id="conflict-calibrate--pool-below-K", category="cli-conflict",
             argv=[*with_flag(base("calibrate"), "--full-layers", "2"), "--select", "greedy", "--pool", "1"],
             names=("--pool",)),
        Case(id="conflict-calibrate--full-layers-above-model", category="cli-conflict",
             argv=with_flag(base("calibrate"), "--full-layers", "5"), names=("--full-layers", "layers", "5")),
        Case(id="conflict-tune--max-k-above-model", category="cli-conflict",
             argv=with_flag(base("tune"), "--max-k", "50"), expect="either", names=("--max-k", "50", "layers")),
        Case(id="conflict-tune--calib-length-above-model", category="cli-conflict",
             argv=with_flag(with_flag(base("tune"), "--calib-length", "4k"), "--task", "niah"),
             names=("4096", "--calib-length", "position", "context"), wrong_words=("positions='cache'",),
             note="tune takes no method spec, so streaming with positions='cache' is not a fix it can use"),
        Case(id="conflict-tune--windows-above-context", category="cli-conflict",
             argv=with_flag(base("tune"), "--windows", "512"), names=("--windows", "context")),
        Case(id="conflict-tune--seed=heldout", category="cli-conflict",
             argv=[*base("tune"), "--seed", "8000000", "--heldout-seed", "8000000"], names=("--heldout-seed", "seed"),
             wrong_words=("use e.g. --heldout-seed 8000000",), note="the suggested seed is the one refused"),
        Case(id="conflict-bench--kv-heads-not-dividing", category="cli-conflict",
             argv=with_flag(with_flag(base("bench"), "--heads", "4"), "--kv-heads", "3"),
             names=("--kv-heads", "--heads", "divide")),
        Case(id="conflict-bench--hidden-huge-even", category="cli-conflict",
             argv=with_flag(base("bench"), "--hidden", "100000000000000000000"), expect="either",
             names=("--hidden", "memory", "budget"), note="a huge hidden size that the heads divide"),
        Case(id="conflict-bench--hidden-not-divisible", category="cli-conflict",
             argv=with_flag(base("bench"), "--hidden", "65"), names=("--hidden", "--heads", "divis")),
        Case(id="conflict-bench--report-only+--new-run", category="cli-conflict",
             argv=[*base("bench"), "--report-only", "--new-run"], expect="either", names=("--report-only", "--new-run")),
        Case(id="conflict-ppl--redo-method-not-asked", category="cli-conflict", argv=[*ppl, "--redo", "swa:8:4"],
             names=("--redo", "swa:8:4")),
        Case(id="conflict-generate--chat-without-template", category="cli-conflict",
             argv=[*base("generate"), "--chat"], expect="either", names=("--chat", "chat template"),
             check=lambda r: None if "chat" in r.stderr.lower() else "--chat ignored without a word: the tiny "
             "tokenizer has no chat template, and the prompt ran unwrapped"),
        Case(id="conflict-check--seq-len-above-model", category="cli-conflict",
             argv=with_flag(base("check"), "--seq-len", "2000"), names=("2000", "position", "--seq-len")),
        Case(id="conflict-check--layers-above-model", category="cli-conflict",
             argv=with_flag(base("check"), "--layers", "50"), expect="either", names=("--layers", "50", "layers"),
             check=lambda r: None if "3" in r.stderr or "layers" in r.stdout.lower() else "--layers 50 on a 3-layer model"),
        Case(id="conflict-generate--max-new-tokens-above-model", category="cli-conflict",
             argv=with_flag(base("generate"), "--max-new-tokens", "2000"), names=("1024", "position", "context")),
        Case(id="conflict-ppl--lengths-above-model", category="cli-conflict",
             argv=with_flag(base("ppl"), "--lengths", "2k"), names=("2048", "1024", "position", "context")),
        Case(id="conflict-niah--lengths-above-model", category="cli-conflict",
             argv=with_flag(base("niah"), "--lengths", "2k"), names=("2048", "1024", "position", "context")),
        Case(id="conflict-compare-run-above-model", category="cli-conflict",
             argv=drop(base("compare"), "--dry-run"), names=("2048", "1024", "position", "context")),
        Case(id="conflict-lm-eval--max-length-above-model", category="cli-conflict",
             argv=with_flag(base("lm-eval"), "--max-length", "100000"), expect="either",
             names=("--max-length", "1024")),
        Case(id="conflict-lm-eval--limit-task-not-asked", category="cli-conflict",
             argv=with_flag(base("lm-eval"), "--limit", "piqa=2"), names=("piqa", "--limit")),
        Case(id="conflict-lm-eval--limit-bad-pair", category="cli-conflict",
             argv=with_flag(base("lm-eval"), "--limit", "arc_easy=x"), names=("arc_easy=x", "--limit")),
        Case(id="conflict-lm-eval--limit-fraction-1", category="cli-conflict",
             argv=with_flag(base("lm-eval"), "--limit", "1.0"), expect="either", names=("--limit", "1.0")),
        # Duplicate methods.
        Case(id="dup-ppl-full,full", category="cli-dup", argv=with_flag(ppl, "--methods", "full,full"),
             names=("twice", "full")),
        Case(id="dup-ppl-canonical", category="cli-dup", argv=with_flag(ppl, "--methods", "swa:8,swa:8:4"),
             names=("twice", "swa:8:4")),
        Case(id="dup-ppl-repeated-flag", category="cli-dup", argv=[*with_flag(ppl, "--methods", "swa:8:2"),
             "--methods", "SWA:8:2"], names=("twice", "swa:8:2")),
        Case(id="dup-ppl-absolute-alias", category="cli-dup",
             argv=with_flag(ppl, "--methods", "swa:8:2,swa:8:2:absolute"), names=("twice", "swa:8:2")),
        Case(id="dup-ppl-hybrid-order", category="cli-dup",
             argv=with_flag(ppl, "--methods", "swa:8:2+full:0,1,swa:8:2+full:1,0"), names=("twice", "swa:8:2+full:0,1")),
        Case(id="dup-generate-two-checkpoints", category="cli-dup",
             argv=[*with_flag(base("generate"), "--method", "lolcats:8"), "--checkpoint", "{FIX}/ckpt.safetensors",
                   "--checkpoint", "{FIX}/ckpt2.safetensors"], names=("checkpoint", "twice", "lolcats:8")),
        Case(id="dup-ppl-lengths", category="cli-dup", argv=with_flag(ppl, "--lengths", "16,16"),
             names=("twice", "16")),
        Case(id="dup-ppl-lengths-alias", category="cli-dup", argv=with_flag(ppl, "--lengths", "1k,1024"),
             names=("twice", "1024")),
        Case(id="dup-niah-tasks", category="cli-dup", argv=with_flag(base("niah"), "--tasks",
             "niah_single_1,niah_single_1"), expect="accept", note="a repeated task runs once: harmless"),
        # Unknown tasks.
        Case(id="task-niah=bogus", category="cli-task", argv=with_flag(base("niah"), "--tasks", "bogus"),
             names=("bogus",)),
        Case(id="task-niah=empty", category="cli-task", argv=with_flag(base("niah"), "--tasks", ""),
             names=("--tasks", "task")),
        Case(id="task-babilong=qa1", category="cli-task", argv=with_flag(base("babilong"), "--tasks", "qa1"),
             names=("qa1",)),
        Case(id="task-ppl=niah_single_1", category="cli-task", argv=with_flag(base("ppl"), "--tasks",
             "niah_single_1"), names=("niah_single_1",)),
        Case(id="task-lm-eval=bogus", category="cli-task", argv=with_flag(base("lm-eval"), "--tasks", "bogus"),
             names=("bogus",)),
        Case(id="task-lm-eval=mmlu_bogus", category="cli-task", argv=with_flag(base("lm-eval"), "--tasks",
             "mmlu_bogus"), names=("mmlu_bogus",)),
        Case(id="task-lm-eval=ARC_EASY", category="cli-task", argv=with_flag(base("lm-eval"), "--tasks", "ARC_EASY"),
             expect="either", names=("ARC_EASY",)),
        Case(id="task-tune=bogus", category="cli-task", argv=with_flag(base("tune"), "--task", "bogus"),
             names=("bogus",)),
        Case(id="task-tune=lm-eval", category="cli-task", argv=with_flag(base("tune"), "--task", "arc_easy"),
             names=("arc_easy",)),
        Case(id="task-bench--contexts=none", category="cli-task", argv=with_flag(base("bench"), "--contexts", "none"),
             expect="either", names=("--contexts", "none")),
        Case(id="task-bench--model=bogus", category="cli-task", argv=with_flag(base("bench"), "--model", "synthetic,"),
             names=("--model", "empty")),
        # Commands used wrongly.
        Case(id="usage-no-command", category="cli-usage", argv=[], names=("command", "usage")),
        Case(id="usage-unknown-command", category="cli-usage", argv=["evaluate"], names=("evaluate",)),
        Case(id="usage-eval-no-family", category="cli-usage", argv=["eval"], names=("family", "usage")),
        Case(id="usage-eval-unknown-family", category="cli-usage", argv=["eval", "mmlu"], names=("mmlu",)),
        Case(id="usage-eval-ppl-no-out", category="cli-usage", argv=without(ppl, "--out"), names=("--out",)),
        Case(id="usage-generate-no-prompt", category="cli-usage", argv=without(base("generate"), "--prompt"),
             names=("--prompt",)),
        Case(id="usage-generate-empty-prompt", category="cli-usage",
             argv=with_flag(base("generate"), "--prompt", ""), names=("--prompt",)),
        Case(id="usage-generate-prompt-of-no-tokens", category="cli-usage",
             argv=with_flag(base("generate"), "--prompt", "\u200b"), expect="either", names=("--prompt", "tokens"),
             note="a zero-width space is one [UNK] token for the tiny tokenizer: accepting it is right"),
        Case(id="usage-check-hybrid", category="cli-usage", argv=with_flag(base("check"), "--method", "swa:8:2+full:1"),
             expect="accept", note="check takes hybrids (README)"),
        Case(id="usage-train-adapter-spec", category="cli-usage",
             argv=with_flag(base("train"), "--method", "swa:8:2@mine"), names=("@", "swa:8:2"),
             note="what generate suggests for a missing swa:W:S@NAME adapter"),
        Case(id="usage-generate-prompt-unknown-words", category="cli-usage",
             argv=with_flag(base("generate"), "--prompt", "hello world"), expect="accept",
             note="words outside the tiny vocabulary become [UNK]: a valid prompt"),
        Case(id="usage-generate-positional", category="cli-usage", argv=[*base("generate"), "extra"],
             names=("extra", "unrecognized")),
        Case(id="usage-generate-unknown-flag", category="cli-usage", argv=[*base("generate"), "--methods", "full"],
             expect="either", names=("--methods",), note="generate has --method only"),
        Case(id="usage-generate-prefix-flag", category="cli-usage", argv=[*base("generate"), "--max", "3"],
             expect="either", names=("--max",)),
        Case(id="usage-flag-before-command", category="cli-usage", argv=["--method", "swa:8:2", "generate"],
             names=("--method",), wrong_words=("invalid choice: 'swa:8:2'",),
             note="the flag goes after the command; the message calls the flag's value a command"),
        Case(id="usage-report-no-dir", category="cli-usage", argv=["report"], names=("run_dir",)),
        Case(id="usage-models-extra", category="cli-usage", argv=["models", "smollm2"], names=("smollm2",)),
        Case(id="usage-models", category="cli-usage", argv=["models", "--json"], expect="accept"),
        Case(id="usage-debug-shows-traceback", category="cli-usage",
             argv=["--debug", *with_flag(base("generate"), "--model", "/tmp/audit/no/such")], expect="either",
             note="--debug asks for the traceback: a traceback here is the documented behaviour"),
        Case(id="usage-niah--depths=bogus", category="cli-usage", argv=[*base("niah"), "--depths", "bogus"],
             names=("bogus", "--depths")),
        Case(id="usage-babilong--facts=bogus", category="cli-usage",
             argv=[*base("babilong"), "--babilong-facts", "fake"], names=("fake",)),
        Case(id="usage-niah--niah-max-new-tokens=auto", category="cli-usage",
             argv=with_flag(base("niah"), "--niah-max-new-tokens", "AUTO"), expect="accept"),
        Case(id="usage-ppl-lengths-trailing-comma", category="cli-usage", argv=with_flag(ppl, "--lengths", "16,"),
             names=("empty", "comma")),
        Case(id="usage-ppl-lengths-fraction-k", category="cli-usage", argv=with_flag(ppl, "--lengths", "0.1k"),
             names=("0.1k", "whole")),
        Case(id="usage-ppl-lengths-kb", category="cli-usage", argv=with_flag(ppl, "--lengths", "1kb"),
             names=("1kb",)),
        Case(id="usage-ppl-lengths-1.5k", category="cli-usage", argv=with_flag(ppl, "--lengths", "0.5k"),
             expect="accept", note="0.5k = 512 tokens, within the tiny model's 1024"),
        Case(id="usage-ppl-lengths-K-upper", category="cli-usage", argv=with_flag(ppl, "--lengths", "0.25K"),
             expect="accept"),
        Case(id="usage-ppl-lengths-underscore", category="cli-usage", argv=with_flag(ppl, "--lengths", "1_6"),
             expect="either", note="1_6 = 16 in Python; accepted as 16 is defensible"),
        Case(id="usage-ppl-seed-2**32", category="cli-usage", argv=with_flag(ppl, "--seed", "4294967296"),
             names=("--seed", "4294967296")),
    ]  # fmt: skip
    return c


API_PRELUDE = """
import torch, sinkwindow
def tiny():
    return sinkwindow.load(TINY)
def ids(n=20):
    return torch.arange(2, 2 + n).unsqueeze(0)
"""


def api_cases() -> list[Case]:
    c: list[Case] = []

    def api(id_, code, expect="refuse", names=(), note="", env=None, unset=(), mode="fork"):
        c.append(Case(id=f"api-{id_}", category="api", code=code, expect=expect, names=tuple(names), note=note,
                      env=env or {}, unset=unset, mode=mode))  # fmt: skip

    specs_bad = ["swa:", "swa:8:9", "", "swa::2", "swa:8:", "swa:8:2+full:1.2.3"]
    for s in specs_bad:
        api(f"parse_spec={s or 'EMPTY'}", f"result = sinkwindow.parse_spec({s!r})",
            names=("method", "spec", "window", "sinks", "malformed", "unit", "layer"))  # fmt: skip
    for value, names in [("None", ("None", "string")), ("64", ("64", "string")), ("b'swa:8:2'", ("string", "b'")),
                         ("['swa:8:2']", ("string", "list"))]:  # fmt: skip
        api(f"parse_spec-type={value}", f"result = sinkwindow.parse_spec({value})", names=names)
    for s, want in [
        ("SWA:8:4", "swa:8:4"),
        ("swa:\uff18:\uff12", None),
        ("swa:1_0:2", None),
        ("swa:8:2\n", "swa:8:2"),
    ]:
        check = f"wrong = None if str(result) == {want!r} else f'parsed as {{result}}'" if want else ""
        api(f"parse_spec-odd={s!r}", f"spec = {s!r}\nresult = sinkwindow.parse_spec(spec)\n{check}",
            expect="either", names=("malformed", "integer"),
            note="int() reads fullwidth digits and underscores; the canonical spelling is what rows record")  # fmt: skip

    api("apply-bad-spec", "m, _ = tiny()\nsinkwindow.apply(m, 'swa:0:4')", names=("window",))
    api("apply-spec-None", "m, _ = tiny()\nsinkwindow.apply(m, None)", names=("spec", "None"))
    api("apply-spec-int", "m, _ = tiny()\nsinkwindow.apply(m, 64)", names=("spec", "64"))
    api(
        "apply-attn-bogus",
        "m, _ = tiny()\nsinkwindow.apply(m, 'swa:8:2', attn_implementation='bogus')",
        names=("bogus", "attn_implementation"),
    )
    api(
        "apply-attn-flash",
        "m, _ = tiny()\nsinkwindow.apply(m, 'swa:8:2', attn_implementation='flash_attention_2')",
        names=("flash_attention_2",),
    )
    api(
        "apply-attn-SDPA",
        "m, _ = tiny()\nsinkwindow.apply(m, 'swa:8:2', attn_implementation='SDPA')",
        expect="either",
        names=("SDPA",),
    )
    api(
        "apply-native-sliding-bogus",
        "m, _ = tiny()\nsinkwindow.apply(m, 'swa:8:2', native_sliding='bogus')",
        names=("bogus", "native_sliding"),
    )
    api("apply-non-model-str", "sinkwindow.apply('not a model', 'swa:8:2')", names=("model", "str"))
    api("apply-nn-linear", "sinkwindow.apply(torch.nn.Linear(2, 2), 'swa:8:2')", names=("model", "Linear"))
    api(
        "apply-layer-out-of-range",
        "m, _ = tiny()\nsinkwindow.apply(m, 'swa:8:2+full:99')",
        names=("99", "layer"),
    )
    api(
        "apply-head-out-of-range",
        "m, _ = tiny()\nsinkwindow.apply(m, 'swa:8:2+full:0.5')",
        names=("0.5", "head"),
    )
    api(
        "apply-lolcats-untrained",
        "m, _ = tiny()\nsinkwindow.apply(m, 'lolcats:8')",
        names=("lolcats", "use_method", "checkpoint", "train"),
    )
    api(
        "apply-window-above-context",
        "m, _ = tiny()\nsinkwindow.apply(m, 'swa:4096:4')\nresult = 'applied'",
        expect="accept",
        note="a window longer than the context is full attention in effect; allowed",
    )
    api(
        "apply-methodspec-object",
        "m, _ = tiny()\nsinkwindow.apply(m, sinkwindow.MethodSpec('swa', 8, 2))\nresult = sinkwindow.active_spec(m)",
        expect="accept",
    )
    api("apply-methodspec-invalid-fields", "sinkwindow.MethodSpec('swa', 8, 9)", names=("sinks", "window"))
    api(
        "apply-methodspec-bool-window",
        "result = str(sinkwindow.MethodSpec('swa', True, 0))\n"
        "wrong = f'window=True accepted as a window; str() gives {result!r}, which parse_spec refuses'",
        names=("window", "True"),
        note="bool is an int: MethodSpec's units refuse it, its window does not",
    )

    gen = "m, t = tiny()\nsinkwindow.apply(m, 'swa:8:2')\n"
    api(
        "generate-float-ids",
        gen + "sinkwindow.generate(m, ids().float(), 4)",
        names=("input_ids", "float", "integer"),
    )
    api("generate-1d-ids", gen + "sinkwindow.generate(m, ids()[0], 4)", names=("input_ids", "shape"))
    api(
        "generate-empty-prompt", gen + "sinkwindow.generate(m, ids()[:, :0], 4)", names=("input_ids", "empty")
    )
    api("generate-negative-max", gen + "sinkwindow.generate(m, ids(), -1)", names=("max_new_tokens",))
    api(
        "generate-max-float",
        gen + "sinkwindow.generate(m, ids(), 2.5)",
        names=("max_new_tokens", "2.5"),
    )
    api(
        "generate-max-zero",
        gen + "out = sinkwindow.generate(m, ids(), 0)\nresult = tuple(out.shape)\n"
        "wrong = None if result == (1, 20) else f'shape {result}'",
        expect="accept",
    )
    api(
        "generate-mask-longer",
        gen + "sinkwindow.generate(m, ids(), 4, attention_mask=torch.ones(1, 21))",
        names=("attention_mask", "shape"),
    )
    api(
        "generate-mask-batch",
        gen + "sinkwindow.generate(m, ids(), 4, attention_mask=torch.ones(2, 20))",
        names=("attention_mask", "shape", "batch"),
    )
    api(
        "generate-mask-all-zero",
        gen + "sinkwindow.generate(m, ids(), 4, attention_mask=torch.zeros(1, 20))",
        names=("attention_mask", "padding", "real token"),
    )
    api(
        "generate-mask-float",
        gen + "out = sinkwindow.generate(m, ids(), 2, attention_mask=torch.ones(1, 20))\n"
        "ref = sinkwindow.generate(m, ids(), 2)\nresult = out.tolist()\n"
        "wrong = None if torch.equal(out, ref) else 'a float all-ones mask changes the tokens'",
        expect="either",
    )
    api(
        "generate-mask-values-2",
        gen + "result = sinkwindow.generate(m, ids(), 2, attention_mask=torch.full((1, 20), 2)).tolist()",
        expect="either",
        names=("attention_mask", "0", "1"),
    )
    api(
        "generate-ids-out-of-vocab",
        gen + "sinkwindow.generate(m, torch.tensor([[5, 500]]), 2)",
        names=("500", "vocab", "input_ids"),
    )
    api(
        "generate-ids-negative",
        gen + "sinkwindow.generate(m, torch.tensor([[5, -1]]), 2)",
        names=("-1", "vocab", "input_ids", "negative"),
    )
    api(
        "generate-beyond-context",
        gen + "sinkwindow.generate(m, ids(), 2000)",
        names=("1024", "position", "context"),
    )
    api("generate-chunk-0", gen + "sinkwindow.generate(m, ids(), 2, chunk_size=0)", names=("chunk_size",))
    api(
        "generate-temperature-0",
        gen + "sinkwindow.generate(m, ids(), 2, do_sample=True, temperature=0)",
        names=("temperature",),
    )
    api(
        "generate-temperature-neg",
        gen + "sinkwindow.generate(m, ids(), 2, do_sample=True, temperature=-1.0)",
        names=("temperature",),
    )
    api(
        "generate-top-p-above-1",
        gen + "sinkwindow.generate(m, ids(), 2, do_sample=True, top_p=1.5)",
        names=("top_p",),
    )
    api(
        "generate-eos-string",
        gen + "sinkwindow.generate(m, ids(), 2, eos_token_id='w1')",
        names=("eos_token_id", "w1", "int"),
    )
    api(
        "generate-cache-of-other-spec",
        gen
        + "c = sinkwindow.make_cache(m)\nsinkwindow.apply(m, 'swa:16:2')\nsinkwindow.generate(m, ids(), 2, cache=c)",
        names=("cache", "swa:8:2", "spec"),
    )
    api("generate-not-a-model", "sinkwindow.generate('model', ids(), 2)", names=("model", "str"))
    api(
        "generate-ids-list",
        gen + "sinkwindow.generate(m, [[2, 3, 4]], 2)",
        names=("input_ids", "tensor", "list"),
    )
    api(
        "generate-unpatched-full",
        "m, _ = tiny()\nout = sinkwindow.generate(m, ids(), 2)\nresult = tuple(out.shape)",
        expect="accept",
        note="an unpatched model generates with full attention, as documented",
    )

    pre = "m, _ = tiny()\nsinkwindow.apply(m, 'swa:8:2')\n"
    api("prefill-chunk-0", pre + "sinkwindow.prefill(m, ids(), chunk_size=0)", names=("chunk_size",))
    api(
        "prefill-chunk-float",
        pre + "sinkwindow.prefill(m, ids(), chunk_size=2.5)",
        names=("chunk_size", "2.5"),
    )
    api(
        "prefill-chunk-str", pre + "sinkwindow.prefill(m, ids(), chunk_size='8')", names=("chunk_size", "'8'")
    )
    api("prefill-float-ids", pre + "sinkwindow.prefill(m, ids().float())", names=("input_ids", "float"))
    api(
        "prefill-beyond-context",
        pre + "sinkwindow.prefill(m, torch.ones(1, 1500, dtype=torch.long) * 3)",
        names=("1500", "1024", "position"),
    )

    api(
        "make_cache-unpatched",
        "m, _ = tiny()\nresult = type(sinkwindow.make_cache(m)).__name__",
        expect="either",
        names=("apply", "patched", "full"),
        note="documented: a patched model makes one; unpatched should say so",
    )
    api(
        "make_cache-unpatched-static",
        "m, _ = tiny()\nsinkwindow.make_cache(m, static=True)",
        names=("apply", "patched", "static"),
    )
    api("make_cache-non-model", "sinkwindow.make_cache('model')", names=("model", "str"))
    api(
        "make_cache-after-revert",
        "m, _ = tiny()\nwith sinkwindow.apply(m, 'swa:8:2'):\n    pass\nresult = type(sinkwindow.make_cache(m)).__name__",
        expect="either",
        names=("apply", "patched", "full"),
    )
    api(
        "make_cache-stale-after-full",
        "m, _ = tiny()\nsinkwindow.apply(m, 'swa:8:2')\nc = sinkwindow.make_cache(m)\nsinkwindow.apply(m, 'full')\n"
        "m(ids(), past_key_values=c)",
        names=("cache", "full"),
    )

    api(
        "load-hub-id-offline",
        "sinkwindow.load('no/such/model')",
        names=("no/such/model", "offline"),
        mode="process",
        env={"HF_HUB_OFFLINE": "1"},
    )
    api(
        "load-hub-id-no-network",
        "sinkwindow.load('no-such-org/no-such-model')",
        names=("no-such-org/no-such-model",),
        mode="process",
        unset=("HF_HUB_OFFLINE",),
        note="online mode on a machine that may not reach the hub: should fail within seconds",
    )
    api("load-empty-string", "sinkwindow.load('')", names=("model", "''", "empty"))
    api("load-gguf-text", "sinkwindow.load(FIX + '/x.gguf')", names=("x.gguf", "gguf"))
    api("load-empty-folder", "sinkwindow.load(FIX + '/empty')", names=("empty", "config"))
    api("load-bad-method", "sinkwindow.load(TINY, method='swa:0:4')", names=("window",))
    api("load-dtype-string", "m, _ = sinkwindow.load(TINY, dtype='float16')\nresult = str(next(m.parameters()).dtype)\n"
        "wrong = None if result == 'torch.float16' else f'dtype=\"float16\" gave {result}'", expect="either",
        names=("dtype",))  # fmt: skip
    api("load-dtype-bogus", "sinkwindow.load(TINY, dtype='int8')", names=("dtype", "int8"))
    api("load-device-cuda", "sinkwindow.load(TINY, device='cuda')", names=("cuda",))
    api(
        "load-lolcats-no-checkpoint",
        "sinkwindow.load(TINY, method='lolcats:8')",
        names=("checkpoint", "lolcats"),
    )
    api(
        "load-checkpoint-missing",
        "sinkwindow.load(TINY, method='lolcats:8', checkpoint='/tmp/audit/no/ckpt')",
        names=("/tmp/audit/no/ckpt",),
    )
    api(
        "load-checkpoint-without-trained-method",
        "m, _ = sinkwindow.load(TINY, checkpoint=FIX + '/ckpt.safetensors')\n"
        "result = (type(m).__name__, str(sinkwindow.active_spec(m)))\n"
        "wrong = 'the checkpoint was ignored without a word' if result[1] == 'full' else None",
        expect="either",
        names=("checkpoint", "method"),
        note="a checkpoint with method=None",
    )
    return c


def _copy_run(to: Path, edit: Callable[[Path], None] | None = None, paths: Paths | None = None) -> None:
    assert paths is not None
    if to.exists():
        shutil.rmtree(to)
    shutil.copytree(paths.base_run, to)
    if edit:
        edit(to)


def run_cases(paths: Paths) -> list[Case]:
    """A finished eval ppl run (full and swa:8:2, two windows of 16 tokens), damaged in one way each, then
    ``report`` and a resume of the command that made it."""

    def torn(d: Path) -> None:
        text = (d / "results.jsonl").read_text()
        (d / "results.jsonl").write_text(text.rstrip("\n")[:-25])

    def score_abc(d: Path) -> None:
        _edit_rows(d, lambda rows: [{**rows[0], "score": "abc"}, *rows[1:]])

    def score_nan(d: Path) -> None:
        (d / "results.jsonl").write_text(
            (d / "results.jsonl").read_text().replace('"score": ', '"score": NaN, "x": ', 1)
        )

    def score_huge(d: Path) -> None:
        _edit_rows(d, lambda rows: [{**rows[0], "score": 1e300}, *rows[1:]])

    def duplicated(d: Path) -> None:
        _edit_rows(d, lambda rows: [*rows, rows[0]])

    def dup_conflicting(d: Path) -> None:
        _edit_rows(d, lambda rows: [*rows, {**rows[0], "score": (rows[0].get("score") or 0) * 10 + 1}])

    def fingerprint_corrupt(d: Path) -> None:
        (d / "fingerprint.json").write_text('{"hash": "abc", "settings": ')

    def fingerprint_empty(d: Path) -> None:
        (d / "fingerprint.json").write_text("")

    def fingerprint_missing(d: Path) -> None:
        (d / "fingerprint.json").unlink()

    def results_empty(d: Path) -> None:
        (d / "results.jsonl").write_text("")

    def results_binary(d: Path) -> None:
        (d / "results.jsonl").write_bytes(b"\x00\xff\xfe garbage\n" * 3)

    def config_corrupt(d: Path) -> None:
        (d / "config.json").write_text("{not json")

    def row_missing_keys(d: Path) -> None:
        _edit_rows(d, lambda rows: [{"score": 1.0}, *rows[1:]])

    def row_is_list(d: Path) -> None:
        (d / "results.jsonl").write_text((d / "results.jsonl").read_text() + "[1, 2, 3]\n")

    def results_is_dir(d: Path) -> None:
        (d / "results.jsonl").unlink()
        (d / "results.jsonl").mkdir()

    def sessions_corrupt(d: Path) -> None:
        (d / "sessions.jsonl").write_text("{torn")

    damages = {
        "torn-last-line": (torn, "either"),
        "score-abc": (score_abc, "either"),
        "score-1e300": (score_huge, "either"),
        "duplicated-row": (duplicated, "either"),
        "duplicated-row-other-score": (dup_conflicting, "either"),
        "fingerprint-corrupt": (fingerprint_corrupt, "either"),
        "fingerprint-missing": (fingerprint_missing, "either"),
        "config-corrupt": (config_corrupt, "either"),
        "row-missing-keys": (row_missing_keys, "either"),
        "results-is-a-folder": (results_is_dir, "refuse"),
    }
    cases = []
    for key, (edit, expect) in damages.items():
        for action in ("report", "resume"):
            argv = ["report", "{W}/run"] if action == "report" else with_flag(RUN_COMMAND, "--out", "{W}/run")
            cases.append(
                Case(
                    id=f"runs-{key}-{action}",
                    category="runs",
                    argv=argv,
                    expect=expect,
                    names=("results.jsonl", "fingerprint", "config.json", "line", "sessions.jsonl", "json"),
                    setup=lambda w, edit=edit: _copy_run(w / "run", edit, paths),
                    check=_run_check(key, action),
                )
            )
    cases.append(
        Case(
            id="runs-other-settings-resume",
            category="runs",
            argv=with_flag(with_flag(RUN_COMMAND, "--out", "{W}/run"), "--seed", "7"),
            names=("seed", "--new-run"),
            setup=lambda w: _copy_run(w / "run", None, paths),
        )
    )
    cases.append(
        Case(
            id="runs-report-read-only",
            category="runs",
            argv=["report", "{W}/run"],
            names=("permission", "read-only", "report"),
            mode="readonly",
            setup=lambda w: (_copy_run(w / "run", None, paths), _read_only(w / "run")),
            expect="refuse",
        )
    )
    return cases


RUN_COMMAND = ["eval", "ppl", "--model", "{TINY}", "--methods", "full,swa:8:2", "--lengths", "16", "--samples", "2",
               "--threads", "1", "--no-progress", "--out", "{RUN}"]  # fmt: skip


def _read_only(folder: Path) -> None:
    for p in folder.iterdir():
        os.chmod(p, 0o444)
    os.chmod(folder, 0o555)


def _edit_rows(d: Path, fn: Callable[[list[dict]], list[dict]]) -> None:
    rows = [json.loads(line) for line in (d / "results.jsonl").read_text().splitlines() if line.strip()]
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fn(rows)))


def _damaged_lines(path: Path) -> tuple[int, int]:
    """Lines of a ppl ``results.jsonl`` a report must leave out, as ``(surely, at most)``: surely bad are
    lines that are not a JSON object, rows with no method / index / length, scores that are not a finite
    number > 0, and repeats of a sample's row; a score that disagrees with the row's own
    exp(nll_sum / n_tokens) may be left out (and noted) or recomputed from the sums (silently): both
    give right tables."""
    if not path.is_file():
        return 0, 0
    surely = maybe = 0
    seen = set()
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            surely += 1
            continue
        if not isinstance(row, dict):
            surely += 1
            continue
        score = row.get("score")
        key = tuple(row.get(k) for k in ("method", "index", "length", "fingerprint"))
        usable = isinstance(score, (int, float)) and 0 < score < float("inf") and None not in key[:3]
        if not usable or key in seen:
            surely += 1
        elif (
            isinstance(row.get("nll_sum"), (int, float))
            and row.get("n_tokens")
            and not math.isclose(score, math.exp(row["nll_sum"] / row["n_tokens"]), rel_tol=1e-6)
        ):
            maybe += 1
        seen.add(key)
    return surely, surely + maybe


def _run_check(key: str, action: str) -> Callable[[Result], str | None]:
    """Judge an accepted report / resume of a damaged run folder: report.md notes damaged lines when
    results.jsonl has some (and not when it has none), no absurd score reaches a table, and a resume
    leaves every sample usable."""

    def check(r: Result) -> str | None:
        run = r.workdir / "run"
        report = (run / "report.md").read_text(errors="replace") if (run / "report.md").is_file() else ""
        tables = "\n".join(line for line in report.splitlines() if not line.startswith("**Note:**"))
        noted = "**Note:**" in report
        surely, at_most = _damaged_lines(run / "results.jsonl")
        if surely and not noted:
            return f"results.jsonl has {surely} unusable line(s) and report.md does not say so"
        if noted and not at_most:
            return "report.md notes damaged lines that results.jsonl no longer has (a stale note)"
        if "1e+300" in tables:
            return "a score of 1e300 reached the report's tables"
        if action == "resume":
            rows = _rows(run / "results.jsonl")
            good = {(row.get("method"), row.get("index"), row.get("length")) for row in rows
                    if isinstance(row, dict) and isinstance(row.get("score"), (int, float))
                    and 0 < row["score"] < 1e100}  # fmt: skip
            if len(good) < 4:
                return f"after the resume only {len(good)} of 4 samples have a usable score"
        return None

    return check


REAL_CASES = [
    Case(id="real-generate-lolcats-no-adapter", category="real",
         argv=["generate", "--method", "lolcats:64", "--prompt", "Hi", "--max-new-tokens", "2", "--no-progress"],
         names=("lolcats:64", "checkpoint", "adapter")),
    Case(id="real-generate-adapter-name-unknown", category="real",
         argv=["generate", "--method", "swa:256:4@nosuch", "--prompt", "Hi", "--max-new-tokens", "2", "--no-progress"],
         names=("nosuch", "adapter"), wrong_words=("sinkwindow train --model <model> --method swa:256:4@nosuch",),
         note="the suggested train command is refused: train takes swa:256:4, not an @NAME spec"),
    Case(id="real-generate-hybrid-layer-30", category="real",
         argv=["generate", "--method", "swa:64:4+full:30", "--prompt", "Hi", "--max-new-tokens", "2", "--no-progress"],
         names=("30", "layer")),
    Case(id="real-check-layers-above-model", category="real",
         argv=["check", "--method", "swa:16:4", "--layers", "100"], expect="either", names=("--layers", "100"),
         check=lambda r: None if "30" in (r.stdout + r.stderr) else "--layers 100 on a 30-layer model without a word"),
    Case(id="real-generate-float16-cpu", category="real",
         argv=["generate", "--method", "swa:64:4", "--dtype", "float16", "--prompt", "Hi", "--max-new-tokens", "3",
               "--chat", "--no-progress"], expect="either", names=("float16", "cpu")),
]  # fmt: skip


def setup_fixtures(paths: Paths, runner: Runner) -> None:
    """The tiny model, files of each kind the cases name, a valid lm-eval data folder and a finished run."""
    sys.path.insert(0, str(REPO / "tests"))
    for d in (paths.fix, paths.work, paths.fix / "empty"):
        d.mkdir(parents=True, exist_ok=True)
    if not (paths.tiny / "config.json").is_file():
        from conftest import make_tiny_folder

        make_tiny_folder(paths.tiny.parent)
    (paths.fix / "x.gguf").write_text("this is a text file, not a GGUF model\n")
    (paths.fix / "file.txt").write_text("an existing file\n")
    (paths.fix / "bad.safetensors").write_text("not safetensors\n")
    (paths.fix / "empty.jsonl").write_text("")
    (paths.fix / "bad.jsonl").write_text('{"text": "w1 w2"}\n{torn\n')
    (paths.fix / "bad-map.json").write_text('{"model.layers.0": "warp-drive"}')
    if paths.readonly.exists():
        os.chmod(paths.readonly, 0o755)
        shutil.rmtree(paths.readonly)
    paths.readonly.mkdir()
    os.chmod(paths.readonly, 0o555)
    if not (paths.lmdata / "arc_easy_test.jsonl").is_file():
        from test_lmeval import write_fixtures

        write_fixtures(paths.lmdata, n=2)
    # Untrained lolcats:8 checkpoints (their loading, not their quality, is what the cases need).
    for name, seed in (("ckpt.safetensors", 0), ("ckpt2.safetensors", 1)):
        if not (paths.fix / name).is_file():
            code = (
                f"import torch, sinkwindow\nfrom sinkwindow.linear import convert, save_checkpoint\n"
                f"torch.manual_seed({seed})\nm, _ = sinkwindow.load(TINY)\n"
                f"save_checkpoint(convert(m, 'lolcats:8'), FIX + '/{name}')\n"
            )
            r = runner.run(
                Case(id=f"setup-{name}", category="setup", code=code), paths.work / f"setup-{name}"
            )
            if r.rc != 0:
                raise SystemExit(f"could not build {name}: {r.stderr[-2000:]}")
    # The real model's converted copy, linked into the audit's own cache (cases write only under --out).
    real_cache = Path.home() / ".cache" / "sinkwindow"
    if (real_cache / "converted").is_dir() and not (paths.cache / "converted").exists():
        shutil.copytree(real_cache / "converted", paths.cache / "converted", copy_function=_link_or_copy)
        if (real_cache / "sha256.json").is_file():
            shutil.copy2(real_cache / "sha256.json", paths.cache / "sha256.json")
    if not (paths.base_run / "results.jsonl").is_file():
        if paths.base_run.exists():
            shutil.rmtree(paths.base_run)
        r = runner.run(
            Case(id="setup-base-run", category="setup", argv=RUN_COMMAND), paths.work / "setup-base-run"
        )
        if r.rc != 0:
            raise SystemExit(f"could not make the base run: {r.stderr[-2000:]}")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


class Runner:
    """Runs a case in a child process: a fork of this interpreter (CLI imported), or a real process."""

    def __init__(self, paths: Paths, timeout: float, fresh: bool):
        self.paths = paths
        self.timeout = timeout
        self.fresh = fresh
        self.env = {**BASE_ENV, "SINKWINDOW_CACHE": str(paths.cache)}
        self._warm = False

    def warm(self) -> None:
        """Import what the commands import, once, so that each forked case starts in milliseconds."""
        if self._warm:
            return
        os.environ.update(self.env)
        import importlib

        for name in ("torch", "transformers", "sinkwindow.cli", "sinkwindow.models.loading", "sinkwindow.runtime.patching",
                     "sinkwindow.runtime.prefill", "sinkwindow.runtime.generate", "sinkwindow.cli.check", "sinkwindow.eval.runner",
                     "sinkwindow.eval.report", "sinkwindow.bench.suite", "sinkwindow.train.trainer",
                     "sinkwindow.tuning.tune", "sinkwindow.tuning.calibrate", "sinkwindow.linear",
                     "transformers.models.llama.modeling_llama", "matplotlib.pyplot"):  # fmt: skip
            try:
                importlib.import_module(name)
            except Exception as err:  # a broken module is the case's finding, not the runner's
                print(f"warm-up: import {name} failed: {err}", file=sys.stderr)
        try:
            importlib.import_module("sinkwindow.cli").build_parser()
        except Exception as err:
            print(f"warm-up: build_parser failed: {err}", file=sys.stderr)
        self._warm = True

    def run(self, case: Case, workdir: Path) -> Result:
        if workdir.exists():
            _make_writable(workdir)
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        if case.setup:
            case.setup(workdir)
        mode = case.mode
        if mode == "fork" and self.fresh and case.argv is not None:
            mode = "process"
        t0 = time.monotonic()
        if mode == "fork":
            self.warm()
            rc, timed_out = self._fork(case, workdir)
        else:
            rc, timed_out = self._process(case, workdir, readonly=mode == "readonly")
        seconds = time.monotonic() - t0
        out = (workdir / "stdout.txt").read_text(errors="replace")
        err = (workdir / "stderr.txt").read_text(errors="replace")
        api = None
        if (workdir / "api.json").is_file():
            try:
                api = json.loads((workdir / "api.json").read_text())
            except ValueError:
                api = None
        return Result(rc, out, err, seconds, timed_out, workdir, api)

    def _argv(self, case: Case, workdir: Path) -> list[str]:
        return [self.paths.fill(a, workdir) for a in case.argv or []]

    def _fork(self, case: Case, workdir: Path) -> tuple[int | None, bool]:
        pid = os.fork()
        if pid == 0:  # the child: never returns
            self._child(case, workdir)
        deadline = time.monotonic() + self.timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status), False
            if time.monotonic() > deadline:
                _kill_group(pid)
                os.waitpid(pid, 0)
                return None, True
            time.sleep(0.05)

    def _child(self, case: Case, workdir: Path) -> None:
        rc = 1
        try:
            os.setpgid(0, 0)
            _limit_memory()
            for stream, name in ((1, "stdout.txt"), (2, "stderr.txt")):
                fd = os.open(workdir / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, stream)
                os.close(fd)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.chdir(workdir)
            os.environ.update(case.env)
            for key in case.unset:
                os.environ.pop(key, None)
            if case.argv is not None:
                from sinkwindow.cli import main

                sys.argv = ["sinkwindow", *self._argv(case, workdir)]
                rc = main(sys.argv[1:])
            else:
                rc = _run_code(self.paths.fill(case.code or "", workdir), self.paths, workdir)
        except SystemExit as exit_:
            code = exit_.code
            rc = code if isinstance(code, int) else (0 if code is None else 1)
            if not isinstance(code, int) and code is not None:
                print(code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            rc = 1
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(int(rc or 0) & 0xFF)

    def _process(self, case: Case, workdir: Path, *, readonly: bool) -> tuple[int | None, bool]:
        if case.argv is not None:
            cmd = [str(SINKWINDOW), *self._argv(case, workdir)]
        else:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--api-child", str(workdir), "--out",
                   str(self.paths.out)]  # fmt: skip
            (workdir / "code.py").write_text(self.paths.fill(case.code or "", workdir))
        if readonly and os.geteuid() == 0:
            drop = "-dac_override,-dac_read_search"
            cmd = ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", *cmd]
        env = {**os.environ, **self.env, **case.env}
        for key in case.unset:
            env.pop(key, None)
        with open(workdir / "stdout.txt", "wb") as out, open(workdir / "stderr.txt", "wb") as err:
            proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    start_new_session=True, preexec_fn=_limit_memory)  # fmt: skip
            try:
                return proc.wait(timeout=self.timeout), False
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                proc.wait()
                return None, True


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _make_writable(path: Path) -> None:
    for p in [path, *path.rglob("*")]:
        if not p.is_symlink():
            os.chmod(p, 0o755 if p.is_dir() else 0o644)


def _run_code(code: str, paths: Paths, workdir: Path) -> int:
    """Run an API case's code; write what it returned or raised to ``workdir/api.json``."""
    ns: dict = {"TINY": str(paths.tiny), "FIX": str(paths.fix)}
    record: dict
    try:
        exec(compile(API_PRELUDE + code, "<case>", "exec"), ns)
    except BaseException as err:  # noqa: BLE001 - what it raised is the finding
        message = str(err)
        allowed = isinstance(err, (ValueError, TypeError, FileNotFoundError)) or (
            isinstance(err, KeyError) and " " in message
        )
        record = {"raised": type(err).__name__, "module": type(err).__module__, "message": message,
                  "allowed": allowed}  # fmt: skip
        traceback.print_exc()
        (workdir / "api.json").write_text(json.dumps(record))
        return 1
    record = {"returned": repr(ns.get("result"))[:500], "wrong": ns.get("wrong")}
    (workdir / "api.json").write_text(json.dumps(record))
    return 0


def last_line(text: str) -> str:
    """The message a user reads last: the exception line of a traceback, else the last line."""
    lines = text.strip().splitlines()
    if TRACEBACK in text:
        start = max(i for i, line in enumerate(lines) if line.startswith(TRACEBACK))
        for line in lines[start + 1 :]:
            if line.strip() and not line.startswith((" ", "\t")):
                return line.strip()
    lines = [line.strip() for line in lines if line.strip()]
    return lines[-1] if lines else ""


TRACEBACK = "Traceback (most recent call last)"


def _spellings(names) -> tuple[str, ...]:
    """Each expected word as the message may spell it: ``--max-new-tokens`` is also ``max_new_tokens``."""
    out: list[str] = []
    for name in names:
        name = name.lower()
        bare = name.lstrip("-")
        out += (
            [name, bare, bare.replace("-", "_"), bare.replace("-", " ")] if name.startswith("--") else [name]
        )
    return tuple(dict.fromkeys(n for n in out if n))


def classify(case: Case, r: Result, paths: Paths) -> tuple[str, str]:
    """``(class, reason)`` of one outcome."""
    if r.timed_out:
        return "hang", f"no exit within {int(r.seconds)} s"
    names = _spellings(paths.fill(n, r.workdir) for n in case.names)
    if case.code is not None and case.category != "setup":
        api = r.api or {}
        if "raised" in api:
            message = " ".join(api["message"].split())
            if not api["allowed"]:
                return "traceback", f"{api['raised']}: {message[:300]}"
            return _judge_message(case, f"{api['raised']}: {message}", names)
        if "returned" in api:
            if api.get("wrong"):
                return "silent-wrong", str(api["wrong"])
            if case.expect == "refuse":
                return "silent-wrong", f"accepted, returned {api['returned'][:200]}"
            return "accepted", f"returned {api['returned'][:200]}"
        return "traceback", f"the process died (exit {r.rc}) without a result: {last_line(r.stderr)[:300]}"
    line = last_line(r.stderr)
    if TRACEBACK in r.stderr:
        if "--debug" in (case.argv or []):
            return "accepted", "--debug printed the traceback, as asked"
        return "traceback", line[:300]
    if r.rc is not None and r.rc < 0:
        return "traceback", f"killed by signal {-r.rc}: {line[:300]}"
    if r.rc == 0:
        reason = case.check(r) if case.check else None
        if reason:
            return "silent-wrong", reason
        if case.expect == "refuse":
            return "silent-wrong", f"exit 0 on a bad input; stdout ends {last_line(r.stdout)[:200]!r}"
        return "accepted", last_line(r.stdout)[:200]
    if not line:
        if r.stdout.lstrip().startswith("usage:"):
            return "clear", f"exit {r.rc}, the help on stdout"
        return "misleading", f"exit {r.rc} with nothing on stderr"
    return _judge_message(case, line, names)


def _judge_message(case: Case, line: str, names: tuple[str, ...]) -> tuple[str, str]:
    """A refusal's class from its one line: clear, or misleading (refused a valid input, names none of
    the expected words, or holds a phrase the audit found wrong)."""
    wrong = [w for w in case.wrong_words if w.lower() in line.lower()]
    if wrong:
        return "misleading", f"{line[:300]} (wrong: {wrong[0]!r}; {case.note})"
    if case.expect == "accept":
        return "misleading", f"valid input refused: {line[:300]}"
    if names and not any(n in line.lower() for n in names):
        return "misleading", f"{line[:300]} (names none of {', '.join(case.names)})"
    return "clear", line[:300]


def all_cases(paths: Paths) -> list[Case]:
    cases = [*flag_cases(), *spec_cases(), *path_cases(), *conflict_cases(), *api_cases(), *run_cases(paths),
             *REAL_CASES[:REAL_MODEL_CASES]]  # fmt: skip
    seen: set[str] = set()
    for case in cases:
        if case.id in seen:
            raise SystemExit(f"duplicate case id {case.id}")
        seen.add(case.id)
    return cases


def describe(case: Case, paths: Paths) -> str:
    if case.argv is not None:
        return "sinkwindow " + " ".join(shlex.quote(paths.fill(a, paths.work / case.id)) for a in case.argv)
    return case.code or ""


def write_summary(paths: Paths, rows: list[dict]) -> dict:
    counts = Counter(row["class"] for row in rows)
    summary = {
        "total": len(rows),
        "counts": {k: counts.get(k, 0) for k in CLASSES},
        "by_category": {
            cat: dict(Counter(r["class"] for r in rows if r["category"] == cat))
            for cat in sorted({r["category"] for r in rows})
        },
        "findings": [
            {k: row[k] for k in ("id", "class", "command", "exit_code", "last_stderr_line", "reason")}
            for row in rows
            if row["class"] not in ("clear", "accepted")
        ],
    }
    (paths.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def print_summary(summary: dict) -> None:
    print(f"\n{'class':<14}{'cases':>6}")
    for k in CLASSES:
        print(f"{k:<14}{summary['counts'][k]:>6}")
    print(f"{'total':<14}{summary['total']:>6}")
    cats = summary["by_category"]
    print("\n" + f"{'category':<14}" + "".join(f"{k[:9]:>10}" for k in CLASSES))
    for cat, counts in cats.items():
        print(f"{cat:<14}" + "".join(f"{counts.get(k, 0):>10}" for k in CLASSES))
    for f in summary["findings"]:
        print(f"\n[{f['class']}] {f['id']}\n  $ {f['command'][:400]}\n  -> {f['reason'][:400]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--out", type=Path, default=Path("/tmp/audit"), help="output folder (default: %(default)s)"
    )
    p.add_argument(
        "--only", action="append", default=[], help="run cases whose id contains this (repeatable)"
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per case (default: %(default)s)")
    p.add_argument(
        "--fresh", action="store_true", help="every CLI case as a real sinkwindow process (slower)"
    )
    p.add_argument("--list", action="store_true", help="print the cases and run nothing")
    p.add_argument("--api-child", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    paths = Paths(args.out.resolve())

    if args.api_child is not None:  # an API case in a process of its own (mode "process")
        return _run_code((args.api_child / "code.py").read_text(), paths, args.api_child)

    cases = all_cases(paths)
    if args.only:
        cases = [c for c in cases if any(o in c.id for o in args.only)]
    if args.list:
        for case in cases:
            print(f"{case.id}\t{describe(case, paths)[:300]!r}")
        print(f"{len(cases)} cases")
        return 0

    paths.out.mkdir(parents=True, exist_ok=True)
    runner = Runner(paths, args.timeout, args.fresh)
    setup_fixtures(paths, runner)
    runner.warm()
    audit = paths.out / "audit.jsonl"
    previous = {r["id"]: r for r in _rows(audit)}
    order = {c.id: i for i, c in enumerate(all_cases(paths))}
    t_start = time.monotonic()
    for n, case in enumerate(cases, 1):
        r = runner.run(case, paths.work / case.id.replace("/", "_"))
        cls, reason = classify(case, r, paths)
        row = {
            "id": case.id,
            "category": case.category,
            "command": describe(case, paths),
            "mode": case.mode
            if not (args.fresh and case.argv is not None and case.mode == "fork")
            else "process",
            "exit_code": r.rc,
            "last_stderr_line": last_line(r.stderr)[:500],
            "class": cls,
            "reason": reason,
            "expect": case.expect,
            "seconds": round(r.seconds, 2),
            "note": case.note,
        }
        if r.api is not None:
            row["api"] = r.api
        previous[case.id] = row
        print(f"[{n}/{len(cases)} {time.monotonic() - t_start:6.0f}s] {cls:<13} {case.id}  ({r.seconds:.1f}s) "
              f"{reason[:120]}", flush=True)  # fmt: skip
        # Rewritten after every case, so an interrupted audit keeps what it found.
        rows = sorted(previous.values(), key=lambda x: order.get(x["id"], len(order)))
        audit.write_text("".join(json.dumps(x) + "\n" for x in rows))
    rows = [x for x in _rows(audit) if x["id"] in order]
    summary = write_summary(paths, rows)
    print_summary(summary)
    print(f"\n{audit} ({len(rows)} cases), {paths.out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
