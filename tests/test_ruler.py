"""RULER's tasks beyond S-NIAH-1/2/3 against RULER's own definitions: templates, needles, chains,
word frequencies, the random stream, token budgets, scoring, the ``ruler`` group and the report."""

from __future__ import annotations

import json
import random
import re
import string
from collections import Counter

import numpy as np
import pytest

pytest.importorskip("wonderwords")

from sinkwindow.eval.generators import common_words, freq_words, niah_multi, ruler_qa, variable_tracking  # noqa: E402
from sinkwindow.eval.generators.niah import (
    DEPTHS,
    random_value,
    ruler_string_match_all,
    ruler_string_match_part,
)
from sinkwindow.eval.runner import EvalConfig  # noqa: E402
from sinkwindow.eval.tasks import GROUPS, RULER_TASKS, TASKS  # noqa: E402
from test_niah import load_smollm2_tokenizer, make_byte_bpe  # noqa: E402  (one copy, shared session cache)

# RULER scripts/data/synthetic/constants.py, verbatim.
RULER_VT = (
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above.",
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assigned the value {query}, they are: ",
    30,
)
RULER_CWE = (
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
    "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
    " Answer: The top 10 words that appear most often in the list are:",
    120,
)
RULER_FWE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most "
    "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the "
    "dots '....'. What are the three most frequently appeared words in the above coded text?",
    " Answer: According to the coded text above, the three most frequently appeared words are:",
    50,
)
NEEDLE_RE = re.compile(r"One of the special magic (numbers|uuids) for (\S+) is: (\S+)\.")


@pytest.fixture(scope="module", params=["smollm2", "byte-bpe"])
def tokenizer(request, tmp_path_factory):
    if request.param == "smollm2":
        return load_smollm2_tokenizer(tmp_path_factory.getbasetemp())
    return make_byte_bpe()


def n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.parametrize(
    ("module", "spec"), [(variable_tracking, RULER_VT), (common_words, RULER_CWE), (freq_words, RULER_FWE)]
)
def test_templates_answer_prefixes_and_generation_budgets_are_rulers(module, spec):
    assert spec == (module.TEMPLATE, module.ANSWER_PREFIX, module.TOKENS_TO_GENERATE)


# Multi-key, multi-value, multi-query NIAH


