"""RULER's question answering tasks ``qa_1`` (SQuAD) and ``qa_2`` (HotpotQA), from user-given data.

A port of NVIDIA/RULER ``scripts/data/synthetic/qa.py``. Nothing is downloaded: the run points at
a folder holding RULER's two files under RULER's names (``--ruler-qa-data DIR``):

* ``squad.json``: SQuAD 2.0 dev (``data[].paragraphs[].context/qas``); answerable questions only,
  each with its paragraph and, as distractors first, the other paragraphs of its article.
* ``hotpotqa.json``: HotpotQA dev, distractor setting (``[{question, answer, context: [[title,
  [sentences]]]}]``); each question with its ten paragraphs as ``"title\\n" + "".join(sentences)``.

Sample ``i`` asks question ``i``. Its documents: the gold ones, then (SQuAD) its article's other
paragraphs, then random other documents, drawn as RULER does (``random.sample`` of the rest), the
list shuffled by a fresh ``Random(seed)`` and written ``"Document {i}:\\n{document}"`` joined by
blank lines. Scored by ``string_match_part`` (any reference answer found).

Kept from RULER: the template, answer prefix, 32 generated tokens, document pool (sorted unique
documents), the draw order. Deviation (also in :data:`DEVIATIONS`): the sizing (per sample, the
largest document count that fits, found by replaying its draws; RULER binary-searches one count on
question 0's draws, consuming random state, and shrinks in steps of 10 documents).
"""

from __future__ import annotations

import functools
import json
import logging
import random
from pathlib import Path
from typing import Any

from .ruler_common import RulerSample, Streams, size_sample, split_answer_prefix

__all__ = [
    "TEMPLATE",
    "ANSWER_PREFIX",
    "TOKENS_TO_GENERATE",
    "DATA_FILES",
    "DEVIATIONS",
    "read_qa",
    "generate_qa",
]

logger = logging.getLogger(__name__)

# RULER scripts/data/synthetic/constants.py, TASKS['qa'].
TOKENS_TO_GENERATE = 32
TEMPLATE = (
    "Answer the question based on the given documents. Only give me the answer and do not output any "
    "other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the "
    "given documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}"
)
ANSWER_PREFIX = " Answer:"
DOCUMENT_PROMPT = "Document {i}:\n{document}"
# task -> (RULER's dataset name, its file in the data folder)
DATA_FILES = {"qa_1": ("squad", "squad.json"), "qa_2": ("hotpotqa", "hotpotqa.json")}

DEVIATIONS: tuple[str, ...] = (
    "sizing: per-sample largest document count that fits, found by replaying the sample's draws; "
    "RULER binary-searches one count on question 0's draws (consuming random state), 10-document steps",
)


def _read_squad(data: Any) -> tuple[list[dict], list[str]]:
    docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
    index = {c: i for i, c in enumerate(docs)}
    qas = []
    for d in data["data"]:
        article = [index[p["context"]] for p in d["paragraphs"]]
        for p in d["paragraphs"]:
            gold = index[p["context"]]
            for qa in p["qas"]:
                if not qa.get("is_impossible", False):
                    qas.append({
                        "query": qa["question"],
                        "outputs": [a["text"] for a in qa["answers"]],
                        "context": [gold],
                        "more_context": [i for i in article if i != gold],
                        "evidence": [gold],
                    })  # fmt: skip
    return qas, docs


def _read_hotpotqa(data: Any) -> tuple[list[dict], list[str]]:
    docs = sorted({f"{t}\n{''.join(p)}" for d in data for t, p in d["context"]})
    index = {c: i for i, c in enumerate(docs)}
    qas = []
    for d in data:
        context = [index[f"{t}\n{''.join(p)}"] for t, p in d["context"]]
        support = {t for t, _ in d.get("supporting_facts", [])}
        qas.append({
            "query": d["question"],
            "outputs": [d["answer"]],
            "context": context,
            # The paragraphs the supporting facts come from (all ten when the file has none).
            "evidence": [i for i, (t, _) in zip(context, d["context"]) if t in support] or context,
        })  # fmt: skip
    return qas, docs


