"""Wordle rewards for completions `<think>...</think><guess>word</guess>` (the Wordle task).

Each prompt carries the game so far (`smollab.data.wordle.build_prompt`), so the rewards read the
history from `prompts` and need no secret:
- `wordle_format`: 0.25 each for a `<guess>` tag, the whole completion being exactly think then
  guess (spaces allowed), the guess being five letters, and the guess being in the word list. A
  quarter per property, so a model that gets the tags but not the words still sees a slope.
- `wordle_feedback_use`: the share of earlier (guess, feedback) pairs the guess agrees with, i.e.
  it would get the same feedback if it were the secret; 1.0 on the first turn (nothing to break).
- `wordle_info_gain`: the entropy in bits of the partition of the candidates (the words of the
  list consistent with all feedback) by the guess's feedback, divided by log2 of their number:
  1.0 when every candidate would get distinct feedback. One candidate left: 1.0 for guessing it.
A guess that is not five letters scores 0 on the last two.

`wordle_info_gain` is vectorized: candidates come from a precomputed word x word feedback-code
table, computed once per distinct prompt (GRPO's generations share one), and the partitions of
all of a prompt's guesses are one `bincount`. `info_gain_plain` is the same in plain Python, the
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


def _prompts(name: str, prompts: Sequence[str] | None, n: int) -> Sequence[str]:
    if prompts is None or len(prompts) != n:
        got = "none" if prompts is None else len(prompts)
        raise UserError(f"{name}: needs one prompt per completion ({n}), got {got}")
    return prompts


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
    completions: list[str], prompts: list[str] | None = None, **kwargs: Any
) -> list[float]:
    """Share of the prompt's earlier feedback the guess is consistent with (1.0 on turn one)."""
    prompts = _prompts("wordle_feedback_use", prompts, len(completions))
    out = []
    for text, prompt in zip(completions, prompts, strict=True):
        guess = parse_guess(text)
        if guess is None or not is_word(guess):
            out.append(0.0)
            continue
        history = parse_history(prompt)
        if not history:
            out.append(1.0)
            continue
        out.append(sum(feedback(guess, g) == fb for g, fb in history) / len(history))
    return out


def _normalized(bits: float, n: int) -> float:
    return bits / math.log2(n)


@plain_text
def wordle_info_gain(
    completions: list[str], prompts: list[str] | None = None, **kwargs: Any
) -> list[float]:
    """The guess's expected information over the prompt's candidates / log2(candidates)."""
    prompts = _prompts("wordle_info_gain", prompts, len(completions))
    table, index = word_table()
    by_prompt: dict[str, list[int]] = {}
    guesses = [parse_guess(t) for t in completions]
    for i, (guess, prompt) in enumerate(zip(guesses, prompts, strict=True)):
        if guess is not None and is_word(guess):
            by_prompt.setdefault(prompt, []).append(i)
    out = [0.0] * len(completions)
    for prompt, rows in by_prompt.items():
        cand = np.flatnonzero(candidate_mask(parse_history(prompt)))
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


def info_gain_plain(completions: list[str], prompts: list[str]) -> list[float]:
    """`wordle_info_gain` in plain Python (string feedback per candidate, no cache, no numpy)."""
    out = []
    for text, prompt in zip(
        completions, _prompts("info_gain_plain", prompts, len(completions)), strict=True
    ):
        guess = parse_guess(text)
        history = parse_history(prompt)
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