def _ruler_niah(config, rng: random.Random, n: int, seed: int, essay) -> tuple[str, list[str]]:
    """RULER ``niah.py::generate_input_output(n)``, transcribed step by step."""
    num_k = max(config.num_needle_k, config.num_needle_q)
    needle = "One of the special magic {type_needle_v} for {key} is: {value}."
    keys, values, needles = [], [], []
    for _ in range(num_k):
        keys.append(random_value(rng, config.type_needle_k))
        value = []
        for _ in range(config.num_needle_v):
            value.append(random_value(rng, config.type_needle_v))
            needles.append(needle.format(type_needle_v=config.type_needle_v, key=keys[-1], value=value[-1]))
        values.append(value)
    random.Random(seed).shuffle(needles)
    if config.type_haystack == "essay":
        sents = essay(n)
        pos = (
            [0]
            + sorted([int(len(sents) * (d / 100)) for d in rng.sample(DEPTHS, len(needles))])
            + [len(sents)]
        )
        parts = []
        for i in range(1, len(pos)):
            parts.append(" ".join(sents[pos[i - 1] : pos[i]]))
            if i - 1 < len(needles):
                parts.append(needles[i - 1])
        context = " ".join(parts)
    else:
        sentences = [
            needle.format(
                type_needle_v=config.type_needle_v,
                key=random_value(rng, config.type_needle_k),
                value=random_value(rng, config.type_needle_v),
            )
            for _ in range(n)
        ]
        for index, element in zip(sorted(rng.sample(range(n), len(needles)), reverse=True), needles):
            sentences.insert(index, element)
        context = "\n".join(sentences)
    indices = rng.sample(range(num_k), config.num_needle_q)
    queries = [keys[i] for i in indices]
    answers = [a for i in indices for a in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template = (
        "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
        "{type_needle_v} for {query} mentioned in the provided text? The special magic {type_needle_v} for "
        "{query} mentioned in the provided text are"
    )
    type_needle_v = config.type_needle_v
    if config.num_needle_q * config.num_needle_v == 1:
        template = template.replace("Some", "A").replace("are all", "is").replace("are", "is")
        template, type_needle_v = template.replace("answers", "answer"), type_needle_v[:-1]
    return template.format(type_needle_v=type_needle_v, context=context, query=query), answers


@pytest.mark.parametrize("task", sorted(niah_multi.TASKS))
def test_multi_needle_samples_are_rulers_draws_at_their_sizes(task, tokenizer):
    samples = niah_multi.generate_niah_multi(task, tokenizer, 1024, 3, seed=7)
    config = niah_multi.TASKS[task]
    rng, essay = random.Random(7), niah_multi._Essay()
    for s in samples:
        # The stream advances by exactly one RULER call per kept sample: no draws went to the search.
        text, answers = _ruler_niah(config, rng, s.num_haystack, 7, essay)
        assert s.text == text and s.outputs == answers
        assert s.n_prompt_tokens == n_tokens(tokenizer, s.text) <= 1024 - 128
    assert niah_multi.generate_niah_multi(task, tokenizer, 1024, 3, seed=7) == samples


@pytest.mark.parametrize("task", sorted(niah_multi.TASKS))
def test_multi_needle_structure_and_evidence(task, tokenizer):
    config = niah_multi.TASKS[task]
    s = niah_multi.generate_niah_multi(task, tokenizer, 2048, 1, seed=3)[0]
    needles = NEEDLE_RE.findall(s.prompt)
    num_k = max(config.num_needle_k, config.num_needle_q)
    if config.type_haystack == "essay":
        assert len(needles) == num_k * config.num_needle_v
        assert len({k for _, k, _ in needles}) == num_k
    else:  # a haystack of needles: every context line is one, the real one among them
        context = s.prompt.split("\n")[1:-1]
        assert len(context) == len(needles) == s.num_haystack + 1
    assert {t for t, _, _ in needles} == {config.type_needle_v}  # the plural type, as RULER
    assert len(s.outputs) == config.num_needle_q * config.num_needle_v
    plural = config.num_needle_q * config.num_needle_v > 1
    assert s.prompt.startswith("Some special magic numbers are" if plural else "A special magic")
    assert s.answer_prefix.startswith(" The special magic") and s.answer_prefix.endswith(
        " are" if plural else " is"
    )
    if config.num_needle_q > 1:
        assert re.search(r"for \S+, \S+, \S+, and \S+ mentioned", s.answer_prefix)
    # Evidence: exactly the needles whose key is queried, and they hold every answer.
    spans = [s.text[a:b] for a, b in s.evidence]
    assert len(spans) == len(s.outputs) and all(NEEDLE_RE.fullmatch(x) for x in spans)
    assert sorted(NEEDLE_RE.fullmatch(x).group(3) for x in spans) == sorted(s.outputs)
    assert all(NEEDLE_RE.fullmatch(x).group(2) in s.answer_prefix for x in spans)
    # The haystack is as large as fits: one unit more overflows.
    assert s.n_prompt_tokens <= 2048 - 128
    assert n_tokens(tokenizer, s.text) == s.n_prompt_tokens


@pytest.mark.parametrize("task", ["niah_multikey_2", "vt", "cwe", "fwe"])
def test_sample_i_is_the_same_however_many_samples_are_drawn(task, tokenizer):
    # The fingerprint's promise (a resumed run with more samples keeps the rows it has).
    config = EvalConfig(model="m", tasks=[task], lengths=[2048], samples=3)
    three = TASKS[task].build_samples(tokenizer, 2048, config)
    config.samples = 2
    assert TASKS[task].build_samples(tokenizer, 2048, config) == three[:2]


def test_a_length_too_small_for_the_template_is_refused_in_one_line(tokenizer):
    with pytest.raises(ValueError, match="length=200 is too small for task niah_multivalue"):
        niah_multi.generate_niah_multi("niah_multivalue", tokenizer, 200, 1)


# Variable tracking


def test_vt_chain_icl_example_and_evidence(tokenizer):
    s = variable_tracking.generate_vt(tokenizer, 1024, 2, seed=11)[1]
    names = s.outputs
    assert len(names) == 5 and len(set(names)) == 5 and all(re.fullmatch(r"[A-Z]{5}", n) for n in names)
    value = re.search(r"assigned the value (\d{5}), they are: $", s.answer_prefix).group(1)
    # The in-context example comes first: three-letter names, its own value, its answer after "they are:".
    example, task = s.prompt.split("\n\nMemorize and track", 1)
    assert example.startswith("Memorize and track the chain(s)") and "12345" not in example
    shot_names = example.rsplit("they are: ", 1)[1].split()
    assert len(shot_names) == 5 and all(re.fullmatch(r"[A-Z]{3}", n) for n in shot_names)
    # The task: the chain's statements in order, each on its own line among the noise lines.
    lines = task.split("\n")
    chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(4)]
    at = [lines.index(c) for c in chain]
    assert at == sorted(at)
    assert sum(line == variable_tracking.NOISE_HAYSTACK for line in lines) == s.num_haystack
    assert [s.text[a:b] for a, b in s.evidence] == [c.strip() for c in chain]
    assert s.evidence[0][0] > len(example)
    assert s.n_prompt_tokens == n_tokens(tokenizer, s.text) <= 1024 - 30


