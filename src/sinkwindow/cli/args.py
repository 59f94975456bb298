"""The CLI vocabulary: the flags every ``sinkwindow`` subcommand shares, parsed and range-checked once.

Each flag means one thing everywhere:

- **sizes** (``--lengths``, ``--contexts``, ``--tokens`` ...): an integer, or one with a suffix,
  ``k`` = 1024 and ``M`` = 1024**2 (``1k`` = 1024, ``4k`` = 4096, ``1M`` = 1,048,576). Long-context
  results are keyed by these token counts (RULER's 4K is 4096), so a size never means 10**3.
- ``--method`` / ``--methods``: method specs, comma-separated and/or repeated, each checked with
  :func:`sinkwindow.runtime.spec.parse_spec` while parsing and stored in its canonical spelling.
- ``--checkpoint PATH`` or ``METHOD=PATH``: a trained linear baseline; one parser for every command
  (:func:`parse_checkpoint`, :func:`resolve_checkpoints`).
- ``--out``: a folder, new or one to resume; an existing file is refused. Nothing is created
  while parsing, so a bad command line leaves the disk as it was.

Every ``type=`` function here raises :class:`argparse.ArgumentTypeError` with the fix, so a bad
value is an argparse usage error (exit 2) before any model loads; ``cli_errors`` reports what a
command raises once it runs.

This module must stay cheap to import (no torch or transformers at module level): ``--help`` and
validation go through it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from pathlib import Path

# torch-free, so --help stays fast
from ..methods import method_of
from ..models.packaged import DEFAULT_MODEL
from ..runtime.dtypes import DTYPES

__all__ = [
    "DEFAULT_MODEL",
    "DTYPES",
    "SIZE_UNITS",
    "SIZE_HELP",
    "THREADS_HELP",
    "MethodsAction",
    "CheckpointAction",
    "parse_size",
    "size",
    "size_list",
    "integer",
    "real",
    "non_empty",
    "method",
    "linear_method",
    "parse_checkpoint",
    "out_dir",
    "existing_dir",
    "device",
    "device_map",
    "add_model",
    "add_method",
    "add_methods",
    "add_checkpoint",
    "add_device",
    "add_device_map",
    "add_dtype",
    "add_seed",
    "add_out",
    "add_chunk_size",
    "add_threads",
    "add_no_progress",
    "add_no_resume",
    "add_new_run",
    "add_global_flags",
]

SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2}
SIZE_HELP = "k = 1024, M = 1024**2 tokens"
# numpy's legacy seeding, the narrowest consumer, takes 0 .. 2**32 - 1.
SEED_MAX = 2**32 - 1

_SIZE_RE = re.compile(r"(-?)([0-9][0-9_]*(?:\.[0-9]+)?|\.[0-9]+)([kKmM]?)")


# The largest count any flag takes (tokens, samples, steps, ranks): beyond it a value is a typo.
MAX_SIZE = 10**15


def parse_size(text: str) -> int:
    """A token count: ``"4096"`` -> 4096, ``"4k"`` -> 4096, ``"1.5k"`` -> 1536, ``"1M"`` -> 1048576.

    A minus sign is kept (``"-5"`` -> -5) so that the range checks of :func:`size` and
    :func:`size_list` can name the bound.

    Raises:
        argparse.ArgumentTypeError: not a whole number of tokens in that notation.
    """
    m = _SIZE_RE.fullmatch(str(text).strip())
    if not m:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: use an integer or k/M ({SIZE_HELP}), e.g. 512, 4k, 1M"
        )
    sign = -1 if m.group(1) else 1
    number, unit = m.group(2).replace("_", ""), m.group(3).lower()
    scale = SIZE_UNITS[unit]
    if len(number.partition(".")[0]) > 16 or int(number.partition(".")[0] or "0") * scale > MAX_SIZE:
        # More than any run: a typo, which would overflow or allocate its way into a MemoryError later.
        raise argparse.ArgumentTypeError(f"{text!r} is too large a size: give at most {MAX_SIZE:,} tokens")
    if "." in number:
        # Exact for what people write (1.5k, 0.5M); a fraction of a token is refused below.
        whole, frac = number.split(".")
        value = int(whole or "0") * scale + int(frac) * scale // 10 ** len(frac)
        if int(frac) * scale % 10 ** len(frac):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number of tokens ({SIZE_HELP}); give an integer such as {value}"
            )
        return sign * value
    return sign * int(number) * scale


def _subject(what: str) -> str:
    # argparse already starts the message with "argument --flag:"; say the flag only once.
    return "" if what.startswith("-") else f"{what} "


def _bounds(minimum: int | None, maximum: int | None) -> str:
    if maximum is None:
        return f">= {minimum}"
    if minimum is None:
        return f"<= {maximum}"
    return f"between {minimum} and {maximum}"


def size(minimum: int = 1, maximum: int | None = None, *, what: str = "size") -> Callable[[str], int]:
    """``type=`` for one size (``parse_size``) of at least ``minimum`` tokens."""

    def parse(text: str) -> int:
        value = parse_size(text)
        if value < minimum or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(
                f"{_subject(what)}must be {_bounds(minimum, maximum)} tokens, got {text!r}"
                + (f" (= {value})" if str(value) != str(text).strip() else "")
            )
        return value

    parse.__name__ = what  # argparse names the type in "invalid <name> value" messages
    return parse


def size_list(
    minimum: int = 1, *, what: str = "length", zero_ok: bool = False, why: str = ""
) -> Callable[[str], list[int]]:
    """``type=`` for a comma list of sizes: each ``>= minimum`` (or ``0`` when ``zero_ok``), no repeats.

    ``why`` (e.g. "the 128-token answer budget plus the prompt") is added to the range error.
    """

    def parse(text: str) -> list[int]:
        parts = [p.strip() for p in str(text).split(",")]
        if not any(parts):
            raise argparse.ArgumentTypeError(f"give at least one {what}, e.g. 512,1k,2k ({SIZE_HELP})")
        if not all(parts):
            raise argparse.ArgumentTypeError(f"empty item in {text!r}: separate {what}s with single commas")
        out: list[int] = []
        for part in parts:
            value = parse_size(part)
            if value < minimum and not (zero_ok and value == 0):
                allowed = f"0 or >= {minimum}" if zero_ok else f">= {minimum}"
                because = f" ({why})" if why else ""
                raise argparse.ArgumentTypeError(
                    f"each {what} must be {allowed} tokens{because}, got {part!r}"
                )
            if value in out:
                raise argparse.ArgumentTypeError(f"{what} {value} is given twice in {text!r}")
            out.append(value)
        return out

    parse.__name__ = f"{what} list"
    return parse


def integer(
    minimum: int | None = 1, maximum: int | None = None, *, what: str = "value"
) -> Callable[[str], int]:
    """``type=`` for an integer in ``[minimum, maximum]`` (``None``: unbounded on that side)."""

    def parse(text: str) -> int:
        raw = str(text).strip()
        # int() also takes "1_000" and non-ASCII digits ("８"): a flag takes plain digits only.
        if not re.fullmatch(r"[+-]?[0-9]+", raw):
            raise argparse.ArgumentTypeError(f"{_subject(what)}must be an integer, got {text!r}")
        value = int(raw)
        if maximum is None and abs(value) > MAX_SIZE:
            raise argparse.ArgumentTypeError(f"{_subject(what)}must be at most {MAX_SIZE:,}, got {text!r}")
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(
                f"{_subject(what)}must be {_bounds(minimum, maximum)}, got {value}"
            )
        return value

    parse.__name__ = what
    return parse


def real(minimum: float = 0.0, *, inclusive: bool = False, what: str = "value") -> Callable[[str], float]:
    """``type=`` for a finite float ``> minimum`` (``>=`` when ``inclusive``)."""

    def parse(text: str) -> float:
        try:
            value = float(str(text).strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{_subject(what)}must be a number, got {text!r}") from None
        ok = value >= minimum if inclusive else value > minimum
        if not ok or value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(
                f"{_subject(what)}must be a finite number {'>=' if inclusive else '>'} {minimum:g}, got {text!r}"
            )
        return value

    parse.__name__ = what
    return parse


def non_empty(what: str) -> Callable[[str], str]:
    """``type=`` for a string with something in it besides whitespace."""

    def parse(text: str) -> str:
        if not str(text).strip():
            raise argparse.ArgumentTypeError(f"{_subject(what)}is empty: give some text")
        return text

    parse.__name__ = what
    return parse


def method(text: str) -> str:
    """One method spec, canonical (``"swa:64"`` -> ``"swa:64:4"``)."""
    from ..runtime.spec import parse_spec

    try:
        return str(parse_spec(text))
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def linear_method(text: str) -> str:
    """A method spec ``sinkwindow train`` trains: ``lolcats:W``, ``liger:W``, ``linear``, or ``swa:W:S`` (+ LoRA)."""
    from ..runtime.spec import parse_spec

    spec = method(text)
    parsed = parse_spec(spec)
    if parsed.adapter:
        raise argparse.ArgumentTypeError(
            f"train the method itself ({parsed.without_adapter}); the name after '@' is given when its adapter "
            f"ships or is evaluated (--checkpoint {parsed}=RUN_FOLDER)"
        )
    if not method_of(parsed).trainable:
        raise argparse.ArgumentTypeError(
            f"{spec} is not trained: train lolcats:W (e.g. lolcats:64), liger:W, linear, or swa:W:S (SWA + LoRA)"
        )
    return spec


def _method_items(text: str, other: Callable[[str], str | None] | None = None) -> list[str]:
    from ..runtime.spec import split_specs

    parts = split_specs(text)
    if not any(parts):
        raise argparse.ArgumentTypeError("give at least one method spec, e.g. full,swa:64:4")
    if not all(parts):
        raise argparse.ArgumentTypeError(f"empty item in {text!r}: separate methods with single commas")
    return [(other(p) if other is not None else None) or method(p) for p in parts]


class MethodsAction(argparse.Action):
    """``--methods a,b --methods c`` -> ``["a", "b", "c"]``, each canonical; repeats are refused.

    The first use replaces the default (argparse's ``append`` would add to it). ``other``: names
    one command accepts beside specs (``bench``'s peers): the canonical name, ``None`` for a name
    that is not one of them (then it must be a spec), or ``argparse.ArgumentTypeError``.
    """

    def __init__(self, *args, other: Callable[[str], str | None] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.other = other

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            items = _method_items(values, self.other)
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentError(self, str(err)) from None
        current = getattr(namespace, self.dest, None)
        done = [] if current is None or current is self.default else list(current)
        for item in items:
            if item in done:
                raise argparse.ArgumentError(self, f"method {item} is given twice")
            done.append(item)
        setattr(namespace, self.dest, done)


def parse_checkpoint(text: str) -> tuple[str | None, str]:
    """``"PATH"`` -> ``(None, PATH)``; ``"lolcats:64=PATH"`` -> ``("lolcats:64", PATH)``.

    The path must hold a checkpoint (a ``.safetensors`` file, a training run folder or a stage
    folder); it is checked now, so a typo fails before the model loads.
    """
    text = str(text).strip()
    name, sep, path = text.partition("=")
    spec: str | None = None
    if sep:
        from ..runtime.spec import parse_spec

        try:
            parsed = parse_spec(name)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name!r} before '=' is not a method spec: use PATH or METHOD=PATH (e.g. lolcats:64=runs/lolcats64)"
            ) from None
        if not parsed.is_trained:
            raise argparse.ArgumentTypeError(
                f"{parsed} takes no checkpoint: only trained methods do (lolcats:W, liger:W, linear, and METHOD@NAME "
                f"such as swa:256:4@lora)"
            )
        spec = str(parsed)
    else:
        path = text
    if not path.strip():
        raise argparse.ArgumentTypeError(
            "no checkpoint path: use PATH or METHOD=PATH (e.g. lolcats:64=runs/lolcats64)"
        )
    from ..linear.checkpoint import resolve_checkpoint

    try:
        resolve_checkpoint(path)
    except FileNotFoundError as err:
        method = spec or "METHOD"
        raise argparse.ArgumentTypeError(
            f"{err}: train one with `sinkwindow train --method {method} --data DATA --out {path}`"
        ) from None
    return spec, path


class CheckpointAction(argparse.Action):
    """Repeatable ``--checkpoint``: a list of :func:`parse_checkpoint` pairs."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            pair = parse_checkpoint(values)
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentError(self, str(err)) from None
        current = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, [*(current or []), pair])


def out_dir(text: str) -> str:
    """A run folder to create or resume; refuses a file (or a path under a file). Creates nothing."""
    if not str(text).strip():
        raise argparse.ArgumentTypeError("is empty: give a folder, e.g. runs/mine")
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a file: give a folder (new, or a run folder to resume)")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise argparse.ArgumentTypeError(
                    f"{parent} is a file, so {path} cannot be a folder: choose another --out"
                )
            break
    return str(path)


