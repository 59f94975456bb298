"""Notices: library code says what a long run does through one logger, which the CLI shows."""

import io
import logging

from sinkwindow.runtime.notices import NOTICES, show_notices


def test_notices_are_silent_until_shown_then_printed_once_as_plain_lines(capsys):
    # As in a program that never ran a command (an earlier test's CLI run showed them).
    for handler in list(NOTICES.handlers):
        NOTICES.removeHandler(handler)
    NOTICES.propagate = True
    NOTICES.setLevel(logging.NOTSET)
    NOTICES.info("before")  # a program that configured nothing sees nothing on stderr
    assert "before" not in capsys.readouterr().err
    show_notices()
    show_notices()  # a second command in the same process: still one line per notice
    NOTICES.info("torch threads: %d", 1)
    assert capsys.readouterr().err == "torch threads: 1\n"


def test_notices_go_to_a_given_stream_and_not_through_the_root_logger():
    stream, root_stream = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    root_handler = logging.StreamHandler(root_stream)  # what the CLI's basicConfig(--verbose) adds
    root.addHandler(root_handler)
    level = root.level
    root.setLevel(logging.INFO)
    try:
        show_notices(stream)
        NOTICES.info("finetune step 8/16")
    finally:
        root.removeHandler(root_handler)
        root.setLevel(level)
        show_notices()  # leave the default for the other tests
    assert stream.getvalue() == "finetune step 8/16\n"
    assert root_stream.getvalue() == ""  # shown once, by its own handler