def _ruler_vt(rng: random.Random, nprng, n: int, is_icl: bool) -> tuple[str, list[str]]:
    """RULER ``variable_tracking.py::generate_input_output(n, 1, 4, is_icl)``, transcribed."""
    k = 3 if is_icl else 5
    names = ["".join(rng.choices(string.ascii_uppercase, k=k)).upper() for _ in range(5)]
    while len(set(names)) < 5:
        names.append("".join(rng.choices(string.ascii_uppercase, k=k)).upper())
    chain = [f"VAR {names[0]} = 12345" if is_icl else f"VAR {names[0]} = {nprng.randint(10000, 99999)}"]
    chain += [f"VAR {names[j + 1]} = VAR {names[j]} " for j in range(4)]
    sentences = [variable_tracking.NOISE_HAYSTACK] * n
    for i, p in enumerate(sorted(rng.sample(range(len(sentences)), 5))):
        sentences.insert(p + i, chain[i])
    context = "\n".join(sentences).replace(". \n", ".\n")
    value = chain[0].split("=")[-1].strip()
    return (RULER_VT[0] + RULER_VT[1]).format(context=context, query=value, num_v=5), names[:5]


def test_vt_samples_are_rulers_draws_example_first(tokenizer):
    samples = variable_tracking.generate_vt(tokenizer, 1024, 2, seed=5)
    rng, nprng = random.Random(5), np.random.RandomState(5)
    # The example: the largest noise haystack within 500 tokens, as RULER's first call sizes it.
    icl = None
    for n in range(5, 60):
        probe_rng, probe_np = random.Random(), np.random.RandomState()
        probe_rng.setstate(rng.getstate())
        probe_np.set_state(nprng.get_state())
        text, names = _ruler_vt(probe_rng, probe_np, n, True)
        if n_tokens(tokenizer, text) > 500:
            break
        icl = n
    text, names = _ruler_vt(rng, nprng, icl, True)
    example = text + " " + " ".join(names) + "\n"
    for s in samples:
        text, names = _ruler_vt(rng, nprng, s.num_haystack, False)
        shot = example
        for item in shot.strip().split()[-5:]:
            shot = shot.replace(item, "".join(rng.choices(string.ascii_uppercase, k=len(item))).upper())
        shot = shot.replace("12345", str(nprng.randint(10000, 99999)))
        assert s.text == shot + "\n" + text and s.outputs == names


def test_vt_below_its_example_is_refused_in_one_line(tokenizer):
    with pytest.raises(ValueError, match="length=512 is too small for vt"):
        variable_tracking.generate_vt(tokenizer, 512, 1)


# Common words and frequent words


def _counts(numbered: str) -> Counter:
    return Counter(re.findall(r"\d+\. (\S+)", numbered))


@pytest.mark.parametrize(("length", "repeats", "shot"), [(2048, (6, 1), (3, 1)), (8192, (30, 3), (10, 3))])
def test_cwe_frequency_structure(length, repeats, shot, tokenizer):
    s = common_words.generate_cwe(tokenizer, length, 1, seed=2)[0]
    blocks = s.prompt.split("Below is a numbered list of words.")[1:]
    assert len(blocks) == 2  # RULER's one in-context example, then the task
    shot_counts = _counts(blocks[0].split("\n")[1])
    assert sorted(set(shot_counts.values()), reverse=True) == list(shot)
    assert sum(c == shot[0] for c in shot_counts.values()) == 10
    answered = blocks[0].split("appear most often in the list are: ")[1].strip()  # the example's answer
    assert _counts(answered) == Counter({w: 1 for w, c in shot_counts.items() if c == shot[0]})
    counts = _counts(blocks[1].split("\n")[1])
    common = [w for w, c in counts.items() if c == repeats[0]]
    assert sorted(common) == sorted(s.outputs) and len(s.outputs) == 10
    assert set(counts.values()) == set(repeats) and len(counts) == s.num_haystack
    assert s.n_prompt_tokens == n_tokens(tokenizer, s.text) <= length - 120