def existing_dir(what: str) -> Callable[[str], str]:
    """``type=`` for a folder that must already exist."""

    def parse(text: str) -> str:
        path = Path(text).expanduser()
        if not str(text).strip():
            raise argparse.ArgumentTypeError("is empty: give a folder")
        if not path.exists():
            raise argparse.ArgumentTypeError(f"{path} does not exist: check the path")
        if not path.is_dir():
            raise argparse.ArgumentTypeError(f"{path} is a file: give a folder")
        return str(path)

    parse.__name__ = what
    return parse


_DEVICE_RE = re.compile(r"auto|cpu|mps|(cuda|xpu)(:[0-9]+)?")


def device(text: str) -> str:
    """``auto``, ``cpu``, ``mps``, ``cuda`` / ``cuda:N`` (or ``xpu[:N]``)."""
    text = str(text).strip().lower()
    if not _DEVICE_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}: use auto, cpu, cuda, cuda:N or mps")
    return text


def device_map(text: str) -> str | dict[str, int | str]:
    """``type=`` of ``--device-map``: ``models.load_device_map``, and accelerate must be installed."""
    from ..models.loading import accelerate_available, load_device_map

    try:
        value = load_device_map(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if not accelerate_available():
        raise argparse.ArgumentTypeError("needs accelerate, which is not installed: pip install accelerate")
    return value


def add_model(p: argparse.ArgumentParser, *, default: str = DEFAULT_MODEL) -> None:
    """``--model``: a packaged name, hub id, folder or ``.gguf`` path."""
    p.add_argument(
        "--model",
        default=default,
        type=non_empty("--model"),
        help="packaged name, hub id, folder or .gguf (default: %(default)s)",
    )


def add_method(
    p: argparse.ArgumentParser, default: str, *, kind: Callable[[str], str] = method, help: str | None = None
) -> None:
    """``--method SPEC``: one method, checked while parsing (``kind`` narrows which)."""
    p.add_argument(
        "--method",
        default=default,
        type=kind,
        help=help or "full | swa:W[:S] | evict:W[:S] | lolcats:W | liger:W | linear (default: %(default)s)",
    )


def add_methods(
    p: argparse.ArgumentParser,
    default: Sequence[str] | None,
    *,
    help: str | None = None,
    other: Callable[[str], str | None] | None = None,
) -> None:
    """``--method`` / ``--methods``: specs, comma-separated and/or repeated (dest ``methods``);
    ``other``: names the command takes beside specs (see :class:`MethodsAction`)."""
    shown = ",".join(default) if default else "see below"
    p.add_argument(
        "--method",
        "--methods",
        dest="methods",
        action=MethodsAction,
        other=other,
        default=list(default) if default is not None else None,
        metavar="SPECS",
        help=help or f"method specs, comma-separated and/or repeated (default: {shown})",
    )


def add_checkpoint(p: argparse.ArgumentParser) -> None:
    """``--checkpoint PATH | METHOD=PATH`` (repeatable; dest ``checkpoint``, a list of pairs)."""
    p.add_argument(
        "--checkpoint",
        action=CheckpointAction,
        default=None,
        metavar="[METHOD=]PATH",
        help="trained linear baseline: a run folder or .safetensors; METHOD=PATH (e.g. lolcats:64=runs/lolcats64) "
        "names its method and adds it to the methods; a bare PATH goes to the one baseline among them (repeatable)",
    )


def add_device(p: argparse.ArgumentParser, default: str | None = "cpu", *, shown: str | None = None) -> None:
    """``--device``; ``shown`` says in the help what a ``None`` default means."""
    p.add_argument(
        "--device",
        default=default,
        type=device,
        help=f"auto (cuda if present), cpu, cuda, cuda:N, mps (default: {shown or '%(default)s'})",
    )


def add_device_map(p: argparse.ArgumentParser) -> None:
    """``--device-map``: let accelerate place the model's layers (a model larger than one GPU)."""
    p.add_argument(
        "--device-map",
        default=None,
        type=device_map,
        metavar="MAP",
        help="place the layers with accelerate instead of --device: auto, balanced, balanced_low_0, "
        "sequential, or a JSON file {module: device}; needs pip install accelerate (default: off)",
    )


def add_dtype(
    p: argparse.ArgumentParser,
    default: str | None = "float32",
    *,
    auto: bool = False,
    shown: str | None = None,
) -> None:
    """``--dtype`` of the weights (``auto`` too where the command resolves it)."""
    choices = (*DTYPES, "auto") if auto else DTYPES
    p.add_argument(
        "--dtype",
        default=default,
        choices=choices,
        help=f"weights' dtype (default: {shown or '%(default)s'})",
    )


def add_seed(p: argparse.ArgumentParser, default: int = 0, *, help: str = "random seed") -> None:
    p.add_argument(
        "--seed",
        type=integer(0, SEED_MAX, what="--seed"),
        default=default,
        help=f"{help}, 0 .. 2**32 - 1 (default: %(default)s)",
    )


def add_out(
    p: argparse.ArgumentParser,
    default: str | None = None,
    *,
    required: bool = False,
    help: str = "run folder",
) -> None:
    p.add_argument(
        "--out",
        type=out_dir,
        default=default,
        required=required,
        help=f"{help}; an existing file is refused" + (" (default: %(default)s)" if default else ""),
    )


def add_chunk_size(
    p: argparse.ArgumentParser, default: int | None = 512, *, help: str = "prefill chunk, tokens"
) -> None:
    p.add_argument(
        "--chunk-size",
        type=integer(1, what="--chunk-size"),
        default=default,
        help=f"{help} (default: %(default)s)",
    )


def add_native_sliding(
    p: argparse.ArgumentParser,
    *,
    help: str = "SWA on models with native sliding layers (Gemma 3's local layers): every layer (override), "
    "or the global layers only, the local ones keeping their own window (keep)",
) -> None:
    """``--native-sliding override|keep``: ``apply``'s ``native_sliding``."""
    p.add_argument(
        "--native-sliding",
        choices=("override", "keep"),
        default="override",
        help=f"{help} (default: %(default)s)",
    )


THREADS_HELP = (
    "torch CPU threads (default: OMP_NUM_THREADS if set, else the cores other processes leave free, from a "
    "0.25 s sample of /proc/stat: one fewer per core they keep busy, at least 1; printed on stderr). On a "
    "busy machine more threads are slower: OpenMP threads spin waiting for each other at every op"
)


def add_threads(
    p: argparse.ArgumentParser, *, help: str = "torch CPU threads (default: torch's choice)"
) -> None:
    """``--threads N``; commands that choose a count when it is not given (``sinkwindow.runtime.threads``:
    ``bench``, ``eval``, ``compare``) say so with ``help=THREADS_HELP``."""
    # 4096: more than any machine's cores; a typo beyond it would start that many threads.
    p.add_argument("--threads", type=integer(1, 4096, what="--threads"), default=None, help=help)


def add_no_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_no_resume(
    p: argparse.ArgumentParser, *aliases: str, help: str = "ignore what is already in --out"
) -> None:
    p.add_argument("--no-resume", *aliases, dest="no_resume", action="store_true", help=help)


def add_new_run(
    p: argparse.ArgumentParser,
    other: Callable[[str], str | None] | None = None,
    *,
    redo: bool = True,
    what: str = "the old rows are",
) -> None:
    """``--new-run`` (start the folder over) and, with ``redo``, ``--redo SPECS`` (start those methods
    over); ``other`` as in ``MethodsAction`` (names beside specs that ``--redo`` accepts). A command whose
    rows are not per method (``frontier``) passes ``redo=False`` and says what moves aside in ``what``."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--new-run",
        action="store_true",
        help=f"start over in --out: {what} moved aside, not mixed with the new ones",
    )
    if not redo:
        return
    g.add_argument(
        "--redo",
        action=MethodsAction,
        other=other,
        default=[],
        metavar="SPECS",
        help="run these methods again in --out (a retrained baseline): their rows move to previous-<time>/, "
        "every other method's rows are kept",
    )


def add_allow_dirty(p: argparse.ArgumentParser) -> None:
    """``--allow-dirty``: write rows from uncommitted source (``runs.provenance.check_clean_source``)."""
    p.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write rows from a source tree with uncommitted changes under src/sinkwindow (refused otherwise); "
        "each row then records the diff's sha256",
    )


def workers(text: str) -> int | str:
    """``--workers N``: a count >= 1, or ``auto`` (one per core)."""
    if text == "auto":
        return text
    return integer(1, what="--workers")(text)


def add_scheduler(p: argparse.ArgumentParser, *, unit: str = "cells") -> None:
    """``--workers [N]`` or ``--ray [ADDRESS]``: where the units of work run
    (``eval.scheduler.make_scheduler``); neither: one after another in this process."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--workers",
        nargs="?",
        const="auto",
        default=None,
        type=workers,
        metavar="N",
        help=f"run {unit} in N local worker processes, one model copy and one torch thread each "
        "(no N: one per core); results are the same as a serial run",
    )
    g.add_argument(
        "--ray",
        nargs="?",
        const=True,
        default=None,
        metavar="ADDRESS",
        help=f"run {unit} as Ray tasks on the cluster at ADDRESS (no ADDRESS: a local Ray instance); "
        "needs pip install 'sinkwindow[ray]'",
    )


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += [sub, *_subparsers(sub)]
    return found


