"""Run identity: the settings that can change a long-context result, and a short hash of them.

:func:`run_settings` turns an ``EvalConfig`` (and the loaded model, when there is one) into a flat,
readable dict; the run folder keeps it in ``fingerprint.json``. Every row carries
:func:`row_fingerprint`, a 12-hex-digit hash of the part of that dict that applies to the row.
A resume compares the folder's settings with the new ones (:func:`conflicts`) and refuses on any
difference, so rows made under other settings are never reused or mixed in.

In (the keys of the settings dict):

- ``model``: the name given (packaged name, ``.gguf`` path, folder or hub id).
- ``model_file``: what that name is: ``sha256:<hex>`` of the GGUF for a packaged name or a
  ``.gguf`` path (hashed once, then cached by path, size and mtime in
  ``$SINKWINDOW_CACHE/sha256.json``); for a folder, ``folder:<hex>``, a hash of its files: the
  contents of files up to 64 MiB (config.json, tokenizer files, small weights) and the name, size
  and mtime of larger ones (so re-saving big weights counts as a change); ``revision:<commit>`` for
  a hub id (the loaded model's commit, else the local hub cache's ``main``, else ``unknown``);
  ``unknown`` for any other name (an in-memory model handed to ``run_eval``: only its name counts).
- ``dtype`` (of the parameters) and ``device`` (the kind: ``cpu``, ``cuda``, ``mps``; not the index).
  A device map counts as the kind of device it computes on (:func:`device_map_kind`), never as
  the map: where each layer sits changes memory, not results (every layer runs the same kernels
  in the same dtype, and offloaded weights are copied in unchanged).
- ``chunk_size``, ``native_sliding``, ``seed``.
- ``sinkwindow``: the version that generated the samples and scored them.
- Task parameters, applying only to rows of their tasks: ``niah_max_new_tokens`` (S-NIAH and
  RULER's other NIAH tasks), ``babilong_facts``, ``babilong_data`` (``folder:<hex>`` of its file
  names and sizes, or ``None``), ``babilong_chat`` (BABILong), ``ruler_qa_data`` (RULER QA, like
  ``babilong_data``), ``ppl_bucket`` (perplexity).
- ``checkpoint[M]``: ``sha256:<hex>`` of the trained checkpoint of linear baseline ``M``, explicit
  or shipped (``M``'s rows only).

Out: what a run selects (methods, tasks, lengths, samples, ppl_windows: sample ``i`` of a
(task, length) is the same however many samples are drawn, since every generator is one seeded
stream), ``batch_size``, worker and torch thread counts (they must not change results), progress
bars, the output folder and timings.

A row's fingerprint covers the global keys, its task's parameters, its method and that method's
checkpoint. Task parameters and checkpoints of tasks and methods a run does not touch are not
compared: ``eval babilong`` may resume a folder whose S-NIAH rows used another decode cap.

lm-eval runs (``eval lm-eval``, ``compare --short-data``) have settings of their own,
:func:`lmeval_settings` (shots, limit and data files per task, lm-eval's version, ...), checked and
recorded the same way; :func:`lmeval_row_fingerprint` is their rows' fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..runs.folder import settings_fingerprint
from .tasks import TASKS, tasks_using

__all__ = [
    "folder_identity",
    "run_settings",
    "row_settings",
    "row_fingerprint",
    "settings_fingerprint",
    "conflicts",
    "cached_sha256",
    "lmeval_settings",
    "lmeval_row_settings",
    "lmeval_row_fingerprint",
    "checkpoint_method",
    "concerns",
    "without_checkpoints",
    "data_files_identity",
]

logger = logging.getLogger(__name__)

GLOBAL_SETTINGS = (
    "model",
    "model_file",
    "dtype",
    "device",
    "chunk_size",
    "native_sliding",
    "seed",
    "sinkwindow",
)
# Files above this are identified by name, size and mtime, not by their contents.
CONTENT_HASH_LIMIT = 64 << 20


def _checkpoint_key(method: str) -> str:
    return f"checkpoint[{method}]"


def checkpoint_method(key: str) -> str | None:
    """The method whose checkpoint a settings key records (``checkpoint[M]`` -> ``M``), else ``None``."""
    return key[len("checkpoint[") : -1] if key.startswith("checkpoint[") and key.endswith("]") else None


def without_checkpoints(settings: dict, methods: Iterable[str]) -> dict:
    """``settings`` without the recorded checkpoints of ``methods`` (a retrained baseline's rows go)."""
    drop = {_checkpoint_key(m) for m in methods}
    return {k: v for k, v in settings.items() if k not in drop}


def _applies(key: str, task: str, method: str) -> bool:
    if key in GLOBAL_SETTINGS:
        return True
    if key.startswith("checkpoint["):
        return key == _checkpoint_key(method)
    return task in tasks_using(key)


def concerns(key: str, cells: Iterable[tuple[str, str]]) -> bool:
    """Whether a settings ``key`` can have changed any row of the ``(task, method)`` cells a folder holds.

    A method's checkpoint concerns only that method's rows and a task parameter only its task's;
    every other key concerns every row. So a setting recorded by a run that stored no row it
    applies to (a bad checkpoint that failed to load, a Ctrl-C before the first sample) does not
    make the folder refuse the next run.
    """
    cells = list(cells)
    method = checkpoint_method(key)
    if method is not None:
        return any(m == method for _, m in cells)
    tasks = tasks_using(key)
    if tasks:
        return any(t in tasks for t, _ in cells)
    return True


def row_settings(settings: dict, task: str, method: str) -> dict:
    """The part of ``settings`` that can change a row of ``task`` under ``method``, plus the method."""
    out = {k: v for k, v in settings.items() if _applies(k, task, method)}
    out["method"] = method
    return out


def row_fingerprint(settings: dict, task: str, method: str) -> str:
    return settings_fingerprint(row_settings(settings, task, method))


def conflicts(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """``(key, old, new)`` for every setting both runs define differently.

    A global key missing on one side counts as a difference; task parameters and checkpoints are
    compared only where both runs have them (a run without S-NIAH has no decode cap to compare).
    """
    out = []
    for key in sorted(set(old) | set(new)):
        if key not in GLOBAL_SETTINGS and (key not in old or key not in new):
            continue
        if old.get(key) != new.get(key):
            out.append((key, old.get(key), new.get(key)))
    return out


def cached_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file, remembered by (resolved path, size, mtime) in ``$SINKWINDOW_CACHE/sha256.json``."""
    from ..linear.adapters import file_sha256
    from ..models.loading import cache_root

    p = Path(path).resolve()
    st = p.stat()
    stamp = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    index_path = cache_root() / "sha256.json"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, json.JSONDecodeError):
        index = {}
    hit = index.get(str(p))
    if isinstance(hit, dict) and {k: hit.get(k) for k in stamp} == stamp and hit.get("sha256"):
        return hit["sha256"]
    digest = file_sha256(p)
    # Entries of files that are gone (temporary folders) would only grow the index.
    index = {k: v for k, v in index.items() if os.path.exists(k)}
    index[str(p)] = {**stamp, "sha256": digest}
    try:
        index_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = index_path.with_name(f"sha256.json.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(index, indent=1, sort_keys=True))
        tmp.replace(index_path)
    except OSError as err:  # a read-only cache only costs the next run the same hashing
        logger.debug("could not cache the sha256 of %s: %s", p, err)
    return digest


def _folder_digest(folder: Path, files: Iterable[Path], contents: bool) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        st = f.stat()
        rel = f.relative_to(folder).as_posix()
        if contents and st.st_size <= CONTENT_HASH_LIMIT:
            h.update(f"{rel}\0{cached_sha256(f)}\n".encode())
        elif contents:
            h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        else:
            h.update(f"{rel}\0{st.st_size}\n".encode())
    return h.hexdigest()[:16]


def _visible_files(folder: Path, recursive: bool) -> list[Path]:
    found = folder.rglob("*") if recursive else folder.iterdir()
    return [
        f
        for f in found
        if f.is_file() and not any(part.startswith(".") for part in f.relative_to(folder).parts)
    ]


def _hub_revision(repo_id: str, model) -> str:
    commit = getattr(getattr(model, "config", None), "_commit_hash", None)
    if commit:
        return str(commit)
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(repo_id, "config.json")
    except Exception as err:  # noqa: BLE001 - an unreadable hub cache just leaves the revision unknown
        logger.debug("no hub revision for %s: %s", repo_id, err)
        return "unknown"
    # The cache keeps files under snapshots/<commit>/.
    return Path(hit).parent.name if isinstance(hit, str) else "unknown"


def folder_identity(path: Path) -> str:
    """A data folder as a setting: ``folder:`` and a digest of its visible files' names, sizes and mtimes."""
    return "folder:" + _folder_digest(path, _visible_files(path, recursive=True), False)


def model_identity(name: str, model=None) -> str:
    """``model_file`` of :func:`run_settings` (see the module docstring)."""
    from ..models.loading import PACKAGED_MODELS, resolve_gguf

    path = Path(name).expanduser()
    if name in PACKAGED_MODELS:
        return "sha256:" + cached_sha256(resolve_gguf(name))
    if path.suffix == ".gguf" and path.is_file():
        return "sha256:" + cached_sha256(path)
    if path.is_dir():
        return "folder:" + _folder_digest(path, _visible_files(path, recursive=False), contents=True)
    if "/" in name and not path.exists():
        return "revision:" + _hub_revision(name, model)
    return "unknown"


def _param_dtype_device(model) -> tuple[str, str] | None:
    """``(dtype, device kind)`` of a loaded model; the kind is where its inputs go, so a dispatched
    model whose first weights are offloaded (``meta``) still counts as the device it computes on."""
    from ..runtime.prefill import input_device

    try:
        p = next(model.parameters())
    except (AttributeError, StopIteration):
        return None
    try:
        kind = input_device(model).type
    except (AttributeError, NotImplementedError):  # no input embeddings to ask
        kind = p.device.type
    return str(p.dtype).removeprefix("torch."), kind


def device_kind(device: str | None) -> str:
    """``cpu`` for ``None``; ``auto`` is cuda when there is one; ``cuda:1`` -> ``cuda``."""
    import torch

    if device is None:
        return "cpu"
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device).type


def device_map_kind(device_map: str | Mapping | None) -> str:
    """The kind of device a model placed by ``device_map`` computes on: what the fingerprint records.

    A strategy (``auto``, ``balanced`` ...) fills the GPUs first, so it is ``cuda`` where there is
    one (else ``mps``, else ``cpu``). In a ``{module: device}`` map, ``cpu`` and ``disk`` entries
    are offloaded weights that run on the map's first accelerator, so the kind is that
    accelerator's (a GPU index is ``cuda``), or ``cpu`` when the map names none.
    """
    import torch

    if device_map is None:
        return "cpu"
    if isinstance(device_map, str):
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"
    for where in device_map.values():
        if isinstance(where, int):
            return "cuda"
        if str(where) not in ("cpu", "disk"):
            return torch.device(str(where)).type
    return "cpu"


def _checkpoint_file(config, method: str) -> Path | None:
    return _checkpoint_of(config.model, config.checkpoints.get(method), method)


def _checkpoint_of(model_name: str, given: str | os.PathLike | None, method: str) -> Path | None:
    """The checkpoint file linear baseline ``method`` runs with: ``given``, else the shipped one."""
    from ..linear.adapters import shipped_adapter
    from ..linear.checkpoint import resolve_checkpoint

    if given is not None:
        return resolve_checkpoint(given)
    return shipped_adapter(model_name, method)


def _checkpoint_identity(model_name: str, given: str | os.PathLike | None, method: str) -> str | None:
    path = _checkpoint_of(model_name, given, method)
    return None if path is None else "sha256:" + cached_sha256(path)


def run_settings(config, model=None) -> dict[str, Any]:
    """The settings of ``config`` (an ``EvalConfig``) that can change a result, as a flat dict.

    ``model``: the loaded model when the caller has one; its parameters' dtype and device then
    count (and must agree with ``config.dtype``/``config.device`` where those are set).

    Raises:
        ValueError: ``config.dtype``/``config.device`` disagree with ``model``.
        FileNotFoundError: a packaged model that is not installed, or a missing checkpoint.
    """
    import importlib.metadata as md

    from ..runtime.spec import parse_spec

    dtype = config.dtype or "float32"
    device_map = getattr(config, "device_map", None)
    device = device_kind(config.device) if device_map is None else device_map_kind(device_map)
    seen = _param_dtype_device(model) if model is not None else None
    if seen is not None:
        if config.dtype is not None and seen[0] != config.dtype:
            raise ValueError(
                f"the model given is {seen[0]} but the config asks for dtype {config.dtype}: load it with "
                f"dtype=torch.{config.dtype}, or leave dtype unset"
            )
        if config.device is not None and seen[1] != device:
            raise ValueError(
                f"the model given is on {seen[1]} but the config asks for device {config.device}: move it "
                f"there, or leave device unset"
            )
        dtype, device = seen
    try:
        version = md.version("sinkwindow")
    except md.PackageNotFoundError:
        version = "unknown"
    settings: dict[str, Any] = {
        "model": config.model,
        "model_file": model_identity(config.model, model),
        "dtype": dtype,
        "device": device,
        "chunk_size": config.chunk_size,
        "native_sliding": config.native_sliding,
        "seed": config.seed,
        "sinkwindow": version,
    }
    for task in config.tasks:  # each task's own parameters (eval/tasks/)
        settings.update(TASKS[task].settings(config))
    for method in config.methods:
        if parse_spec(method).is_trained:
            settings[_checkpoint_key(method)] = _checkpoint_identity(
                config.model, config.checkpoints.get(method), method
            )
    return settings


def _lmeval_version() -> str:
    import importlib.metadata as md

    for name in ("lm_eval", "lm-eval"):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return "unknown"


def data_files_identity(files: Mapping[str, str | os.PathLike]) -> str:
    """``files:<hex>`` of ``{split: path}``: each split's file name, size and sha256 (not its folder,
    so moving the data keeps the identity)."""
    h = hashlib.sha256()
    for split in sorted(files):
        path = Path(files[split])
        h.update(f"{split}\0{path.name}\0{path.stat().st_size}\0{cached_sha256(path)}\n".encode())
    return "files:" + h.hexdigest()[:16]


def lmeval_settings(
    model_name: str,
    methods: Iterable[str],
    tasks: Mapping[str, Mapping[str, Any]],
    *,
    model=None,
    dtype: str = "float32",
    device: str = "cpu",
    checkpoints: Mapping[str, str | os.PathLike | None] | None = None,
    data_source: str = "local",
    max_length: int | None = None,
    bootstrap_iters: int = 1000,
) -> dict[str, Any]:
    """The settings that can change the rows of an lm-eval run (``eval/lmeval/runner.py``), flat.

    In: the ``model`` name and ``model_file`` (:func:`model_identity`), ``dtype`` and ``device`` kind
    (the loaded ``model``'s parameters' when one is given), ``sinkwindow`` and ``lm_eval`` versions,
    ``data_source`` (``local`` or ``hub``), ``max_length`` (prompt truncation) and
    ``bootstrap_iters`` (stderrs); per task ``num_fewshot[T]``, ``limit[T]`` and, for local data,
    ``data[T]`` (:func:`data_files_identity`); per linear baseline ``checkpoint[M]`` (sha256).
    Out: batch size and ``max_batch_tokens`` (they regroup the same requests), the output folder,
    timings. Per-task and per-method keys are compared only where both runs have them, as
    :func:`conflicts` does, so a run of other tasks may resume the folder.

    Args:
        tasks: ``{task: {"num_fewshot": int, "limit": int | float | None, "files": {split: path} | None}}``.
        checkpoints: the checkpoint given for each method (``None``: the shipped one, if any).
    """
    import importlib.metadata as md

    from ..runtime.spec import parse_spec

    seen = _param_dtype_device(model) if model is not None else None
    if seen is not None:
        dtype, device = seen
    try:
        version = md.version("sinkwindow")
    except md.PackageNotFoundError:
        version = "unknown"
    settings: dict[str, Any] = {
        "model": model_name,
        "model_file": model_identity(model_name, model),
        "dtype": dtype,
        "device": device_kind(device),
        "sinkwindow": version,
        "lm_eval": _lmeval_version(),
        "data_source": data_source,
        "max_length": max_length,
        "bootstrap_iters": bootstrap_iters,
    }
    for task, spec in tasks.items():
        settings[f"num_fewshot[{task}]"] = spec["num_fewshot"]
        settings[f"limit[{task}]"] = spec["limit"]
        if spec.get("files") is not None:
            settings[f"data[{task}]"] = data_files_identity(spec["files"])
    for method in methods:
        if parse_spec(method).is_trained:
            given = (checkpoints or {}).get(method)
            settings[_checkpoint_key(method)] = _checkpoint_identity(model_name, given, method)
    return settings


def lmeval_row_settings(settings: dict, task: str, method: str) -> dict:
    """The part of lm-eval ``settings`` that can change the row of (``task``, ``method``), plus the
    method: the unscoped keys, ``X[task]`` and ``checkpoint[method]``."""
    out = {}
    for key, value in settings.items():
        name, bracket, scope = key.partition("[")
        if not bracket or scope[:-1] == (method if name == "checkpoint" else task):
            out[key] = value
    out["method"] = method
    return out


def lmeval_row_fingerprint(settings: dict, task: str, method: str) -> str:
    return settings_fingerprint(lmeval_row_settings(settings, task, method))
