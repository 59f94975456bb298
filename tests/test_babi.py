"""bAbI qa1-qa5 generator and loaders: correctness by replay, statistics against the real data."""

from __future__ import annotations

import collections
import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

from sinkwindow.eval.generators.babi import (
    ACTORS,
    BABI_TASKS,
    WINDOW,
    BabiSample,
    babi_sample,
    extract_facts,
    generate_babi,
    generate_babi_stories,
    load_babi_file,
    load_babilong_json,
    parse_babi_stories,
    story_to_samples,
)

FILES = {
    "qa1": "qa1_single-supporting-fact",
    "qa2": "qa2_two-supporting-facts",
    "qa3": "qa3_three-supporting-facts",
    "qa4": "qa4_two-arg-relations",
    "qa5": "qa5_three-arg-relations",
}


def shipped_file(name: str) -> Path:
    """A file of the bAbI data that ships with the package (``sinkwindow/eval/data/babi/``)."""
    from sinkwindow.eval.generators.babi import shipped_babi_dir

    return Path(str(shipped_babi_dir())) / name


def real_file(task: str) -> Path:
    """The public bAbI v1.2 test file of ``task``, as packaged (its ``en`` and ``en-10k`` test files
    are identical)."""
    return shipped_file(f"{FILES[task]}_test.txt")


# An independent reader: answers a question from the fact sentences alone, and checks the facts
# never contradict each other. It shares no code with the generator.
MOVE = re.compile(r"(\w+) (?:moved to|went to|journeyed to|travelled to|went back to) the (\w+)\.$")
GET = re.compile(r"(\w+) (?:got|grabbed|picked up|took) the (\w+)(?: there)?\.$")
DROP = re.compile(r"(\w+) (?:dropped|put down|left|discarded) the (\w+)(?: there)?\.$")
GIVE = re.compile(r"(\w+) (?:gave|handed|passed) the (\w+) to (\w+)\.$")
REL = re.compile(r"The (\w+) is (north|south|east|west) of the (\w+)\.$")
STEP = {"north": (0, 1), "south": (0, -1), "east": (1, 0), "west": (-1, 0)}


class Contradiction(AssertionError):
    pass


