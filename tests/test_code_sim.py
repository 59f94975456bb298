"""LongBench's code_sim_score and exact match for the lcc task: hand-made cases, fast == reference."""

import random

import pytest

from sinkwindow.eval.code_sim import (
    code_sim_score,
    exact_match,
    first_code_line,
    fuzz_ratio,
    indel_distance,
    indel_distance_reference,
)


def test_identical_lines_score_100_and_an_empty_prediction_0():
    answer = "result = self._cache.get(key, default)"
    assert code_sim_score(answer, answer) == 100 == exact_match(answer, answer)
    assert code_sim_score("", answer) == 0 == exact_match("", answer)
    assert code_sim_score("\n\n", answer) == 0


def test_the_first_line_without_a_comment_or_fence_is_scored():
    answer = "return os.path.join(root, name)"
    # Leading newlines, comment lines and Markdown fences are skipped, as LongBench does.
    assert code_sim_score(f"\n# join them\n{answer}\nprint(1)", answer) == 100
    assert code_sim_score(f"```python\n{answer}\n```", answer) == 100
    assert exact_match(f"// c-style\n{answer}", answer) == 100
    # A line holding '#' anywhere is skipped too: here the second line is what counts.
    assert first_code_line(f"{answer}  # trailing\nx = 1") == "x = 1"
    assert first_code_line("# only\n# comments") == ""
    # Only the first code line counts: a right answer after a wrong code line scores that line.
    assert code_sim_score(f"x = 1\n{answer}", answer) < 50


def test_indentation_and_trailing_space_are_not_scored():
    assert code_sim_score("        return x   \n", "return x") == 100
    assert exact_match("\treturn x", "return x") == 100
    assert exact_match("return y", "return x") == 0


def test_ratio_matches_fuzzywuzzy_on_known_values():
    # fuzzywuzzy's README: fuzz.ratio("this is a test", "this is a test!") == 97.
    assert fuzz_ratio("this is a test", "this is a test!") == 97
    # One substitution is a deletion and an insertion: (6 + 6 - 2) / 12.
    assert fuzz_ratio("abcdef", "abcdeg") == round(100 * 10 / 12)
    assert fuzz_ratio("", "abc") == 0 == fuzz_ratio("abc", "")


def test_reference_distance_on_hand_cases():
    # LCS("kitten", "sitting") = "ittn": 6 + 7 - 2 * 4 deletions and insertions.
    assert indel_distance_reference("kitten", "sitting") == 5
    assert indel_distance_reference("", "abc") == 3
    assert indel_distance_reference("abc", "abc") == 0
    assert indel_distance_reference("abc", "cba") == 4  # LCS of length 1


def test_fast_distance_equals_the_reference_on_random_strings():
    pytest.importorskip("rapidfuzz")
    rng = random.Random(0)
    alphabets = ["ab", "abc ", "abcdefghij(). =_", "xyzé→\t"]
    for _ in range(600):
        alpha = rng.choice(alphabets)
        a = "".join(rng.choice(alpha) for _ in range(rng.randint(0, 40)))
        b = "".join(rng.choice(alpha) for _ in range(rng.randint(0, 40)))
        assert indel_distance(a, b) == indel_distance_reference(a, b), (a, b)