def test_cwe_samples_are_rulers_draws(tokenizer):
    samples = common_words.generate_cwe(tokenizer, 2048, 2, seed=4)
    pool = sorted(set(common_words.cwe_words(4)))
    random.Random(4).shuffle(pool)
    assert tuple(pool) == common_words.cwe_words(4)  # the pool shuffled once by Random(seed)
    rng = random.Random(4)

    def example(num_words, common, uncommon):
        words = rng.sample(pool, num_words)
        listed = words[:10] * common + words[10:] * uncommon
        random.Random(4).shuffle(listed)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(listed)), words[:10]

    template = RULER_CWE[0] + RULER_CWE[1]
    for s in samples:  # below 4096: the example is get_example(20, 3, 1), the task repeats 6 and 1
        shot, shot_answer = example(20, 3, 1)
        context, answer = example(s.num_haystack, 6, 1)
        shown = (
            template.format(context=shot) + " " + " ".join(f"{i + 1}. {w}" for i, w in enumerate(shot_answer))
        )
        assert s.text == shown + "\n" + template.format(context=context) and s.outputs == answer


def test_fwe_is_rulers_zipf_draw_and_sizing(tokenizer):
    length = 1024
    samples = freq_words.generate_fwe(tokenizer, length, 2, seed=9)
    max_len, rng = length - 50, random.Random(9)
    vocab_size, step = max_len // 50, max_len // 32

    def vocab():
        v = ["".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(vocab_size)]
        while len(set(v)) < vocab_size:
            v.append("".join(rng.choices(string.ascii_lowercase, k=6)))
        v = sorted(set(v))
        random.Random(9).shuffle(v)
        v[0] = "..."
        return v

    def text(v, n):
        ws = [
            w
            for w, c in zip(v, (n * np.arange(1, len(v) + 1) ** -2.0 / (np.pi**2 / 6)).astype(int))
            for _ in range(c)
        ]
        random.Random(9).shuffle(ws)
        return (RULER_FWE[0] + RULER_FWE[1]).format(context=" ".join(ws), query="")

    v, n = vocab(), max_len // 6  # RULER's size search draws one vocabulary
    while n_tokens(tokenizer, text(v, n)) < max_len:
        n += step
    n -= step
    for s in samples:
        v, m = vocab(), n
        while n_tokens(tokenizer, text(v, m)) > max_len:
            m -= step
        assert s.text == text(v, m) and s.outputs == v[1:4] and s.num_haystack == m
        counts = Counter(s.prompt.split("coded words. ", 1)[1].split("\n")[0].split())
        top = [w for w, _ in counts.most_common(4)]
        assert top[0] == "..." and top[1:] == s.outputs


def test_fwe_zeta_is_scipys():
    scipy_special = pytest.importorskip("scipy.special")
    assert scipy_special.zeta(2.0) == freq_words.ZETA_ALPHA


# Scoring, rows, registry, report


def test_ruler_metrics_on_hand_made_cases():
    refs = ["HWTEK", "hftcj", "JIGBL", "DXCHQ"]
    assert ruler_string_match_all(" hwtek, HFTCJ and jigbl\n", refs) == 75.0  # case-insensitive, partial
    assert ruler_string_match_part(" hwtek only", refs) == 100.0  # qa's metric: any reference
    assert ruler_string_match_all("\x00\x01 dxchq", ["DXCHQ"]) == 100.0
    assert ruler_string_match_all("HWTE", ["HWTEK"]) == 0.0
    assert ruler_string_match_all("HWTEKHFTCJ", refs[:2]) == 100.0  # a substring is enough, as RULER