def replay(task: str, facts: list[str], question: str, strict: bool = True) -> str | None:
    """The answer the facts imply, or None when they do not determine one."""
    q = question.strip()
    if task == "qa4":
        relations = [REL.match(f).groups() for f in facts]
        pos = {relations[0][2]: (0, 0)}
        for _ in range(2):
            for x, d, y in relations:
                dx, dy = STEP[d]
                if y in pos and x not in pos:
                    pos[x] = (pos[y][0] + dx, pos[y][1] + dy)
                if x in pos and y not in pos:
                    pos[y] = (pos[x][0] - dx, pos[x][1] - dy)
        if m := re.fullmatch(r"What is (\w+) of the (\w+)\?", q):
            d, y = m.groups()
            sign = 1
        else:
            y, d = re.fullmatch(r"What is the (\w+) (\w+) of\?", q).groups()
            sign = -1
        target = (pos[y][0] + sign * STEP[d][0], pos[y][1] + sign * STEP[d][1])
        hits = [room for room, p in pos.items() if p == target]
        return hits[0] if len(hits) == 1 else None
    room, holder, place, history, gives = {}, {}, {}, {}, []
    for fact in facts:
        if m := MOVE.match(fact):
            actor, new = m.groups()
            if strict and room.get(actor) == new:
                raise Contradiction(f"{actor} moves to the room they are in: {fact}")
            room[actor] = new
            for obj, h in holder.items():
                if h == actor:
                    place[obj] = new
                    history.setdefault(obj, []).append(new)
        elif m := GET.match(fact):
            actor, obj = m.groups()
            if strict and holder.get(obj) is not None:
                raise Contradiction(f"{obj} is already held: {fact}")
            if strict and None not in (place.get(obj), room.get(actor)) and place[obj] != room[actor]:
                raise Contradiction(f"{obj} is not in {actor}'s room: {fact}")
            holder[obj] = actor
            if room.get(actor) is None and place.get(obj) is not None:
                room[actor] = place[obj]
            place[obj] = room.get(actor)
            if not history.get(obj) or history[obj][-1] != place[obj]:
                history.setdefault(obj, []).append(place[obj])
        elif m := DROP.match(fact):
            actor, obj = m.groups()
            if strict and holder.get(obj) not in (None, actor):
                raise Contradiction(f"{actor} drops what someone else holds: {fact}")
            holder[obj] = None
            place[obj] = room.get(actor)
        elif m := GIVE.match(fact):
            giver, obj, receiver = m.groups()
            if strict and holder.get(obj) not in (None, giver):
                raise Contradiction(f"{giver} gives what someone else holds: {fact}")
            if strict and None not in (room.get(giver), room.get(receiver)) and room[giver] != room[receiver]:
                raise Contradiction(f"{giver} and {receiver} are in different rooms: {fact}")
            holder[obj] = receiver
            gives.append((giver, obj, receiver))
            if room.get(giver) is not None:
                room.setdefault(receiver, room[giver])
        else:
            raise AssertionError(f"fact outside the bAbI grammar: {fact!r}")
    if task == "qa1":
        return room.get(re.fullmatch(r"Where is (\w+)\?", q).group(1))
    if task == "qa2":
        obj = re.fullmatch(r"Where is the (\w+)\?", q).group(1)
        return room.get(holder[obj]) if holder.get(obj) else place.get(obj)
    if task == "qa3":
        obj, target = re.fullmatch(r"Where was the (\w+) before the (\w+)\?", q).groups()
        path = history.get(obj, [])
        last = max((i for i, r in enumerate(path) if r == target), default=0)
        return path[last - 1] if last else None
    forms = [
        (r"What did (\w+) give to (\w+)\?", lambda g, m: (g[0], g[2]) == m, 1),
        (r"Who gave the (\w+)\?", lambda g, m: g[1] == m[0], 0),
        (r"Who gave the (\w+) to (\w+)\?", lambda g, m: (g[1], g[2]) == m, 0),
        (r"Who received the (\w+)\?", lambda g, m: g[1] == m[0], 2),
        (r"Who did (\w+) give the (\w+) to\?", lambda g, m: (g[0], g[1]) == m, 2),
    ]
    for pattern, matches, slot in forms:
        if m := re.fullmatch(pattern, q):
            found = [g for g in gives if matches(g, m.groups())]
            return found[-1][slot] if found else None
    raise AssertionError(f"unknown question form {question!r}")


def question_form(question: str) -> str:
    question = re.sub(r"\b(John|Mary|Sandra|Daniel|Bill|Fred|Jeff)\b", "A", question)
    question = re.sub(r"\b(apple|football|milk)\b", "O", question)
    return re.sub(r"\b(bathroom|bedroom|garden|hallway|kitchen|office)\b", "L", question)


def fact_kind(fact: str) -> str:
    for kind, pattern in (("move", MOVE), ("get", GET), ("drop", DROP), ("give", GIVE), ("rel", REL)):
        if pattern.match(fact):
            return kind
    raise AssertionError(fact)


def story_stats(task: str, stories) -> dict:
    kinds, verbs, forms, there = collections.Counter(), collections.Counter(), collections.Counter(), {}
    before, gaps, lags = [], collections.Counter(), collections.Counter()
    n_support = collections.Counter()
    for story in stories:
        n_facts = gap = 0
        for i, line in enumerate(story):
            if line.is_question:
                forms[question_form(line.text)] += 1
                before.append(n_facts)
                gaps[gap] += 1
                lags[i - max(line.support)] += 1
                n_support[len(line.support)] += 1
                gap = 0
            else:
                kind = fact_kind(line.text)
                kinds[kind] += 1
                if kind != "rel":
                    verbs[(kind, re.sub(r"^\w+ | the .*$", "", line.text))] += 1
                if kind in ("get", "drop"):
                    there.setdefault(kind, []).append(line.text.endswith(" there."))
                n_facts += 1
                gap += 1
    n_q, n_f = sum(forms.values()), sum(kinds.values())
    return {
        "kinds": {k: v / n_f for k, v in kinds.items()},
        "verbs": verbs,
        "forms": {k: v / n_q for k, v in forms.items()},
        "there": {k: sum(v) / len(v) for k, v in there.items()},
        "before": before,
        "gaps": gaps,
        "lags": lags,
        "n_support": n_support,
    }


