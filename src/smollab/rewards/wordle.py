"""Wordle rewards for completions `<think>...</think><guess>WORD</guess>` (the Wordle task, in the
seed's format: `smollab.data.wordle`).

A row of the task as data holds the game's `secret` and its `past_guess_history` (the seed's
columns): the rewards read the history from that column, and only for prompts without it (a text
file of prompts) from the prompt itself (`parse_history`):
- `wordle_format`: 0.25 each for a `<guess>` tag, the whole completion being exactly think then
  guess (spaces allowed), the guess being five letters, and the guess being in the word list. A
  quarter per property, so a model that gets the tags but not the words still sees a slope.
- `wordle_feedback_use`: the share of earlier (guess, feedback) pairs the guess agrees with, i.e.
  it would get the same feedback if it were the secret; 1.0 on the first turn (nothing to break).
- `wordle_info_gain`: the entropy in bits of the partition of the candidates (the words of the
  list consistent with all feedback) by the guess's feedback, divided by log2 of their number:
  1.0 when every candidate would get distinct feedback. One candidate left: 1.0 for guessing it.
- `wordle_solved`: 1.0 when the guess is the `secret` column (it needs the column: a prompt does
  not tell the secret).
A guess that is not five letters scores 0 on the last three.

`wordle_info_gain` is vectorized: candidates come from a precomputed word x word feedback-code
table, computed once per distinct history (GRPO's generations share one), and the partitions of
all of a history's guesses are one `bincount`. `info_gain_plain` is the same in plain Python, the
reference for tests and for benchmarks/wordle_rewards.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from smollab.data.wordle import (
    COMPLETION,
    NUM_CODES,
    WORDS,
    candidate_mask,
    entropy_bits,
    feedback,
    feedback_codes,
    history_of,
    info_gain_bits,
    is_word,
    letters,
    parse_guess,
    parse_history,
    word_table,
)
from smollab.errors import UserError
from smollab.rewards.conversation import plain_text

_IN_LIST = frozenset(WORDS)


def _histories(
    name: str, prompts: Sequence[str] | None, column: Sequence[Any] | None, n: int
) -> list[list[tuple[str, str]]]:
    """Each completion's game so far: the `past_guess_history` column, else parsed from its
    prompt."""
    if column is not None:
        return [history_of(v) for v in column]
    if prompts is None or len(prompts) != n:
        got = "none" if prompts is None else len(prompts)
        raise UserError(
            f"{name}: needs one prompt per completion ({n}), got {got} (or a "
            "past_guess_history column)"
        )
    return [parse_history(p) for p in prompts]


@plain_text
def wordle_format(
    completions: list[str], prompts: list[str] | None = None, **kwargs: Any
) -> list[float]:
    """A quarter each: guess tag, exact think-then-guess form, five letters, a listed word."""
    out = []
    for text in completions:
        guess = parse_guess(text)
        if guess is None:
            out.append(0.0)
            continue
        parts = (True, COMPLETION.fullmatch(text) is not None, is_word(guess), guess in _IN_LIST)
        out.append(0.25 * sum(parts))
    return out


@plain_text
def wordle_feedback_use(
    completions: list[str],
    prompts: list[str] | None = None,
    past_guess_history: list[Any] | None = None,
    **kwargs: Any,
) -> list[float]:
    """Share of the earlier feedback the guess is consistent with (1.0 on turn one)."""
    histories = _histories("wordle_feedback_use", prompts, past_guess_history, len(completions))
    out = []
    for text, history in zip(completions, histories, strict=True):
        guess = parse_guess(text)
        if guess is None or not is_word(guess):
            out.append(0.0)
            continue
        if not history:
            out.append(1.0)
            continue
        out.append(sum(feedback(guess, g) == fb for g, fb in history) / len(history))
    return out


def _normalized(bits: float, n: int) -> float:
    return bits / math.log2(n)


@plain_text
def wordle_info_gain(
    completions: list[str],
    prompts: list[str] | None = None,
    past_guess_history: list[Any] | None = None,
    **kwargs: Any,
) -> list[float]:
    """The guess's expected information over the game's candidates / log2(candidates)."""
    histories = _histories("wordle_info_gain", prompts, past_guess_history, len(completions))
    table, index = word_table()
    by_history: dict[tuple, list[int]] = {}
    guesses = [parse_guess(t) for t in completions]
    for i, (guess, history) in enumerate(zip(guesses, histories, strict=True)):
        if guess is not None and is_word(guess):
            by_history.setdefault(tuple(history), []).append(i)
    out = [0.0] * len(completions)
    for history, rows in by_history.items():
        cand = np.flatnonzero(candidate_mask(history))
        n = len(cand)
        if n == 0:  # feedback no listed word fits: nothing to gain
            continue
        if n == 1:
            for i in rows:
                out[i] = 1.0 if guesses[i] == WORDS[cand[0]] else 0.0
            continue
        codes = np.empty((len(rows), n), np.intp)
        for k, i in enumerate(rows):
            g = guesses[i]
            if g in index:
                codes[k] = table[cand, index[g]]
            else:  # a five-letter non-word still partitions the candidates
                codes[k] = feedback_codes(letters([WORDS[c] for c in cand]), letters([g]))[:, 0]
        offsets = codes + NUM_CODES * np.arange(len(rows))[:, None]
        counts = np.bincount(offsets.ravel(), minlength=NUM_CODES * len(rows))
        bits = entropy_bits(counts.reshape(len(rows), NUM_CODES))
        for k, i in enumerate(rows):
            out[i] = _normalized(float(bits[k]), n)
    return out


@plain_text
def wordle_solved(
    completions: list[str], secret: list[str], prompts: list[str] | None = None, **kwargs: Any
) -> list[float]:
    """1.0 when the guess is the game's secret (the `secret` column), else 0.0."""
    if len(secret) != len(completions):
        raise UserError(f"wordle_solved: {len(secret)} secrets for {len(completions)} completions")
    return [
        1.0 if parse_guess(t) == str(s).strip().lower() else 0.0
        for t, s in zip(completions, secret, strict=True)
    ]


# validate_specs' dry call: the secret is a column every row of the task holds.
wordle_solved.probe = {  # type: ignore[attr-defined]
    "completions": ["<think>x</think><guess>APPLE</guess>"],
    "prompts": ["Guess 1:"],
    "completion_ids": [[1, 2, 3]],
    "secret": ["APPLE"],
}


def info_gain_plain(completions: list[str], prompts: list[str]) -> list[float]:
    """`wordle_info_gain` in plain Python (string feedback per candidate, no cache, no numpy)."""
    out = []
    for text, history in zip(
        completions, _histories("info_gain_plain", prompts, None, len(completions)), strict=True
    ):
        guess = parse_guess(text)
        cands = (
            [w for w in WORDS if all(feedback(w, g) == fb for g, fb in history)]
            if guess is not None and is_word(guess)
            else []
        )
        if not cands:
            out.append(0.0)
        elif len(cands) == 1:
            out.append(1.0 if guess == cands[0] else 0.0)
        else:
            out.append(_normalized(info_gain_bits(cands, guess), len(cands)))
    return out