@pytest.mark.parametrize("task", ["niah_multivalue", "vt", "cwe"])
def test_rows_keep_the_prompt_and_the_evidence_tokens(task, tokenizer):
    t = TASKS[task]
    config = EvalConfig(model="m", tasks=[task], lengths=[2048], samples=1, niah_max_new_tokens=128)
    sample = t.build_samples(tokenizer, 2048, config)[0]
    ids, cap, finish = t.prepare(tokenizer, sample, config)
    assert cap == t.answer_tokens == sample.max_new_tokens
    row = finish(" " + ", ".join(sample.outputs[:2]))
    assert row["prompt"] == sample.text and row["metric"] == "string_match_all"
    assert row["score"] == pytest.approx(100.0 * 2 / len(sample.outputs)) and row["answer"] == sample.outputs
    assert row["n_prompt_tokens"] == ids.shape[1]
    if task == "cwe":
        assert "evidence_tokens" not in row  # aggregation: the evidence is everywhere
        return
    spans = row["evidence_tokens"]
    assert len(spans) == len(sample.evidence)
    for (a, b), (lo, hi) in zip(spans, sample.evidence):
        decoded = tokenizer.decode(ids[0, a:b])
        assert sample.text[lo:hi].split()[-1].strip(".") in decoded and 0 <= a < b <= ids.shape[1]


def test_the_ruler_group_cli_and_config_checks():
    from sinkwindow.eval.cli import _compare_tasks

    assert GROUPS["ruler"][:3] == GROUPS["niah"] and set(RULER_TASKS) < set(GROUPS["ruler"])
    assert _compare_tasks("ruler,ppl") == [*GROUPS["ruler"], "ppl"]
    # vt and cwe skip lengths they cannot hold and say so; none left is refused.
    config = EvalConfig(model="m", tasks=["vt", "fwe"], lengths=[512, 1024])
    assert TASKS["vt"].lengths(config) == [1024] and TASKS["fwe"].lengths(config) == [512, 1024]
    assert any("vt skips lengths [512]" in d for d in TASKS["vt"].deviations(config))
    with pytest.raises(ValueError, match="task cwe needs a length >= 1024"):
        EvalConfig(model="m", tasks=["cwe"], lengths=[512])
    with pytest.raises(ValueError, match="niah_depths='stratified' applies to niah_single_1"):
        EvalConfig(model="m", tasks=["niah_multikey_1"], niah_depths="stratified")
    # The sweep's cost estimate: RULER's answer budget reserved, its tokens_to_generate decoded.
    budget = TASKS["cwe"].token_budget(config, 4096, None)
    assert budget == (4096 - 120, 120)


def test_the_report_averages_ruler_categories_with_equal_task_weight():
    from sinkwindow.eval.summary import summarize
    from sinkwindow.eval.tables import markdown_report

    def rows(task, scores, method="full"):
        return [
            dict(model="m", task=task, method=method, length=1024, seed=0, index=i, score=float(v))
            for i, v in enumerate(scores)
        ]

    data = rows("cwe", [10, 30]) + rows("fwe", [100, 100, 0, 100]) + rows("vt", [40, 80])
    data += rows("niah_single_1", [100, 0]) + rows("niah_multikey_2", [100, 100, 100])
    s = summarize(data, n_boot=200)
    acc = s["accuracy"]
    assert acc["ruler_aggregation"]["full"][1024]["mean"] == pytest.approx((20 + 75) / 2)
    assert acc["ruler_multihop"]["full"][1024]["mean"] == pytest.approx(60)
    assert acc["ruler_retrieval"]["full"][1024]["mean"] == pytest.approx((50 + 100) / 2)
    md = markdown_report(s, {}, [])
    assert "## RULER by category" in md and "RULER aggregation (cwe, fwe, average)" in md
    # Without RULER-only rows the report is what it was: no categories.
    plain = summarize(rows("niah_single_1", [100, 0]), n_boot=50)
    assert not any(k.startswith("ruler_") for k in plain["accuracy"])


# Question answering on given data (qa_1 SQuAD, qa_2 HotpotQA)


def _squad(tmp_path):
    """A SQuAD 2.0-shaped file: 4 articles of 3 paragraphs, 2 answerable questions and 1 impossible each."""
    data = []
    for a in range(4):
        paragraphs = []
        for p in range(3):
            city = f"City{a}{p}"
            context = f"Article {a} paragraph {p}. The museum of {city} opened in {1900 + 10 * a + p}. " * 3
            qas = [
                {"question": f"When did the museum of {city} open?", "is_impossible": False,
                 "answers": [{"text": str(1900 + 10 * a + p)}, {"text": f"in {1900 + 10 * a + p}"}]},
                {"question": f"Who founded {city}?", "is_impossible": True, "answers": []},
                {"question": f"What is paragraph {p} of article {a} about?", "is_impossible": False,
                 "answers": [{"text": city}]},
            ]  # fmt: skip
            paragraphs.append({"context": context, "qas": qas})
        data.append({"title": f"A{a}", "paragraphs": paragraphs})
    (tmp_path / "squad.json").write_text(json.dumps({"data": data}))
    return tmp_path


