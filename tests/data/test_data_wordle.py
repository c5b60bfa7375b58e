"""Wordle rules and games: feedback on hand-made repeated-letter cases, the vectorized codes
against the plain rule, prompt round trips, the word list, and whole games with the solver."""

import itertools
import math
import random

import numpy as np
import pytest

from smollab.data import wordle_games as games
from smollab.data.wordle import (
    WORDS,
    build_prompt,
    candidates,
    code_of,
    feedback,
    feedback_codes,
    letters,
    parse_guess,
    parse_history,
    word_table,
)


@pytest.mark.parametrize(
    ("secret", "guess", "expected"),
    [
        ("apple", "papal", "yygxy"),  # middle p green, first p yellow, only one a to give
        ("apple", "apple", "ggggg"),
        ("apple", "lapel", "yygyx"),  # one l in the secret: the second l is absent
        ("apple", "ppppp", "xggxx"),  # greens use up both p's; no yellow is left to give
        ("abbey", "babes", "yyggx"),
        ("hello", "llama", "yyxxx"),  # two l's in the secret, both yellow
        ("crane", "eerie", "xxyxg"),  # the final e is green and takes the secret's only e
        ("stone", "crane", "xxxgg"),
        ("quiet", "zebra", "xyxxx"),
    ],
)
def test_feedback_repeated_letters_by_hand(secret, guess, expected):
    assert feedback(secret, guess) == expected
    codes = feedback_codes(letters([secret]), letters([guess]))
    assert codes.shape == (1, 1) and int(codes[0, 0]) == code_of(expected)


def test_codes_are_base_three_with_first_position_most_significant():
    assert code_of("xxxxx") == 0 and code_of("ggggg") == 242
    assert code_of("yxxxx") == 81 and code_of("xxxxg") == 2


def test_vectorized_codes_match_the_plain_rule_on_random_and_listed_words():
    rng = random.Random(0)
    pool = "aabbe"  # few letters: many repeats, the hard cases
    made = ["".join(rng.choice(pool) for _ in range(5)) for _ in range(40)]
    got = feedback_codes(letters(made), letters(made))
    want = np.array([[code_of(feedback(s, g)) for g in made] for s in made])
    assert (got == want).all()
    table, index = word_table()
    for s, g in itertools.islice(itertools.product(WORDS[::7], WORDS[::5]), 500):
        assert table[index[s], index[g]] == code_of(feedback(s, g))


def test_word_list_is_unique_lowercase_five_letter_words():
    assert len(WORDS) == len(set(WORDS)) >= 200
    assert all(len(w) == 5 and w.isascii() and w.isalpha() and w.islower() for w in WORDS)
    assert "apple" in WORDS


def test_prompt_is_one_line_and_parses_back_even_respaced_and_upper_case():
    history = [("crane", "xyxxg"), ("stone", "xxxgg")]
    prompt = build_prompt(history)
    assert "\n" not in prompt and "crane xyxxg" in prompt
    assert parse_history(prompt) == history
    assert parse_history(prompt.upper().replace(" ", "  ")) == history
    assert parse_history(build_prompt([])) == []


def test_parse_guess_reads_the_tag_tolerantly():
    assert parse_guess("<think>hm</think><guess>Crane</guess>") == "crane"
    assert parse_guess("< think > hm < / think > < guess > crane < / guess >") == "crane"
    assert parse_guess("crane") is None


def test_candidates_keep_exactly_the_consistent_words():
    history = [("shore", feedback("apple", "shore"))]
    cands = candidates(history)
    assert "apple" in cands and "shore" not in cands
    assert all(feedback(c, "shore") == history[0][1] for c in cands)
    assert len(cands) == sum(feedback(w, "shore") == history[0][1] for w in WORDS)


def test_solver_plays_perfect_games_within_six_turns():
    secrets = ["apple", "zebra", "hello", "cocoa", "sheep", "tools"]
    result = games.play_games(games.solver_generate, secrets, max_turns=6)
    assert result["solve_rate"] == 1.0 and result["invalid_rate"] == 0.0
    assert 1.0 <= result["mean_guesses"] <= 6.0


def test_play_games_counts_wasted_turns_and_unsolved_games():
    secrets = ["apple", "zebra"]
    always_bad = games.play_games(lambda ps: ["<guess>zzzzz</guess>"] * len(ps), secrets, 3)
    assert always_bad["solve_rate"] == 0.0 and always_bad["invalid_rate"] == 1.0
    assert math.isnan(always_bad["mean_guesses"])
    assert always_bad["turns"] == 6 and always_bad["format_error_rate"] == 0.0  # a tag, no word
    no_tag = games.play_games(lambda ps: ["zebra"] * len(ps), secrets, 2)
    assert no_tag["format_error_rate"] == 1.0 and no_tag["invalid_rate"] == 1.0

    def apple_then_zebra(prompts):  # first turn: apple; later turns: zebra
        return [f"<guess>{'apple' if 'none' in p else 'zebra'}</guess>" for p in prompts]

    got = games.play_games(apple_then_zebra, secrets, 6)
    assert got == {
        "games": 2,
        "solved": 2,
        "turns": 3,
        "solve_rate": 1.0,
        "mean_guesses": 1.5,
        "invalid_rate": 0.0,
        "format_error_rate": 0.0,
    }


def test_transcripts_and_prompts_files(tmp_path):
    n = games.write_transcripts(tmp_path / "t.txt", games=5, seed=1)
    lines = (tmp_path / "t.txt").read_text().splitlines()
    assert len(lines) == n >= 5
    for line in lines:  # each line: a prompt, then the solver's completion for it
        prompt, _, tail = line.partition(" next guess: ")
        assert parse_guess(tail) in WORDS and tail.startswith("<think>")
    assert games.write_prompts(tmp_path / "p.txt", n=7, seed=1) == 7
    prompts = (tmp_path / "p.txt").read_text().splitlines()
    assert len(prompts) == 7 and all(p.endswith("next guess:") for p in prompts)
    assert any(parse_history(p) for p in prompts)  # not all at turn one


def test_solver_transcripts_only_make_consistent_guesses():
    game = games.solver_game("apple", random.Random(3), top_k=3)
    assert parse_guess(game[-1][1]) == "apple"
    for prompt, completion in game:
        guess = parse_guess(completion)
        assert all(feedback(guess, g) == fb for g, fb in parse_history(prompt))