@functools.cache
def read_qa(task: str, data_dir: str) -> tuple[list[dict], list[str]]:
    """``(questions, documents)`` of ``qa_1`` / ``qa_2`` from ``data_dir``, as RULER reads them.

    Raises:
        ValueError: the file is missing or not in the expected format, in one line.
    """
    dataset, name = DATA_FILES[task]
    path = Path(data_dir) / name
    if not path.is_file():
        raise ValueError(f"{task} needs {path}: put RULER's {name} ({dataset} dev) in --ruler-qa-data")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return _read_squad(data) if dataset == "squad" else _read_hotpotqa(data)
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{path} is not {dataset} dev JSON as RULER reads it ({type(err).__name__}: {err})"
        ) from None


def _generate(streams: Streams, num_docs: int, *, qa: dict, docs: list[str], seed: int) -> tuple[str, list]:
    """RULER ``generate_input_output(index, num_docs)``: the text and the evidence documents' spans."""
    gold, more = qa["context"], qa.get("more_context", [])
    if num_docs < len(docs):
        if num_docs - len(gold) > len(more):
            taken = set(gold + more)
            rest = [i for i in range(len(docs)) if i not in taken]
            chosen = gold + more + streams.py.sample(rest, max(0, num_docs - len(gold) - len(more)))
        else:
            chosen = gold + streams.py.sample(more, num_docs - len(gold))
    else:
        chosen = (list(range(len(docs))) * ((num_docs + len(docs) - 1) // len(docs)))[:num_docs]
    random.Random(seed).shuffle(chosen)  # RULER shuffles the texts; the same permutation
    head = TEMPLATE[: TEMPLATE.index("{context}")]
    pieces, spans, at = [], [], len(head)
    for i, doc in enumerate(chosen):
        piece = DOCUMENT_PROMPT.format(i=i + 1, document=docs[doc])
        if doc in qa["evidence"]:
            spans.append((at, at + len(piece)))
        pieces.append(piece)
        at += len(piece) + 2
    text = (TEMPLATE + ANSWER_PREFIX).format(context="\n\n".join(pieces), query=qa["query"])
    return text, spans


def generate_qa(
    task: str, data_dir: str | None, tokenizer: Any, length: int, num_samples: int, seed: int = 42
) -> list[RulerSample]:
    """Generate ``qa_1`` / ``qa_2`` samples (question ``i`` for sample ``i``) fitting ``length`` tokens.

    Raises:
        ValueError: no data folder, a bad file, too few questions, or a length too small.
    """
    if data_dir is None:
        raise ValueError(
            f"{task} needs RULER's QA data: give --ruler-qa-data DIR (with {DATA_FILES[task][1]})"
        )
    qas, docs = read_qa(task, str(data_dir))
    if num_samples > len(qas):
        raise ValueError(f"{task}: {num_samples} samples asked, the data holds {len(qas)} questions")
    streams = Streams(seed)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    limit, guess, samples = length - TOKENS_TO_GENERATE, None, []
    for index in range(num_samples):
        qa = qas[index]

        def generate(s: Streams, n: int, qa=qa):
            return _generate(s, n, qa=qa, docs=docs, seed=seed)

        try:
            n, text, spans, tokens = size_sample(
                streams, generate, count, limit, smallest=len(qa["context"]), guess=guess, probe=4
            )
        except ValueError as err:
            raise ValueError(f"length={length} is too small for {task} question {index}: {err}") from None
        guess = n
        prompt, prefix = split_answer_prefix(text, ANSWER_PREFIX)
        samples.append(
            RulerSample(
                task=task,
                length=length,
                index=index,
                prompt=prompt,
                answer_prefix=prefix,
                outputs=list(qa["outputs"]),
                max_new_tokens=TOKENS_TO_GENERATE,
                n_prompt_tokens=tokens,
                num_haystack=n,
                evidence=spans,
                metadata={"seed": seed, "dataset": DATA_FILES[task][0]},
            )
        )
    logger.info("generated %d %s samples at length %d", len(samples), task, length)
    return samples