def _hotpot(tmp_path):
    """A HotpotQA-shaped file: 3 questions of 4 titled paragraphs, 2 of them supporting."""
    data = []
    for q in range(3):
        context = [
            [f"Title {q}-{d}", [f"Sentence one of {q}-{d}. ", f"Fact {q * 10 + d}."]] for d in range(4)
        ]
        data.append({"question": f"Which fact joins {q}-0 and {q}-2?", "answer": f"Fact {q * 10 + 2}",
                     "context": context, "supporting_facts": [[f"Title {q}-0", 0], [f"Title {q}-2", 1]]})  # fmt: skip
    (tmp_path / "hotpotqa.json").write_text(json.dumps(data))
    return tmp_path


def test_qa_reads_rulers_files_and_draws_its_documents(tmp_path, tokenizer):
    folder = str(_squad(tmp_path))
    qas, docs = ruler_qa.read_qa("qa_1", folder)
    assert len(qas) == 4 * 3 * 2 and docs == sorted(docs) and len(docs) == 12  # impossible ones dropped
    samples = ruler_qa.generate_qa("qa_1", folder, tokenizer, 512, 3, seed=1)
    rng = random.Random(1)
    for i, s in enumerate(samples):
        qa = qas[i]
        assert s.outputs == qa["outputs"] and s.prompt.endswith(f"Question: {qa['query']}")
        assert s.answer_prefix == " Answer:" and s.n_prompt_tokens == n_tokens(tokenizer, s.text) <= 512 - 32
        # RULER: the gold paragraph, the article's others, then random others; one shuffle by Random(seed).
        gold, more = qa["context"], qa["more_context"]
        n = s.num_haystack
        assert n < len(docs)  # 512 tokens hold some of the 12 paragraphs, not all
        if n - len(gold) > len(more):
            rest = [j for j in range(len(docs)) if j not in gold + more]
            chosen = gold + more + rng.sample(rest, n - len(gold) - len(more))
        else:
            chosen = gold + rng.sample(more, n - len(gold))
        texts = [docs[j] for j in chosen]
        random.Random(1).shuffle(texts)
        context = "\n\n".join(f"Document {k + 1}:\n{d}" for k, d in enumerate(texts))
        assert s.text == (ruler_qa.TEMPLATE + ruler_qa.ANSWER_PREFIX).format(
            context=context, query=qa["query"]
        )
        assert [s.text[a:b].split("\n", 1)[1] for a, b in s.evidence] == [docs[gold[0]]]
    # string_match_part: any one reference is enough.
    task = TASKS["qa_1"]
    config = EvalConfig(model="m", tasks=["qa_1"], lengths=[512], samples=1, ruler_qa_data=folder)
    ids, cap, finish = task.prepare(tokenizer, samples[0], config)
    row = finish(f" {samples[0].outputs[-1]} and more")
    assert cap == 32 and row["score"] == 100.0 and row["metric"] == "string_match_part"
    assert finish(" no idea")["score"] == 0.0


def test_hotpotqa_evidence_is_the_supporting_paragraphs(tmp_path, tokenizer):
    folder = str(_hotpot(tmp_path))
    s = ruler_qa.generate_qa("qa_2", folder, tokenizer, 2048, 2, seed=3)[1]
    assert s.outputs == ["Fact 12"] and s.prompt.count("Document ") == s.num_haystack >= 4
    titles = [s.text[a:b].split("\n")[1] for a, b in s.evidence]
    assert set(titles) == {"Title 1-0", "Title 1-2"}  # every copy (RULER repeats a pool too small)
    assert len(titles) == s.text.count(":\nTitle 1-0\n") + s.text.count(":\nTitle 1-2\n")


def test_qa_without_data_is_refused_in_one_line_naming_the_flag(tmp_path):
    with pytest.raises(ValueError, match="give --ruler-qa-data DIR"):
        EvalConfig(model="m", tasks=["qa_2"], lengths=[2048])
    with pytest.raises(ValueError, match="qa_2 needs .*hotpotqa.json: put RULER's hotpotqa.json"):
        EvalConfig(model="m", tasks=["qa_2"], lengths=[2048], ruler_qa_data=str(_squad(tmp_path)))
