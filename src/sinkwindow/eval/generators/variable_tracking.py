"""RULER's variable tracking task ``vt`` (multi-hop tracing): one chain of five assignments.

A port of NVIDIA/RULER ``scripts/data/synthetic/variable_tracking.py`` as ``scripts/synthetic.yaml``
runs it (``type_haystack: noise``, ``num_chains: 1``, ``num_hops: 4``). A chain is
``VAR AAAAA = 12345``, ``VAR BBBBB = VAR AAAAA``, ... (five-letter upper-case names, the value
5 digits from ``numpy.random.randint(10000, 99999)``); its lines go into a haystack of noise lines at
sorted random positions, and the answer is every variable of the chain.

Kept from RULER: the template, the answer prefix (``{num_v}`` = 5, ``{query}`` = the value), the
30 generated tokens, the two streams (``random`` and ``numpy.random``, both seeded with the seed)
and the draw order, the noise line, the ``". \\n"`` clean-up, and the in-context example that
``main()`` always builds (``add_fewshot`` defaults to true in ``sys_vartrack_w_noise_random``
whatever the flag): first one example of three-letter names and value 12345 sized to 500 tokens
with its answer appended, then, for every sample, that example with its five names and its value
redrawn (``randomize_icl``: ``random.choices`` per name, then ``numpy`` for the value) put before
the task text. So no sample fits below about 700 tokens.

Deviations (also in :data:`DEVIATIONS`): the sizing (the example's and each sample's noise lines)
is per sample, the largest count that fits, found by replaying the sample's draws
(``ruler_common.size_sample``); RULER binary-searches one size on throw-away samples, consuming
random state, and shrinks in steps of 5 lines. RULER slices its name list into chains of five even
when a repeated name made it draw extra names (then it fails); here only the first chain is built.
"""

from __future__ import annotations

import logging
import string
from typing import Any

from .haystack import NOISE_HAYSTACK
from .ruler_common import RulerSample, Streams, size_sample, split_answer_prefix

__all__ = ["TEMPLATE", "ANSWER_PREFIX", "TOKENS_TO_GENERATE", "DEVIATIONS", "generate_vt"]

logger = logging.getLogger(__name__)

# RULER scripts/data/synthetic/constants.py, TASKS['variable_tracking'].
TOKENS_TO_GENERATE = 30
TEMPLATE = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above."
)
ANSWER_PREFIX = (
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables "
    "are assigned the value {query}, they are: "
)
NUM_CHAINS, NUM_HOPS = 1, 4
ICL_LENGTH = 500  # RULER main(): the in-context example's max_seq_length (nothing generated)

DEVIATIONS: tuple[str, ...] = (
    "sizing: per-sample largest noise haystack (1-line steps) that fits, found by replaying the "
    "sample's draws; RULER binary-searches one size on throw-away samples (consuming random state)",
)


def _chain(streams: Streams, is_icl: bool) -> tuple[list[str], list[str]]:
    """RULER ``generate_chains(1, 4, is_icl)``: the variable names and the chain's statements."""
    k, hops = (3, min(10, NUM_HOPS)) if is_icl else (5, NUM_HOPS)
    rng = streams.py
    names = [
        "".join(rng.choices(string.ascii_uppercase, k=k)).upper() for _ in range((hops + 1) * NUM_CHAINS)
    ]
    while len(set(names)) < NUM_CHAINS * (hops + 1):
        names.append("".join(rng.choices(string.ascii_uppercase, k=k)).upper())
    names = names[: hops + 1]
    first = f"VAR {names[0]} = 12345" if is_icl else f"VAR {names[0]} = {streams.np.randint(10000, 99999)}"
    return names, [first] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(hops)]


def _task_text(streams: Streams, n: int, is_icl: bool) -> tuple[str, list[str], list[str]]:
    """RULER ``generate_input_output(n, 1, 4, is_icl)``: text, answer names, the chain statements."""
    names, chain = _chain(streams, is_icl)
    value = chain[0].split("=")[-1].strip()
    lines = [NOISE_HAYSTACK] * n
    positions = sorted(streams.py.sample(range(len(lines)), len(chain)))
    for j, position in enumerate(positions):
        lines.insert(position + j, chain[j])
    context = "\n".join(lines).replace(". \n", ".\n")
    text = (TEMPLATE + ANSWER_PREFIX).format(context=context, query=value, num_v=NUM_HOPS + 1)
    return text, names, chain


def _randomize_icl(streams: Streams, example: str) -> str:
    """RULER ``randomize_icl``: fresh names for the example's answer names, a fresh value for 12345."""
    for item in example.strip().split()[-NUM_HOPS - 1 :]:
        new = "".join(streams.py.choices(string.ascii_uppercase, k=len(item))).upper()
        example = example.replace(item, new)
    return example.replace("12345", str(streams.np.randint(10000, 99999)))


def _icl_example(streams: Streams, count) -> str:
    """The example RULER's ``main()`` sizes to 500 tokens, with its answer: ``input + " " + names + "\\n"``."""

    def generate(s: Streams, n: int):
        text, names, _ = _task_text(s, n, is_icl=True)
        return text, names

    _, text, names, _ = size_sample(streams, generate, count, ICL_LENGTH, smallest=NUM_HOPS + 1, guess=None)
    return text + " " + " ".join(names) + "\n"


def generate_vt(tokenizer: Any, length: int, num_samples: int, seed: int = 42) -> list[RulerSample]:
    """Generate ``vt`` samples whose prompt plus 30 generated tokens fit ``length`` tokens.

    Raises:
        ValueError: a ``length`` that cannot hold the in-context example, the task and its answer.
    """
    streams = Streams(seed)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    example = _icl_example(streams, count)

    def generate(s: Streams, n: int):
        text, names, chain = _task_text(s, n, is_icl=False)
        # RULER inserts the example before the task template (the base model template is empty).
        shot = _randomize_icl(s, example) + "\n"
        return shot + text, (names, chain, len(shot))

    limit, guess, samples = length - TOKENS_TO_GENERATE, None, []
    for index in range(num_samples):
        try:
            n, text, (names, chain, start), tokens = size_sample(
                streams, generate, count, limit, smallest=NUM_HOPS + 1, guess=guess
            )
        except ValueError as err:
            raise ValueError(
                f"length={length} is too small for vt (its {ICL_LENGTH}-token example, the task and "
                f"{TOKENS_TO_GENERATE} answer tokens): {err}"
            ) from None
        guess = n
        evidence = []
        for statement in chain:  # each assignment of the queried chain, after the example
            start = text.index(statement.strip(), start)
            evidence.append((start, start + len(statement.strip())))
        prompt, prefix = split_answer_prefix(text, ANSWER_PREFIX)
        samples.append(
            RulerSample(
                task="vt",
                length=length,
                index=index,
                prompt=prompt,
                answer_prefix=prefix,
                outputs=list(names),
                max_new_tokens=TOKENS_TO_GENERATE,
                n_prompt_tokens=tokens,
                num_haystack=n,
                evidence=evidence,
                metadata={"seed": seed, "num_chains": NUM_CHAINS, "num_hops": NUM_HOPS},
            )
        )
    logger.info("generated %d vt samples at length %d", len(samples), length)
    return samples