@pytest.fixture(scope="module")
def generated():
    return {task: generate_babi_stories(task, 200, seed=123) for task in BABI_TASKS}


# Generator: determinism and correctness


def test_deterministic_and_prefix_stable():
    for task in BABI_TASKS:
        a = generate_babi(task, 12, seed=5)
        assert a == generate_babi(task, 12, seed=5)
        assert a[:5] == generate_babi(task, 5, seed=5)
        assert a[7] == babi_sample(task, 7, seed=5)
        assert [s.facts for s in a] != [s.facts for s in generate_babi(task, 12, seed=6)]


@pytest.mark.parametrize("task", BABI_TASKS)
def test_answers_correct_by_construction(task, generated):
    for story in generated[task]:
        for sample in story_to_samples(task, story):
            assert replay(task, sample.facts, sample.question) == sample.answer, sample
            # Supporting facts are real facts of the story and the newest is the window's.
            assert sample.support and all(0 <= s < len(sample.facts) for s in sample.support)


@pytest.mark.parametrize("task", BABI_TASKS)
def test_replay_agrees_with_the_real_data(task):
    samples = load_babi_file(real_file(task))
    agree = sum(replay(task, s.facts, s.question, strict=False) == s.answer for s in samples)
    # qa5: 2 of 1,000 real questions ask about an older give than the newest one that matches.
    assert agree >= len(samples) - 2


def test_samples_hold_every_fact_before_the_question():
    story = generate_babi_stories("qa2", 1, seed=9)[0]
    samples = story_to_samples("qa2", story)
    assert len(samples) == 5
    facts = [line.text for line in story if not line.is_question]
    for sample in samples:
        assert sample.facts == facts[: len(sample.facts)]
    assert [len(s.facts) for s in samples] == sorted(len(s.facts) for s in samples)


# Generator: statistics against the public v1.2 test files


@pytest.mark.parametrize("task", BABI_TASKS)
def test_vocabulary_is_a_subset_of_the_real_data(task, generated):
    real = parse_babi_stories(real_file(task).read_text())
    words = lambda stories: {w for s in stories for line in s for w in re.findall(r"\w+", line.text)}  # noqa: E731
    answers = lambda stories: {line.answer for s in stories for line in s if line.is_question}  # noqa: E731
    assert words(generated[task]) <= words(real)
    assert answers(generated[task]) <= answers(real)
    if task != "qa4":
        actors = {line.text.split(" ")[0] for s in generated[task] for line in s if not line.is_question}
        assert actors == set(ACTORS[task])


