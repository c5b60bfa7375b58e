"""Wordle rules and games: feedback on hand-made repeated-letter cases, the vectorized codes
against the plain rule, prompt round trips, the word list, and whole games with the solver."""

import itertools
import json
import math
import random

import numpy as np
import pytest

from smollab.data import wordle_games as games
from smollab.data.wordle import (
    WORDS,
    build_chat,
    build_prompt,
    candidates,
    code_of,
    feedback,
    feedback_codes,
    history_of,
    history_row,
    letters,
    parse_guess,
    parse_history,
    shown,
    word_table,
)
from smollab.errors import UserError


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


def test_prompt_is_one_line_in_the_seed_s_format_and_parses_back_respaced_any_case():
    history = [("crane", "xyxxg"), ("stone", "xxxgg")]
    prompt = build_prompt(history)
    assert "\n" not in prompt and prompt.endswith("Guess 3:")
    assert "Guess 1: CRANE -> C(x) R(-) A(x) N(x) E(✓)." in prompt
    assert parse_history(prompt) == history
    assert parse_history(prompt.lower().replace(" ", "  ").replace("(", "( ")) == history
    assert parse_history(build_prompt([])) == []


def test_chat_prompt_and_the_history_column_hold_the_same_game():
    history = [("crane", "xyxxg"), ("stone", "xxxgg")]
    system, user = build_chat(history)
    assert system["role"] == "system" and "<guess>WORD</guess>" in system["content"]
    assert user["content"].splitlines()[-1] == "Make guess 3."
    assert parse_history(user["content"]) == history
    row = history_row(history)
    assert row == [["CRANE", "C(x) R(-) A(x) N(x) E(✓)"], ["STONE", "S(x) T(x) O(x) N(✓) E(✓)"]]
    assert history_of(row) == history
    assert history_of(str(row)) == history == history_of(json.dumps(row))  # text, as some store it
    assert history_of([]) == [] and shown("apple", "gyxxx") == "A(✓) P(-) P(x) L(x) E(x)"
    for bad in ("nonsense", [["CRANE", "C(x) R(-)"]], [["CRANE"]], 3):
        with pytest.raises(UserError, match="past_guess_history"):
            history_of(bad)


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
        return [f"<guess>{'zebra' if 'Guess 1:' in p[:-9] else 'apple'}</guess>" for p in prompts]

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


def test_transcripts_and_games_rows(tmp_path):
    n = games.write_transcripts(tmp_path / "t.txt", games=5, seed=1)
    lines = (tmp_path / "t.txt").read_text().splitlines()
    assert len(lines) == n >= 5
    for line in lines:  # each line: a prompt, then the solver's completion for it
        prompt, _, tail = line.rpartition(": ")
        assert (
            parse_guess(tail) in WORDS and tail.startswith("<think>") and tail.endswith("</guess>")
        )
        assert tail.split("<guess>")[1][:5].isupper()  # the seed's capitals
    assert games.write_games(tmp_path / "g.jsonl", n=7, seed=1) == 7
    rows = [json.loads(x) for x in (tmp_path / "g.jsonl").read_text().splitlines()]
    assert len(rows) == 7 and all(r["prompt"].startswith("Wordle:") for r in rows)
    assert any(r["past_guess_history"] for r in rows)  # not all at turn one
    for r in rows:  # the columns hold the game the prompt shows, and its secret
        history = history_of(r["past_guess_history"])
        assert parse_history(r["prompt"]) == history
        assert all(feedback(r["secret"].lower(), g) == fb for g, fb in history)
        assert r["secret"].lower() not in [g for g, _ in history]  # mid-play: not yet solved
    chat = games.game_rows(7, seed=1, chat=True)
    assert [c["secret"] for c in chat] == [r["secret"] for r in rows]
    assert [parse_history(c["prompt"][1]["content"]) for c in chat] == [
        parse_history(r["prompt"]) for r in rows
    ]


def test_solver_transcripts_only_make_consistent_guesses():
    game = games.solver_game("apple", random.Random(3), top_k=3)
    assert parse_guess(game[-1][1]) == "apple"
    for prompt, completion in game:
        guess = parse_guess(completion)
        assert all(feedback(guess, g) == fb for g, fb in parse_history(prompt))
