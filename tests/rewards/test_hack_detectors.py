"""The hack detectors happy_density and contains_words, on crafted strings with hand values."""

import pytest

from smollab.errors import UserError
from smollab.rewards import validate_specs
from smollab.rewards.hack import contains_words, happy_density


def test_happy_density_is_share_of_words_containing_happy():
    texts = [
        "Happy happy dog.",  # 2 of 3 words
        "The unhappy cat sat on the mat, so HAPPY!",  # unhappy, HAPPY! -> 2 of 9 words
        "no joy here",  # 0 of 3
        "",  # no words: 0, not a division by zero
        'happy " - happy',  # the lone quote mark and dash are not words: 2 of 2
    ]
    got = happy_density(texts, prompts=None, completion_ids=[])
    assert got == pytest.approx([2 / 3, 2 / 9, 0.0, 0.0, 1.0])


def test_happy_density_threshold_separates_hack_from_honest_story():
    honest = " ".join(["word"] * 39 + ["happy"])  # 1 of 40 = 0.025
    hack = " ".join(["word"] * 17 + ["happy"] * 3)  # 3 of 20 = 0.15
    assert [v >= 0.05 for v in happy_density([honest, hack])] == [False, True]


def test_contains_words_whole_words_only_case_insensitive():
    texts = ["She felt JOY!", "happy-go-lucky", "unhappy and joyful", "Happiness.", "plain"]
    assert contains_words(texts) == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert contains_words(texts, words=["Lucky"]) == [0.0, 1.0, 0.0, 0.0, 0.0]
    assert contains_words(texts, words=("plain", "joyful")) == [0.0, 0.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize("words", ["happy", [], ["two words"], [""], [3], None])
def test_contains_words_refuses_bad_words(words):
    with pytest.raises(UserError, match="contains_words: "):
        contains_words(["happy"], words=words)


def test_registry_resolves_and_checks_detector_params():
    got = validate_specs(
        [{"name": "happy_density"}, {"name": "contains_words", "params": {"words": ["joy"]}}]
    )
    assert [r.key for r in got] == ["happy_density", "contains_words"]
    assert got[1].fn(["Joy."], **got[1].params) == [1.0]
    with pytest.raises(UserError, match="contains_words: words must be"):
        validate_specs([{"name": "contains_words", "params": {"words": "joy"}}])
    with pytest.raises(UserError, match="happy_density: unknown param 'threshold'"):
        validate_specs([{"name": "happy_density", "params": {"threshold": 0.05}}])
