"""The run-folder contract every writer of results follows (eval, lm-eval, bench, training).

A run folder is resumable and never mixes settings:

- one writer at a time (:class:`~.folder.RunLock`, an advisory ``flock`` on ``.lock``);
- ``fingerprint.json`` records the settings its rows depend on; a re-run with other settings is
  refused with :class:`~.folder.RunMismatchError` naming what differs;
- nothing is deleted: ``--new-run`` moves the old files to ``previous-<UTC time>/`` and
  ``--redo METHODS`` moves only those methods' rows there;
- a torn last line (a kill mid-append) is cut off, so the next append starts on a fresh line;
- every row names the code and libraries that made it (:mod:`.provenance`), and every invocation
  appends a line to ``sessions.jsonl`` (:mod:`.sessions`).

What a row *is* belongs to its writer (``eval/results.py``, ``bench/folder.py``, ``train/``);
this package knows files, not tasks or methods, and imports nothing of sinkwindow above it.
"""

from .._lazy import lazy_package

# Public names by the module that defines them; each loads on first use (see _lazy.py).
__all__ = lazy_package(
    __name__,
    {
        ".folder": [
            "FINGERPRINT_FILE", "RunLock", "RunLockedError", "RunMismatchError", "check_run_dir", "move_aside",
            "previous_dir", "read_settings", "repair_tail", "replace_lines", "settings_fingerprint",
            "split_method_rows", "write_settings", "write_text_atomic",
        ],
        ".provenance": ["check_clean_source", "command_provenance", "library_versions", "source_commit", "source_state", "utc_now"],
        ".session_log": ["SESSIONS_FILE", "machine_info", "read_sessions", "session_lines", "session_summary",
                      "start_session"],
    },
)  # fmt: skip
