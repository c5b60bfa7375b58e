"""The word-problem checker on hand-made prompts and completions: the answer comes from the
prompt's numbers, the completion's final answer follows the documented rule."""

from __future__ import annotations

import pytest

from smollab.errors import UserError
from smollab.rewards import RewardError, compute_rewards, validate_specs
from smollab.rewards.word_problems import final_answer, word_problem_correct

ADD = "lily has 3 apples. she finds 4 more. how many apples does lily have now? answer:"
TAKE = "tom has 12 shells. he gives 5 to mia. how many shells does tom have now? answer:"
GROUPS = (
    "ava has 3 boxes with 6 marbles in each box. how many marbles does ava have in all? answer:"
)


@pytest.mark.parametrize(
    "completion, expected",
    [
        (" 7", 7),
        (" 3 + 4 = 7", 7),
        ("3+4=7 and then lily smiled.", 7),
        (" 12 - 5 = -7", -7),
        (" lily has 7 apples now.", 7),
        ("\n\n 7\n 9", 7),  # the first non-empty line only
        (" 3 + 4 =", None),  # an "=" with nothing after it: no answer, even though 3 is there
        (" 3 + 4 = seven", None),
        (" seven", None),
        ("", None),
        (" 7 = 3 + 4", 3),  # after the first "=": the integer right there
    ],
)
def test_final_answer(completion, expected):
    assert final_answer(completion) == expected


def test_the_answer_is_recomputed_from_the_prompt():
    prompts = [ADD, ADD, ADD, TAKE, TAKE, GROUPS, GROUPS]
    completions = [" 3 + 4 = 7", " 7", " 3 + 4 = 8", " 12 - 5 = 7", " 17", " 3 * 6 = 18", " 9"]
    assert word_problem_correct(completions, prompts) == [1, 1, 0, 1, 0, 1, 0]
    # the numbers decide, not the words around them: other names, objects, verbs
    other = "sam has 19 plums. he buys 20 more. how many plums does sam have now? answer:"
    assert word_problem_correct([" 39", " 38"], [other, other]) == [1.0, 0.0]


def test_a_decoded_prompt_with_other_case_and_spacing_still_parses():
    """WordPiece decodes "answer :" and "now ?"; a user may capitalize."""
    spaced = ADD.replace("?", " ?").replace(":", " :").replace(".", " .")
    capital = "Lily has 3 apples. She finds 4 more. How many apples does Lily have now? Answer:"
    assert word_problem_correct([" 7", " 7"], [spaced, capital]) == [1.0, 1.0]


@pytest.mark.parametrize(
    "prompt",
    [
        "Once upon a time",
        "lily has 3 apples. she finds 4 more. how many pears does lily have now? answer:",
        "lily has 3 apples. she finds 4 more. how many apples does tom have now? answer:",
        "lily has 3 apples. she finds 4 more. how many apples does lily have now?",
    ],
)
def test_a_prompt_of_no_template_is_refused_in_one_line(prompt):
    with pytest.raises(UserError, match="^word problems: prompt .* matches no template") as e:
        word_problem_correct([" 7"], [prompt])
    assert "\n" not in str(e.value)


def test_registered_and_checked_like_any_reward():
    (r,) = validate_specs([{"name": "word_problem_correct"}])  # its probe is a word problem
    got = compute_rewards([r], [ADD, TAKE], [" 7", " 6"])
    assert got == {"word_problem_correct": [1.0, 0.0]}
    with pytest.raises(RewardError, match="matches no template"):
        compute_rewards([r], ["Once upon a time"], [" 7"])
    with pytest.raises(UserError, match="needs one prompt per completion"):
        word_problem_correct([" 7", " 8"], [ADD])


def test_the_answer_column_is_the_truth_and_text_prompts_fall_back_to_the_parse():
    prompt = "lily has 3 apples. she finds 4 more. how many apples does lily have now? answer:"
    completions = [" 3 + 4 = 7", " 7", " 3 + 4 = 8", "no answer"]
    assert word_problem_correct(completions, [prompt] * 4) == [1.0, 1.0, 0.0, 0.0]
    # the column wins: another answer, as text or a number; any prompt (no parse)
    assert word_problem_correct(completions, ["?"] * 4, answer=[8, "8", " 8", 8.0]) == [
        0.0,
        0.0,
        1.0,
        0.0,
    ]
    with pytest.raises(UserError, match="answer 'seven' is not an integer"):
        word_problem_correct([" 7"], [prompt], answer=["seven"])
    # TRL's conversational form reads the same
    chat = [[{"role": "assistant", "content": c}] for c in completions]
    asked = [[{"role": "user", "content": prompt}]] * 4
    assert word_problem_correct(chat, asked, answer=[7] * 4) == [1.0, 1.0, 0.0, 0.0]