@pytest.mark.parametrize("task", BABI_TASKS)
def test_statistics_close_to_the_real_data(task, generated):
    real = story_stats(task, parse_babi_stories(real_file(task).read_text()))
    gen = story_stats(task, generated[task])
    # Same question forms, with shares within 5 points.
    assert set(gen["forms"]) == set(real["forms"])
    for form, share in real["forms"].items():
        assert gen["forms"][form] == pytest.approx(share, abs=0.05), form
    # Same fact kinds and verbs, kind shares within 5 points, verbs about uniform within a kind.
    assert set(gen["kinds"]) == set(real["kinds"])
    for kind, share in real["kinds"].items():
        assert gen["kinds"][kind] == pytest.approx(share, abs=0.05), kind
    assert set(gen["verbs"]) == set(real["verbs"])
    for kind, share in real["there"].items():
        assert gen["there"][kind] == pytest.approx(share, abs=0.07), kind
    # Story shape: same supporting-fact counts; facts come in pairs; facts-before-question range.
    assert set(gen["n_support"]) == set(real["n_support"])
    if task != "qa4":
        assert all(gap % 2 == 0 for gap in gen["gaps"])
    assert min(gen["before"]) == min(real["before"])
    assert statistics.mean(gen["before"]) == pytest.approx(statistics.mean(real["before"]), rel=0.15)
    assert 0.4 * max(real["before"]) <= max(gen["before"]) <= 1.5 * max(real["before"])
    # The window rule: the newest supporting fact is 1, 2, 4, 5 or 7 lines above its question.
    assert set(gen["lags"]) <= set(real["lags"]) <= {1, 2, 3, 4, 5, 6, 7}
    assert max(gen["lags"]) <= WINDOW
    # A question after four or more facts is always about the last pair (lag 1 or 2).
    for stories in (generated[task],):
        for story in stories:
            gap = 0
            for i, line in enumerate(story):
                if line.is_question:
                    assert gap <= 2 or i - max(line.support) <= 2
                    gap = 0
                else:
                    gap += 1


def test_qa4_phrasing_matches_the_data():
    stories = generate_babi_stories("qa4", 1500, seed=4)
    middle_is_reference = []
    for story in stories:
        a, b, question = story
        rooms_a, rooms_b = REL.match(a.text).groups()[::2], REL.match(b.text).groups()[::2]
        (middle,) = set(rooms_a) & set(rooms_b)
        middle_is_reference += [rooms_a[1] == middle, rooms_b[1] == middle]
        assert not question.text.endswith(" ")
    # The data names the middle room as the reference ("of the B") in 64.5% of facts.
    assert sum(middle_is_reference) / len(middle_is_reference) == pytest.approx(0.645, abs=0.03)


# Loaders


@pytest.mark.parametrize("task", BABI_TASKS)
def test_loader_reads_real_files(task):
    samples = load_babi_file(real_file(task))
    assert len(samples) == 1000
    assert all(s.task == task and s.answer for s in samples)
    if task != "qa4":
        assert all(s.question.endswith("? ") for s in samples)
    story = parse_babi_stories(real_file(task).read_text())[0]
    first = next(i for i, line in enumerate(story) if line.is_question)
    assert samples[0].facts == [line.text for line in story[:first]]
    assert samples[0].support == story[first].support  # before any question, line = fact index


def test_loader_max_n_facts_counts_the_question_row():
    path = real_file("qa3")
    all_samples = load_babi_file(path)
    kept = load_babi_file(path, max_n_facts=87)
    assert kept == [s for s in all_samples if len(s.facts) <= 86]
    assert 0 < len(kept) < len(all_samples)


def test_rebuilds_babilong_0k_set_from_real_files():
    indices = json.loads(shipped_file("test_100_idxs.json").read_text())
    for task in BABI_TASKS:
        samples = load_babi_file(real_file(task))
        chosen = [samples[i] for i in indices[task]]
        assert len(chosen) == 100
        assert sum(replay(task, s.facts, s.question, strict=False) == s.answer for s in chosen) >= 98
    qa1 = load_babi_file(real_file("qa1"))
    first = qa1[indices["qa1"][0]]
    # RMT-team/babilong 0k qa1[0], as published.
    assert first.input == (
        "John travelled to the hallway. Mary journeyed to the bathroom. "
        "Daniel went back to the bathroom. John moved to the bedroom."
    )
    assert first.question == "Where is Mary? "
    assert first.answer == "bathroom"


def test_babilong_json_round_trip(tmp_path):
    samples = load_babi_file(real_file("qa2"))[:30]
    records = [{"input": s.input, "question": s.question, "target": s.answer} for s in samples]
    (tmp_path / "qa2").mkdir()
    as_list = tmp_path / "qa2" / "0k.json"
    as_list.write_text(json.dumps(records))
    as_lines = tmp_path / "qa2_0k.jsonl"
    as_lines.write_text("\n".join(json.dumps(r) for r in records))
    as_dict = tmp_path / "0k_all.json"
    as_dict.write_text(json.dumps({"qa2": records}))
    for loaded in (
        load_babilong_json(as_list),
        load_babilong_json(as_lines),
        load_babilong_json(as_dict, "qa2"),
    ):
        assert [(s.facts, s.question, s.answer) for s in loaded] == [
            (s.facts, s.question, s.answer) for s in samples
        ]
        assert all(s.context == r["input"] for s, r in zip(loaded, records))
    with pytest.raises(ValueError):
        load_babilong_json(as_dict)


