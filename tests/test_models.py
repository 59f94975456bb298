"""Model loading: names, hub ids and the offline switch (no network is ever used here)."""

from __future__ import annotations

import pytest

import sinkwindow


def test_offline_hub_id_names_the_switch(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="offline mode is on.*unset it"):
        sinkwindow.load("sinkwindow-tests/no-such-model")


def test_offline_argument_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    with pytest.raises(FileNotFoundError, match="offline mode is on"):
        sinkwindow.load("sinkwindow-tests/no-such-model", offline=True)


@pytest.mark.parametrize("name", ["smollm9", "", "  ", "missing.gguf"])
def test_unknown_names_list_what_works(name):
    with pytest.raises((ValueError, FileNotFoundError), match="packaged|no GGUF"):
        sinkwindow.load(name)


def test_a_folder_without_a_model_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        sinkwindow.load(str(tmp_path))


def test_loaded_model_remembers_its_name(tiny_folder):
    from sinkwindow.method import model_name

    model, _ = sinkwindow.load(str(tiny_folder))
    assert model_name(model) == str(tiny_folder)
