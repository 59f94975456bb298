"""Package attributes load on first use: `import sinkwindow` and the CLI's parser stay free of torch."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _fresh(code: str) -> str:
    """Run ``code`` in a new interpreter (this one has torch loaded already); its stdout."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_package_and_the_whole_cli_parser_import_no_torch():
    code = (
        "import sys, sinkwindow\n"
        "from sinkwindow.cli import build_parser\n"
        "build_parser()\n"  # every subcommand's flags, as --help and flag errors need them
        "print(sorted(m for m in ('torch', 'transformers', 'lm_eval.api.model') if m in sys.modules))"
    )
    assert _fresh(code) == "[]"


def test_a_public_name_is_not_shadowed_by_the_submodule_of_the_same_name():
    # linear/convert.py defines sinkwindow.linear.convert; tuning/calibrate.py alike.
    code = (
        "import sinkwindow, sinkwindow.runtime.prefill, sinkwindow.runtime.generate\n"
        "import sinkwindow.linear.convert, sinkwindow.tuning.calibrate\n"
        "from sinkwindow import linear, tuning\n"
        "names = [sinkwindow.prefill, sinkwindow.generate, linear.convert, tuning.calibrate, tuning.tune]\n"
        "print(all(callable(f) and f.__name__ in ('prefill', 'generate', 'convert', 'calibrate', 'tune') "
        "and not isinstance(f, type(sinkwindow)) for f in names))"
    )
    assert _fresh(code) == "True"


@pytest.mark.parametrize(
    "package",
    [
        "sinkwindow",
        "sinkwindow.linear",
        "sinkwindow.train",
        "sinkwindow.runs",
        "sinkwindow.serve",
        "sinkwindow.bench",
        "sinkwindow.tuning",
    ],
)
def test_every_name_in_all_resolves_and_unknown_names_raise(package):
    import importlib

    mod = importlib.import_module(package)
    for name in mod.__all__:
        assert getattr(mod, name) is not None
        assert name in dir(mod)
    with pytest.raises(AttributeError, match="no_such_name"):
        mod.no_such_name  # noqa: B018
