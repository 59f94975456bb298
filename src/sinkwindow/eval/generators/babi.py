"""bAbI tasks qa1-qa5: a seeded generator that matches the public v1.2 data, and file loaders.

BABILong hides bAbI facts in long text. Its facts come from the public bAbI v1.2 data
(facebookarchive), not from the later Lua generator, whose verbs and sentence forms differ. This
generator therefore reproduces the public data's vocabulary, verb forms, question forms and
question rules, as read from the data itself. Replayed over the train and test files, the rules
below admit every real question of qa1, qa2 and qa4, 1,998 of 2,000 for qa3, and for qa5 the
newest give is the one asked about in 98% of questions:

* Facts come in pairs. After each pair a question may be asked; a story ends after five
  questions (qa4: two facts and one question).
* A question is only about facts near it: its newest supporting fact is at most :data:`WINDOW`
  lines above it (question lines count), and a pair that passes without a question closes the
  window behind it. So supporting facts sit 1, 2, 4, 5 or 7 lines above a question, and a
  question that follows four or more facts is about the last pair.
* qa1 asks after every pair, about the actor of a uniformly drawn move in the window. qa5 asks
  after every pair whose window holds a give, about the newest give. qa2 and qa3 ask with a fixed
  probability when a question is possible, about a uniformly drawn candidate.
* qa3's "before the L" refers to the object's newest arrival at L; both rooms must have been
  reached by moves of its holder since its last pick-up.
* The world is simulated truthfully (hidden starting rooms, objects that move with their holder,
  gives only between actors in one room), so answers are correct by construction; questions use
  only what the facts so far reveal.

Numbers that the rules leave open (action mix, ask rates, "there" rates) are fitted to the
public test files; :mod:`tests.test_babi` compares the generated statistics with the real ones.

The loaders read real bAbI v1.2 text files and BABILong JSON files into the same
:class:`BabiSample` structure: one sample per question, holding every fact line of its story
before the question (earlier questions dropped), as BABILong's ``get_dataset_df`` does.

The released en-10k test files of qa1-qa5 and BABILong's ``test_100_idxs.json`` ship with the
package (``sinkwindow/eval/data/babi/``, attribution and sha256s in its README.md and
PROVENANCE.json); :func:`babilong_questions` reads them in BABILong's order.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

__all__ = [
    "ACTORS",
    "BABILONG_SUBSET_SIZE",
    "BABI_TASKS",
    "BABI_TEST_FILES",
    "DIRECTIONS",
    "DROP_VERBS",
    "GET_VERBS",
    "GIVE_VERBS",
    "LOCATIONS",
    "MOVE_VERBS",
    "OBJECTS",
    "WINDOW",
    "BabiLine",
    "BabiSample",
    "babi_sample",
    "babilong_questions",
    "babilong_subset",
    "extract_facts",
    "find_babi_test_file",
    "generate_babi",
    "generate_babi_stories",
    "load_babi_file",
    "load_babilong_json",
    "parse_babi_stories",
    "shipped_babi_dir",
    "story_to_samples",
]

BABI_TASKS = ("qa1", "qa2", "qa3", "qa4", "qa5")

# Test-file names of the v1.2 release (tasks_1-20_v1-2/en-10k/), as shipped in data/babi/.
BABI_TEST_FILES: dict[str, str] = {
    "qa1": "qa1_single-supporting-fact_test.txt",
    "qa2": "qa2_two-supporting-facts_test.txt",
    "qa3": "qa3_three-supporting-facts_test.txt",
    "qa4": "qa4_two-arg-relations_test.txt",
    "qa5": "qa5_three-arg-relations_test.txt",
}
BABILONG_SUBSET_FILE = "test_100_idxs.json"
BABILONG_SUBSET_SIZE = 100

# Vocabulary of the public v1.2 data (en/ and en-10k/, qa1-qa5).
ACTORS: dict[str, tuple[str, ...]] = {
    "qa1": ("John", "Mary", "Sandra", "Daniel"),
    "qa2": ("John", "Mary", "Sandra", "Daniel"),
    "qa3": ("John", "Mary", "Sandra", "Daniel"),
    "qa5": ("Bill", "Fred", "Jeff", "Mary"),
}
LOCATIONS = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office")
OBJECTS = ("apple", "football", "milk")
MOVE_VERBS = ("moved to", "went to", "journeyed to", "travelled to", "went back to")
GET_VERBS = ("got", "grabbed", "picked up", "took")
DROP_VERBS = ("dropped", "put down", "left", "discarded")
GIVE_VERBS = ("gave", "handed", "passed")
DIRECTIONS = ("north", "south", "east", "west")
_OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}

# Newest supporting fact of a question is at most this many lines above it (questions count).
WINDOW = 7
QUESTIONS_PER_STORY = 5


@dataclass(frozen=True)
class _TaskParams:
    """Fitted constants of one task (frequencies in the public v1.2 test files)."""

    # Relative weight of each action kind among the kinds that are possible at that moment.
    weights: dict[str, float]
    # Probability of asking after a pair when a question is possible (data: qa2 68%, qa3 60%;
    # qa3 is set higher because its generated stories offer fewer candidates).
    ask: float
    # Share of gets / drops with a trailing " there" (qa2/qa5 gets: always; qa3 gets: 20%).
    get_there: float
    drop_there: float


_PARAMS: dict[str, _TaskParams] = {
    "qa1": _TaskParams({"move": 1.0}, 1.0, 1.0, 0.0),
    "qa2": _TaskParams({"move": 0.5, "get": 0.3, "drop": 0.2}, 0.68, 1.0, 0.19),
    "qa3": _TaskParams({"move": 0.52, "get": 0.27, "drop": 0.21}, 0.65, 0.2, 0.2),
    "qa5": _TaskParams({"move": 0.41, "get": 0.2, "drop": 0.13, "give": 0.45}, 1.0, 1.0, 0.2),
}


@dataclass(frozen=True)
class BabiLine:
    """One line of a bAbI story: a fact, or a question with its answer and supporting lines.

    Attributes:
        text: The sentence; questions keep bAbI's trailing space (qa1/2/3/5), as BABILong does.
        answer: The answer, or ``None`` for a fact.
        support: Supporting lines as 0-based indices into the story's lines.
    """

    text: str
    answer: str | None = None
    support: tuple[int, ...] = ()

    @property
    def is_question(self) -> bool:
        return self.answer is not None


@dataclass
class BabiSample:
    """One bAbI question with the facts before it (BABILong's unit of evaluation).

    Attributes:
        task: ``"qa1"`` ... ``"qa5"``.
        facts: The story's fact sentences before the question, earlier questions dropped.
        question: The question, trailing space kept as in the data (BABILong keeps it too).
        answer: The answer word (BABILong's ``target``).
        support: Supporting facts as 0-based indices into ``facts`` (empty when unknown).
        context: A published BABILong ``input`` (facts hidden in background text), when loaded
            from a BABILong JSON file; ``None`` otherwise.
        index: Position of the question in the file it was loaded from (0-based, questions
            only, the index BABILong's ``TaskDataset`` and ``test_100_idxs.json`` use); ``None``
            for generated samples.
    """

    task: str
    facts: list[str]
    question: str
    answer: str
    support: tuple[int, ...] = ()
    context: str | None = None
    index: int | None = None

    @property
    def input(self) -> str:
        """The facts as BABILong's 0K ``input``: each fact preceded by a space, then stripped."""
        return " ".join(self.facts)


def _task(task: str) -> str:
    key = task.strip().lower()
    if key not in BABI_TASKS:
        raise ValueError(f"unknown bAbI task {task!r}; expected one of {BABI_TASKS}")
    return key


class _Story:
    """A story being written: the true world, what the lines reveal, and the lines so far."""

    def __init__(self, task: str, rng: random.Random) -> None:
        self.task = task
        self.rng = rng
        self.params = _PARAMS[task]
        self.actors = ACTORS[task]
        self.lines: list[BabiLine] = []
        # The true world. Starting rooms are hidden from the reader until a move reveals them.
        self.room = {actor: rng.choice(LOCATIONS) for actor in self.actors}
        self.holder: dict[str, str | None] = {obj: None for obj in OBJECTS}
        self.obj_room = {obj: rng.choice(LOCATIONS) for obj in OBJECTS}
        # What the reader knows: actor -> (room, line of the move that says so).
        self.known_room: dict[str, tuple[str, int]] = {}
        # obj -> line of the newest get/drop/give that mentions it.
        self.obj_fact: dict[str, int] = {}
        # obj -> line of the move that put its dropper in the known drop room (None: unknown).
        self.drop_move: dict[str, int | None] = {}
        # qa3: obj -> [(room or None, line that puts it there)]; segment starts at the last get.
        self.trajectory: dict[str, list[tuple[str | None, int]]] = {obj: [] for obj in OBJECTS}
        self.segment_start: dict[str, int] = {}
        self.gives: list[int] = []
        # A pair that passes without a question closes the window behind it: in the data, a
        # question after four or more facts is always about the last pair.
        self.floor = 0

    def add(self, line: BabiLine) -> int:
        self.lines.append(line)
        return len(self.lines) - 1

    def _actions(self) -> dict[str, list[tuple]]:
        """Every action the true world allows now, by kind."""
        actions: dict[str, list[tuple]] = {kind: [] for kind in self.params.weights}
        for actor in self.actors:
            here = self.room[actor]
            if "move" in actions:
                actions["move"].extend(("move", actor, room) for room in LOCATIONS if room != here)
            for obj in OBJECTS:
                holder = self.holder[obj]
                if "get" in actions and holder is None and self.obj_room[obj] == here:
                    actions["get"].append(("get", actor, obj))
                if holder == actor:
                    if "drop" in actions:
                        actions["drop"].append(("drop", actor, obj))
                    if "give" in actions:
                        actions["give"].extend(
                            ("give", actor, obj, other)
                            for other in self.actors
                            if other != actor and self.room[other] == here
                        )
        return actions

    def step(self) -> None:
        """Sample one valid action, apply it to the world and write its fact line."""
        actions = {kind: options for kind, options in self._actions().items() if options}
        kinds = list(actions)
        kind = self.rng.choices(kinds, weights=[self.params.weights[k] for k in kinds])[0]
        if kind == "move":
            # Uniform actor, then a uniform different room: the data shows no preference.
            actor = self.rng.choice(self.actors)
            room = self.rng.choice([r for r in LOCATIONS if r != self.room[actor]])
            action: tuple = ("move", actor, room)
        else:
            action = self.rng.choice(actions[kind])
        self._apply(action)

    def _apply(self, action: tuple) -> None:
        rng, params = self.rng, self.params
        kind, actor = action[0], action[1]
        n = len(self.lines)
        if kind == "move":
            room = action[2]
            self.add(BabiLine(f"{actor} {rng.choice(MOVE_VERBS)} the {room}."))
            self.room[actor] = room
            self.known_room[actor] = (room, n)
            for obj, holder in self.holder.items():
                if holder == actor:
                    self.obj_room[obj] = room
                    self.trajectory[obj].append((room, n))
        elif kind == "get":
            obj = action[2]
            there = " there" if rng.random() < params.get_there else ""
            self.add(BabiLine(f"{actor} {rng.choice(GET_VERBS)} the {obj}{there}."))
            self.holder[obj] = actor
            self.obj_fact[obj] = n
            known = self.known_room.get(actor)
            self.segment_start[obj] = len(self.trajectory[obj])
            self.trajectory[obj].append(known if known is not None else (None, n))
        elif kind == "drop":
            obj = action[2]
            there = " there" if rng.random() < params.drop_there else ""
            self.add(BabiLine(f"{actor} {rng.choice(DROP_VERBS)} the {obj}{there}."))
            self.holder[obj] = None
            self.obj_fact[obj] = n
            known = self.known_room.get(actor)
            self.drop_move[obj] = known[1] if known is not None else None
        else:
            obj, other = action[2], action[3]
            self.add(BabiLine(f"{actor} {rng.choice(GIVE_VERBS)} the {obj} to {other}."))
            self.holder[obj] = other
            self.obj_fact[obj] = n
            self.gives.append(n)

    def _in_window(self, support: Iterable[int]) -> bool:
        # The question would be the next line, len(self.lines).
        newest = max(support)
        return newest >= self.floor and len(self.lines) - newest <= WINDOW

    def candidates(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """Questions answerable now from the facts in the window: ``(question, answer, support)``."""
        task, out = self.task, []
        if task == "qa1":
            # One entry per move in the window: an actor who moved twice there is twice as likely.
            for i in range(max(self.floor, len(self.lines) - WINDOW), len(self.lines)):
                line = self.lines[i]
                if not line.is_question:
                    actor = line.text.split(" ", 1)[0]
                    room, move = self.known_room[actor]
                    out.append((f"Where is {actor}? ", room, (move,)))
        elif task == "qa2":
            for obj, fact in self.obj_fact.items():
                holder = self.holder[obj]
                if holder is not None:
                    known = self.known_room.get(holder)
                    move = known[1] if known is not None else None
                else:
                    move = self.drop_move.get(obj)
                if move is None:
                    continue
                support = (fact, move)
                if self._in_window(support):
                    out.append((f"Where is the {obj}? ", self.obj_room[obj], support))
        elif task == "qa3":
            for obj, fact in self.obj_fact.items():
                path = self.trajectory[obj]
                start = self.segment_start[obj]
                # Both rooms must have been reached by moves while held since the last get; the
                # question names the newest arrival at a room ("before the L" = before that one).
                for i in range(start + 2, len(path)):
                    room, move = path[i]
                    if any(later == room for later, _ in path[i + 1 :]):
                        continue
                    previous, previous_move = path[i - 1]
                    support = (fact, move, previous_move)
                    if self._in_window(support):
                        out.append((f"Where was the {obj} before the {room}? ", str(previous), support))
        elif task == "qa5" and self.gives and self._in_window((self.gives[-1],)):
            out.append(self._give_question(self.gives[-1]))
        return out

    def _give_question(self, line: int) -> tuple[str, str, tuple[int, ...]]:
        """One of qa5's five question forms about the give on ``line``.

        The answer kind (object, giver, receiver) is uniform, then the form within it: 1/3
        ``What did A give to B?`` and 1/6 for each other form, as in the data.
        """
        match = re.fullmatch(r"(\w+) (?:gave|handed|passed) the (\w+) to (\w+)\.", self.lines[line].text)
        assert match is not None
        giver, obj, receiver = match.groups()
        kind = self.rng.randrange(3)
        if kind == 0:
            return f"What did {giver} give to {receiver}? ", obj, (line,)
        if kind == 1:
            if self.rng.random() < 0.5:
                return f"Who gave the {obj}? ", giver, (line,)
            return f"Who gave the {obj} to {receiver}? ", giver, (line,)
        if self.rng.random() < 0.5:
            return f"Who received the {obj}? ", receiver, (line,)
        return f"Who did {giver} give the {obj} to? ", receiver, (line,)

    def maybe_ask(self) -> bool:
        options = self.candidates()
        if not options or self.rng.random() >= self.params.ask:
            self.floor = len(self.lines)
            return False
        question, answer, support = options[0] if self.task == "qa5" else self.rng.choice(options)
        self.add(BabiLine(question, answer, tuple(support)))
        return True


def _qa4_story(rng: random.Random) -> list[BabiLine]:
    """qa4: three rooms on one axis, two adjacent relations, one question about one of them.

    Each relation names the middle room as the reference ("of the B") 65% of the time, the two
    facts come in random order, and the question restates the chosen fact: ``What is {d} of the
    {Y}?`` or ``What is the {Y} {opposite d} of?``, answer the fact's subject. The question has no
    trailing space in the data.
    """
    a, b, c = rng.sample(LOCATIONS, 3)
    d = rng.choice(("north", "east"))
    facts = []
    # (a d-of b): middle b as reference -> "a is d of b"; otherwise "b is opposite-d of a".
    facts.append((a, d, b) if rng.random() < 0.65 else (b, _OPPOSITE[d], a))
    # (b d-of c): middle b as reference -> "c is opposite-d of b"; otherwise "b is d of c".
    facts.append((c, _OPPOSITE[d], b) if rng.random() < 0.65 else (b, d, c))
    rng.shuffle(facts)
    lines = [BabiLine(f"The {x} is {direction} of the {y}.") for x, direction, y in facts]
    which = rng.randrange(2)
    x, direction, y = facts[which]
    if rng.random() < 0.5:
        question = f"What is {direction} of the {y}?"
    else:
        question = f"What is the {y} {_OPPOSITE[direction]} of?"
    lines.append(BabiLine(question, x, (which,)))
    return lines


def _story(task: str, rng: random.Random, max_facts: int = 2000) -> list[BabiLine]:
    """Write one story of ``task``."""
    if task == "qa4":
        return _qa4_story(rng)
    while True:
        story = _Story(task, rng)
        asked = 0
        while asked < QUESTIONS_PER_STORY and len(story.lines) < max_facts:
            story.step()
            story.step()
            asked += story.maybe_ask()
        if asked == QUESTIONS_PER_STORY:
            return story.lines


def generate_babi_stories(task: str, num_stories: int, seed: int = 0) -> list[list[BabiLine]]:
    """Generate ``num_stories`` bAbI stories (five questions each; qa4: one).

    Story ``i`` depends only on ``(task, seed, i)``.
    """
    task = _task(task)
    return [_story(task, random.Random(f"babi:{task}:{seed}:{i}")) for i in range(num_stories)]


def story_to_samples(task: str, lines: Sequence[BabiLine]) -> list[BabiSample]:
    """Split a story into one sample per question, as BABILong's ``get_dataset_df`` does."""
    samples, facts, index_of = [], [], {}
    for i, line in enumerate(lines):
        if line.is_question:
            support = tuple(index_of[s] for s in line.support if s in index_of)
            samples.append(BabiSample(task, list(facts), line.text, str(line.answer), support))
        else:
            index_of[i] = len(facts)
            facts.append(line.text)
    return samples


def babi_sample(task: str, index: int, seed: int = 0) -> BabiSample:
    """Sample ``index`` of :func:`generate_babi` for ``seed``: one question of its own story.

    The question is drawn uniformly among the story's questions, which matches the marginal
    distribution of BABILong's random 100-question subsets of the test files without their
    within-story correlation.
    """
    task = _task(task)
    rng = random.Random(f"babi:{task}:{seed}:{index}")
    samples = story_to_samples(task, _story(task, rng))
    return samples[rng.randrange(len(samples))]


def generate_babi(task: str, num_samples: int, seed: int = 0) -> list[BabiSample]:
    """Generate ``num_samples`` independent bAbI samples of ``task``.

    Sample ``i`` depends only on ``(task, seed, i)`` (see :func:`babi_sample`), so a longer list
    extends a shorter one.
    """
    return [babi_sample(task, i, seed) for i in range(num_samples)]


def parse_babi_stories(text: str) -> list[list[BabiLine]]:
    """Parse bAbI's text format (``"{n} {sentence}"``; questions ``"{n} {q}\\t{a}\\t{ids}"``)."""
    stories: list[list[BabiLine]] = []
    numbers: dict[int, int] = {}
    for raw in text.strip("\n").split("\n"):
        if not raw.strip():
            continue
        number_text, rest = raw.split(" ", 1)
        number = int(number_text)
        if number == 1 or not stories:
            stories.append([])
            numbers = {}
        numbers[number] = len(stories[-1])
        if "\t" in rest:
            question, answer, *ids = rest.split("\t")
            refs = [int(x) for x in " ".join(ids).split()]
            stories[-1].append(BabiLine(question, answer, tuple(numbers[r] for r in refs if r in numbers)))
        else:
            stories[-1].append(BabiLine(rest))
    return stories


def _task_from_path(path: Path) -> str:
    match = re.match(r"(qa\d+)", path.name)
    if match is None or match.group(1) not in BABI_TASKS:
        raise ValueError(f"cannot tell the bAbI task from {path.name!r}; pass task=")
    return match.group(1)


def load_babi_file(
    path: str | Path, task: str | None = None, max_n_facts: int | None = None
) -> list[BabiSample]:
    """Load a bAbI v1.2 text file (e.g. ``en-10k/qa1_single-supporting-fact_test.txt``).

    Samples come in file order, one per question, exactly as BABILong's ``TaskDataset`` indexes
    them, so ``[samples[i] for i in test_100_idxs[task]]`` is BABILong's 100-sample set.

    Args:
        path: The file.
        task: ``"qa1"`` ... ``"qa5"``; read from the file name when omitted.
        max_n_facts: BABILong's filter: drop samples with more than ``max_n_facts - 1`` facts
            (it counts the question row too). BABILong uses ``message_length // 8`` above 0K.
    """
    path = Path(path)
    task = _task(task) if task is not None else _task_from_path(path)
    samples = _text_samples(task, path.read_text(encoding="utf-8"))
    if max_n_facts is not None:
        samples = [s for s in samples if len(s.facts) + 1 <= max_n_facts]
    return samples


def _text_samples(task: str, text: str) -> list[BabiSample]:
    samples = []
    for story in parse_babi_stories(text):
        samples.extend(story_to_samples(task, story))
    for i, sample in enumerate(samples):
        sample.index = i
    return samples


def shipped_babi_dir() -> Traversable:
    """The bAbI data that ships with the package (``sinkwindow/eval/data/babi``).

    It holds the five en-10k test files (:data:`BABI_TEST_FILES`), BABILong's
    ``test_100_idxs.json``, their licenses and ``PROVENANCE.json`` (source and sha256 of each).
    """
    return resources.files("sinkwindow.eval").joinpath("data", "babi")


@functools.cache
def _shipped_text(name: str) -> str:
    """A shipped file's text, after checking its sha256 against PROVENANCE.json."""
    folder = shipped_babi_dir()
    expected = json.loads(folder.joinpath("PROVENANCE.json").read_text(encoding="utf-8"))["files"][name]
    data = folder.joinpath(name).read_bytes()
    if hashlib.sha256(data).hexdigest() != expected["sha256"]:
        raise ValueError(
            f"packaged bAbI file {name} does not match its sha256 in PROVENANCE.json; reinstall sinkwindow"
        )
    return data.decode("utf-8")


def find_babi_test_file(folder: str | Path, task: str) -> Path | None:
    """The ``{task}_*_test.txt`` file in a bAbI folder, or ``None``.

    ``folder`` may hold the files itself, or be a release root with ``en-10k/`` (or
    ``tasks_1-20_v1-2/en-10k/``) below it.
    """
    task = _task(task)
    folder = Path(folder)
    for where in (folder, folder / "en-10k", folder / "tasks_1-20_v1-2" / "en-10k"):
        found = sorted(where.glob(f"{task}_*_test.txt"))
        if found:
            return found[0]
    return None


def babilong_subset(folder: str | Path | None = None) -> dict[str, list[int]]:
    """BABILong's ``test_100_idxs.json``: per task, 100 question indices into the test file.

    Read from ``folder`` when it holds a ``test_100_idxs.json``, else from the shipped copy.
    """
    if folder is not None and (Path(folder) / BABILONG_SUBSET_FILE).is_file():
        data = json.loads((Path(folder) / BABILONG_SUBSET_FILE).read_text(encoding="utf-8"))
    else:
        data = json.loads(_shipped_text(BABILONG_SUBSET_FILE))
    return {task: [int(i) for i in data[task]] for task in BABI_TASKS if task in data}


def babilong_questions(task: str, folder: str | Path | None = None) -> list[BabiSample]:
    """Every test question of ``task`` in BABILong's order, each with the facts before it.

    BABILong evaluates the ``test_100_idxs.json`` questions of the en-10k test file: its sample
    ``i`` is the question at ``test_100_idxs[task][i]`` (an index over the file's questions),
    with every fact of its story before it. Those 100 come first here, in that order; the test
    file's other questions follow in file order, for runs of more than 100 samples. Each
    sample's :attr:`BabiSample.index` is its position in the file.

    Args:
        task: ``"qa1"`` ... ``"qa5"``.
        folder: A bAbI folder to read instead of the shipped files (see
            :func:`find_babi_test_file`; its own ``test_100_idxs.json`` is used if present).
    """
    task = _task(task)
    if folder is None:
        samples = _text_samples(task, _shipped_text(BABI_TEST_FILES[task]))
    else:
        path = find_babi_test_file(folder, task)
        if path is None:
            raise FileNotFoundError(f"no {task}_*_test.txt in {folder} (nor in its en-10k/)")
        samples = load_babi_file(path, task)
    chosen = babilong_subset(folder)[task]
    if len(set(chosen)) != len(chosen) or not all(0 <= i < len(samples) for i in chosen):
        raise ValueError(f"{BABILONG_SUBSET_FILE} holds {task} indices outside its {len(samples)} questions")
    taken = set(chosen)
    return [samples[i] for i in chosen] + [s for i, s in enumerate(samples) if i not in taken]


_FACT_PATTERNS = (
    r"(?:John|Mary|Sandra|Daniel|Bill|Fred|Jeff) (?:" + "|".join(MOVE_VERBS) + r") the \w+\.",
    r"(?:John|Mary|Sandra|Daniel|Bill|Fred|Jeff) (?:"
    + "|".join(GET_VERBS + DROP_VERBS)
    + r") the \w+(?: there)?\.",
    r"(?:John|Mary|Sandra|Daniel|Bill|Fred|Jeff) (?:" + "|".join(GIVE_VERBS) + r") the \w+ to \w+\.",
    r"The \w+ is (?:north|south|east|west) of the \w+\.",
)
_FACT_RE = re.compile("|".join(f"(?:{p})" for p in _FACT_PATTERNS))


def extract_facts(text: str) -> list[str]:
    """Return the bAbI qa1-qa5 fact sentences found in ``text``, in order.

    Exact for a 0K input (facts only); for inputs with background text it is best effort: a
    background sentence that happens to follow the bAbI grammar would be picked up too.
    """
    return _FACT_RE.findall(text)


def load_babilong_json(path: str | Path, task: str | None = None) -> list[BabiSample]:
    """Load BABILong samples (``input``, ``question``, ``target``) from a JSON or JSONL file.

    Accepts a list of records (``data/create_tasks.py`` writes ``{len_name}.json`` this way),
    one record per line, or a mapping from task name to such a list (then ``task`` selects one).
    Each sample keeps the published ``input`` as ``context``; ``facts`` are the bAbI sentences
    found in it (see :func:`extract_facts`).

    Args:
        path: The file.
        task: ``"qa1"`` ... ``"qa5"``; read from the file or folder name when omitted.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict):
        if task is None:
            raise ValueError(f"{path} maps task names to samples; pass task=")
        data = data[_task(task)]
    if task is None:
        for part in (path.name, path.parent.name):
            match = re.match(r"(qa\d+)", part)
            if match and match.group(1) in BABI_TASKS:
                task = match.group(1)
                break
        else:
            raise ValueError(f"cannot tell the bAbI task from {path}; pass task=")
    task = _task(task)
    return [
        BabiSample(
            task, extract_facts(record["input"]), record["question"], record["target"], (), record["input"], i
        )
        for i, record in enumerate(data)
    ]
