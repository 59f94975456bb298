"""KV memory of Llama-3.1-8B under full attention, SWA(256, 4) and a 4-full-layer hybrid (docs/large-models.md).

    python benchmarks/kv_table.py

Nothing is downloaded: the model is its published geometry (32 layers, 32 query heads, 8 KV heads,
head_dim 128, hidden 4096, MLP 14336, vocabulary 128256) in a ``LlamaConfig``. The KV bytes come
from ``sinkwindow.methods.method_of(spec).state_bytes`` (bfloat16, batch 1), the weights' bytes from
a parameter count of the same config built on the meta device, as is the size of the float64
copy ``sinkwindow check`` compares with (the first ``--layers`` decoder layers, 4 by default, plus
the embeddings and the head). Prints a Markdown table, then one JSON line with the numbers.
"""

from __future__ import annotations

import json

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sinkwindow import parse_spec
from sinkwindow.methods import method_of

CONFIG = LlamaConfig(
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    hidden_size=4096,
    intermediate_size=14336,
    vocab_size=128256,
    max_position_embeddings=131072,
    tie_word_embeddings=False,
)
DTYPE = torch.bfloat16
CONTEXTS = (4096, 32768, 131072)
# Four full layers spread through the depth; the other 28 keep SWA(256, 4).
METHODS = ("full", "swa:256:4", "swa:256:4+full:7,15,23,31")


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _times(a: int, b: int) -> str:
    ratio = a / b
    return f"{ratio:.1f}x" if ratio < 10 else f"{ratio:.0f}x"


def weight_bytes(config: LlamaConfig, dtype: torch.dtype, layers: int | None = None) -> int:
    """Bytes of the weights in ``dtype`` (of the first ``layers`` decoder layers only, if given),
    counted on the meta device: no memory is allocated."""
    if layers is not None:
        config = LlamaConfig(**{**config.to_dict(), "num_hidden_layers": layers})
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return sum(p.numel() for p in model.parameters()) * torch.empty((), dtype=dtype).element_size()


def main() -> None:
    specs = [parse_spec(m) for m in METHODS]
    kv = {str(s): {n: method_of(s).state_bytes(CONFIG, n, dtype=DTYPE) for n in CONTEXTS} for s in specs}
    full = kv["full"]
    print("| context | " + " | ".join(f"`{s}`" for s in kv) + " |")
    print("|---:|" + "---:|" * len(kv))
    for n in CONTEXTS:
        cells = [_size(full[n])]
        cells += [f"{_size(kv[m][n])} ({_times(full[n], kv[m][n])} less)" for m in list(kv)[1:]]
        print(f"| {n // 1024}K | " + " | ".join(cells) + " |")
    weights = weight_bytes(CONFIG, DTYPE)
    reference = weight_bytes(CONFIG, torch.float64, layers=4)
    print(f"\nWeights: {_size(weights)} in bfloat16; KV per token under full attention: "
          f"{full[CONTEXTS[0]] // CONTEXTS[0] // 1024} KiB; sinkwindow check's float64 copy "
          f"(4 layers + embeddings + head): {_size(reference)}.")  # fmt: skip
    print(json.dumps({"model": "Llama-3.1-8B geometry", "dtype": "bfloat16", "batch": 1, "weight_bytes": weights,
                      "check_reference_bytes": reference, "kv_bytes": kv}))  # fmt: skip


if __name__ == "__main__":
    main()