def test_extract_facts_from_noisy_text():
    text = (
        "It was late. Mary picked up the milk there. The night was dark and the house was still.\n"
        "Fred handed the milk to Jeff. The kitchen is north of the garden. Nobody went to the opera."
    )
    assert extract_facts(text) == [
        "Mary picked up the milk there.",
        "Fred handed the milk to Jeff.",
        "The kitchen is north of the garden.",
    ]


def test_unknown_task_rejected():
    with pytest.raises(ValueError):
        generate_babi("qa6", 1)
    assert BabiSample("qa1", ["a.", "b."], "q? ", "x").input == "a. b."


# The shipped en-10k test files in BABILong's order


def test_babilong_questions_order_and_index():
    from sinkwindow.eval.generators.babi import (
        BABI_TEST_FILES,
        babilong_questions,
        babilong_subset,
        shipped_babi_dir,
    )

    subset = babilong_subset()
    for task in BABI_TASKS:
        ordered = babilong_questions(task)
        in_file = load_babi_file(Path(str(shipped_babi_dir())) / BABI_TEST_FILES[task])
        assert [s.index for s in ordered[:100]] == subset[task]
        assert [s.index for s in ordered[100:]] == [i for i in range(1000) if i not in set(subset[task])]
        assert all(s == in_file[s.index] for s in ordered)
        assert [s.index for s in in_file] == list(range(1000))


def test_babilong_questions_from_a_folder(tmp_path):
    from sinkwindow.eval.generators.babi import (
        BABI_TEST_FILES,
        babilong_questions,
        find_babi_test_file,
        shipped_babi_dir,
    )

    source = Path(str(shipped_babi_dir())) / BABI_TEST_FILES["qa2"]
    (tmp_path / BABI_TEST_FILES["qa2"]).write_bytes(source.read_bytes())
    assert find_babi_test_file(tmp_path, "qa2") == tmp_path / BABI_TEST_FILES["qa2"]
    assert find_babi_test_file(tmp_path, "qa1") is None
    assert babilong_questions("qa2", tmp_path) == babilong_questions("qa2")
    # A folder's own index file wins over the shipped one.
    (tmp_path / "test_100_idxs.json").write_text(json.dumps({"qa2": [5, 3]}))
    assert [s.index for s in babilong_questions("qa2", tmp_path)[:3]] == [5, 3, 0]
    (tmp_path / "test_100_idxs.json").write_text(json.dumps({"qa2": [5, 1000]}))
    with pytest.raises(ValueError, match="outside"):
        babilong_questions("qa2", tmp_path)
    with pytest.raises(FileNotFoundError, match="qa1"):
        babilong_questions("qa1", tmp_path)


def test_altered_package_data_is_refused(tmp_path, monkeypatch):
    from sinkwindow.eval.generators import babi

    copy = tmp_path / "babi"
    shutil.copytree(Path(str(babi.shipped_babi_dir())), copy)
    text = (copy / babi.BABI_TEST_FILES["qa1"]).read_text()
    (copy / babi.BABI_TEST_FILES["qa1"]).write_text(text.replace("hallway", "garden", 1))
    monkeypatch.setattr(babi, "shipped_babi_dir", lambda: copy)
    babi._shipped_text.cache_clear()
    try:
        with pytest.raises(ValueError, match="sha256"):
            babi.babilong_questions("qa1")
        assert len(babi.babilong_questions("qa2")) == 1000  # the untouched files still load
    finally:
        babi._shipped_text.cache_clear()
