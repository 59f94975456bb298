"""Trained baselines that ship inside the package, so ``--method lolcats:256`` works with no checkpoint.

A shipped adapter is an ordinary checkpoint (``checkpoint.py``: feature maps, window factors and
LoRA tensors only, never base weights) stored as package data under ``adapters/``, named after the
packaged model and the spec::

    adapters/smollm2-135m--lolcats256.safetensors
    adapters/smollm2-135m--lolcats256.json        provenance

The provenance JSON records what produced the tensors (data file and its sha256, token budgets,
steps, seed, validation losses, the exact command, the sinkwindow commit), the file's own sha256,
and the logits the exported model gave on a fixed prompt, so a test can prove that what loads
today is what was trained (``verify_adapter``).

Adapters are keyed by the *packaged* model name (``smollm2-135m``): they were trained on that
model's exact weights (the de-quantised GGUF), so a hub copy of the same model does not pick them
up silently; pass ``checkpoint=`` to use one elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from ..runtime.spec import MethodSpec, parse_spec

__all__ = [
    "ADAPTER_DIR",
    "PACKAGE_BUDGET_BYTES",
    "adapter_stem",
    "file_sha256",
    "list_adapters",
    "probe_logits",
    "read_provenance",
    "shipped_adapter",
    "verify_adapter",
]

ADAPTER_DIR = Path(__file__).resolve().parent / "adapters"
# Every shipped adapter together: the wheel carries them all. 32 MiB holds the paper-recipe baselines
# (lolcats:256, liger:256, linear: 18 MiB), the length-trained LoLCATs (8 MiB) and the equal-budget
# SWA + LoRA control (3.5 MiB), well inside PyPI's 100 MB file limit.
PACKAGE_BUDGET_BYTES = 32 * 2**20


def adapter_stem(model_name: str, spec: str | MethodSpec) -> str:
    """File stem of a shipped adapter: ``smollm2-135m--lolcats256``."""
    return f"{model_name}--{str(parse_spec(spec)).replace(':', '').replace('@', '-')}"


def shipped_adapter(model_name: str | None, spec: str | MethodSpec) -> Path | None:
    """The shipped checkpoint for (packaged model, spec), or ``None`` if there is none."""
    if not model_name:
        return None
    p = ADAPTER_DIR / f"{adapter_stem(model_name, spec)}.safetensors"
    return p if p.is_file() else None


def list_adapters() -> list[dict]:
    """Every shipped adapter's provenance (with ``path``), sorted by file name."""
    out = []
    for p in sorted(ADAPTER_DIR.glob("*.safetensors")):
        prov = read_provenance(p)
        out.append(dict(prov, path=str(p)))
    return out


def read_provenance(path: str | os.PathLike) -> dict:
    """The provenance JSON beside a shipped ``.safetensors`` file."""
    p = Path(path).with_suffix(".json")
    if not p.is_file():
        raise FileNotFoundError(f"no provenance file {p} beside the adapter")
    return json.loads(p.read_text())


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@torch.no_grad()
def probe_logits(model, input_ids: torch.Tensor, vocab_ids: list[int]) -> list[list[float]]:
    """Logits of ``input_ids`` (1, L) at every position for ``vocab_ids`` only: (L, len(vocab_ids)).

    A spread of vocabulary ids rather than whole rows keeps the provenance small (a row of SmolLM2
    is 49,152 floats) while any change to the adapter or the kernels still shows.
    """
    logits = model(input_ids, use_cache=False).logits[0].float()
    return logits[:, list(vocab_ids)].tolist()


def verify_adapter(path: str | os.PathLike, model=None, atol: float | None = None) -> dict:
    """Check a shipped adapter against its provenance; raise ``ValueError`` on any mismatch.

    Always checks the file's sha256. With ``model`` (the packaged model, already converted and
    loaded with this adapter) it also recomputes the probe logits and compares them with the ones
    recorded at export, within ``atol`` (default: the provenance's ``probe.atol``).

    Returns:
        ``{"sha256": ..., "max_abs_logit_diff": float | None}``.
    """
    prov = read_provenance(path)
    sha = file_sha256(path)
    if sha != prov["sha256"]:
        raise ValueError(f"{path}: sha256 {sha} does not match its provenance ({prov['sha256']})")
    diff = None
    if model is not None:
        probe = prov["probe"]
        got = torch.tensor(probe_logits(model, torch.tensor([probe["input_ids"]]), probe["vocab_ids"]))
        want = torch.tensor(probe["logits"])
        diff = float((got - want).abs().max())
        tol = probe["atol"] if atol is None else atol
        if diff > tol:
            raise ValueError(f"{path}: probe logits differ by {diff:.3g} from export (tolerance {tol})")
    return {"sha256": sha, "max_abs_logit_diff": diff}
