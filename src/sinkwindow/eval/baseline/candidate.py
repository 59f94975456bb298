"""What a candidate is, how it loads, and the check that it and its base see the same samples.

A candidate is either a method spec of the base (``lolcats:256``, ``liger:256``, ``linear``:
sinkwindow's own retrofits, run on the base's weights through ``use_method`` exactly as ``compare``
runs them) or a causal LM of its own (hub id, folder, ``.gguf``), run as it is: its own layers,
its own cache, no patching.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Candidate", "parse_candidate", "load_candidate", "check_same_vocab", "check_same_prompts"]


@dataclass(frozen=True)
class Candidate:
    """A candidate as given.

    Attributes:
        name: what was given (``--candidate``).
        spec: the canonical method spec when the candidate is a method of the base (``lolcats:256``),
            else ``None`` (a model of its own).
    """

    name: str
    spec: str | None = None

    @property
    def is_method(self) -> bool:
        return self.spec is not None


def parse_candidate(text: str) -> Candidate:
    """``lolcats:256``/``liger:256``/``linear`` (a spec of the base) or a model's name, path or hub id.

    A spec wins over a model name unless a file or folder of that name exists here.

    Raises:
        ValueError: an empty name, or ``full``/``swa``/``evict`` (the base's own rows, not a candidate).
    """
    from ...runtime.spec import parse_spec

    text = str(text).strip()
    if not text:
        raise ValueError(
            "--candidate is empty: give a model (hub id, folder, .gguf) or a retrofit spec such as lolcats:256"
        )
    if Path(text).expanduser().exists():
        return Candidate(text)
    try:
        spec = parse_spec(text)
    except ValueError:
        return Candidate(text)
    if not spec.is_trained:
        raise ValueError(
            f"--candidate {text} is one of the base's own attention methods, which the baseline runs anyway; "
            "give a sub-quadratic model or a retrofit spec (lolcats:W, liger:W, linear)"
        )
    return Candidate(text, str(spec))


def load_candidate(name: str, *, trust_remote_code: bool, dtype, device: str):
    """``(model, tokenizer)`` of a candidate model. Remote code runs only with ``trust_remote_code``.

    Without it, ``sinkwindow.load`` (packaged names, hub ids, folders, ``.gguf``); with it,
    transformers' ``from_pretrained`` with ``trust_remote_code=True`` (folders and hub ids; offline
    when ``HF_HUB_OFFLINE=1``).
    """
    if not trust_remote_code:
        from ...models.loading import load

        try:
            return load(name, dtype=dtype, device=device)
        except ValueError as err:
            if "scaled_dot_product_attention" not in str(err):
                raise
            # A family with no SDPA path (Mamba2 has no attention at all): its own implementation.
            return load(name, dtype=dtype, device=device, attn_implementation="eager")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    kw = dict(trust_remote_code=True, local_files_only=offline)
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, **kw).to(device).eval()
    return model, AutoTokenizer.from_pretrained(name, **kw)


def check_same_vocab(base_tok, cand_tok, base: str, candidate: str) -> None:
    """Refuse a candidate whose vocabulary is not its base's: the samples would not be the same tokens.

    Raises:
        ValueError: one line naming how the vocabularies differ.
    """
    a, b = base_tok.get_vocab(), cand_tok.get_vocab()
    if a == b:
        return
    differ = sum(1 for k in set(a) | set(b) if a.get(k) != b.get(k))
    raise ValueError(
        f"{candidate} and {base} have different tokenizers ({len(b):,} vs {len(a):,} tokens, {differ:,} "
        "entries differ), so their samples would not be identical: give the base the candidate was made from"
    )


def check_same_prompts(base_ids, cand_ids, where: str) -> None:
    """Refuse when a sample's prompt is not the same token ids for both (a chat template that differs).

    Raises:
        ValueError: one line naming the sample.
    """
    if base_ids.shape != cand_ids.shape or not bool((base_ids == cand_ids).all()):
        raise ValueError(
            f"the candidate and the base tokenize {where} differently ({base_ids.shape[-1]} vs "
            f"{cand_ids.shape[-1]} tokens; a different chat template?): the samples must be identical"
        )