def add_global_flags(parser: argparse.ArgumentParser) -> None:
    """``-v/--verbose`` and ``--debug`` on ``parser`` and, after the subcommands are added, on each of
    them, so that either flag works before or after the subcommand."""
    for i, p in enumerate([parser, *_subparsers(parser)]):
        # Subparsers leave the attribute alone unless the flag is given there (SUPPRESS), so a flag
        # given before the subcommand survives.
        default = False if i == 0 else argparse.SUPPRESS
        p.add_argument("-v", "--verbose", action="store_true", default=default, help="log at INFO level")
        p.add_argument(
            "--debug",
            action="store_true",
            default=default,
            help="show the traceback of an error instead of one line",
        )


_NEGATIVE_VALUE = re.compile(r"-\.?[0-9]")


def join_negative_values(argv: Sequence[str]) -> list[str]:
    """``--opt -5MiB`` as ``--opt=-5MiB``: argparse reads a value that starts with ``-`` and is not a
    plain negative number as an option, and answers "expected one argument" instead of letting the
    option's own type say what is wrong with the value."""
    out: list[str] = []
    argv = list(argv)
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            out += argv[i:]
            break
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if token.startswith("--") and "=" not in token and nxt is not None and _NEGATIVE_VALUE.match(nxt):
            out.append(f"{token}={nxt}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


_BYTE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_BYTE_RE = re.compile(r"([0-9][0-9_]*(?:\.[0-9]+)?|\.[0-9]+)\s*([a-zA-Z]*)")


def byte_size(text: str) -> int:
    """A memory size in bytes: ``"24MiB"``, ``"512KiB"``, ``"1.5GiB"`` (1024-based), ``"24MB"``
    (1000-based), or a plain integer of bytes; a fraction of a byte is dropped.

    Raises:
        argparse.ArgumentTypeError: anything else (a negative size included).
    """
    if str(text).strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"a byte size cannot be negative, got {text!r}: e.g. 24MiB")
    m = _BYTE_RE.fullmatch(str(text).strip())
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _BYTE_UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a byte size: use bytes (25165824) or a number with KiB/MiB/GiB (1024-based) "
            f"or KB/MB/GB (1000-based), e.g. 24MiB, 512KiB, 1.5GiB, 24MB"
        )
    whole, _, frac = m.group(1).replace("_", "").partition(".")
    scale = _BYTE_UNITS[unit]
    # Integer arithmetic: 1.5GiB is exactly 1610612736, with no float rounding.
    return int(whole or "0") * scale + (int(frac) * scale // 10 ** len(frac) if frac else 0)


def kv_budget(text: str) -> int:
    """``type=`` for a KV-cache budget: a :func:`byte_size` of more than 0 bytes."""
    value = byte_size(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 bytes, got {text!r} (e.g. 24MiB)")
    return value
