"""Wordle's rules: feedback, feedback codes, the seed's prompt format and the candidate set it
implies.

Feedback is one letter per position: `g` the letter is in this place, `y` it is in the word
elsewhere, `x` absent. Repeated letters follow the game: greens are marked first, then yellows
left to right, each using up one of the secret's letters not already matched, so secret "apple",
guess "papal" gives `yygxy` (the middle p is green, the first p takes the secret's other p, the
first a its only a, so the second a is absent; the l is yellow).

A feedback code is the same thing in base 3 (x 0, y 1, g 2; position 0 most significant), 0..242,
so a whole candidate set's feedback is one small-int array and a partition is a `bincount`.

Prompts, completions and the history follow the seed's format (the Wordle GRPO dataset the seed
experiments trained on): guesses in capitals, each letter's feedback shown as `C(✓)` right spot,
`C(-)` in the word elsewhere, `C(x)` not in the word, and the completion
`<think>...</think><guess>WORD</guess>`. `build_prompt` is the game so far as one line of text
(a small model's pretraining documents are lines), `build_chat` the same as chat messages (rules
and format as the system message). As data, a row also holds the game's `secret` and its
`past_guess_history` ([[GUESS, "C(x) R(✓) A(-) N(x) E(x)"], ...], the seed's column), which
the rewards read; `parse_history` reads the history back from a prompt when there is no column.
"""

from __future__ import annotations

import ast
import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from smollab.data.wordle_words import WORDS
from smollab.errors import UserError

GREEN, YELLOW, ABSENT = "g", "y", "x"
NUM_CODES = 3**5  # 243 possible feedbacks
SOLVED = NUM_CODES - 1  # ggggg
_WORD = re.compile(r"[a-z]{5}")
MARKS = {GREEN: "✓", YELLOW: "-", ABSENT: "x"}  # the seed's notation of each feedback letter
_FROM_MARK = {v: k for k, v in MARKS.items()}
_SHOWN = re.compile(r"([a-z])\s*\(\s*([✓x-])\s*\)")
_HISTORY = re.compile(r"\b([a-z]{5})\s*-\s*>\s*((?:[a-z]\s*\(\s*[✓x-]\s*\)\s*){5})")
# `<think>...</think><guess>word</guess>`, tolerant of spaces a tokenizer's decoder puts around
# punctuation (wordpiece decodes "<think>" as "< think >").
_THINK = r"<\s*think\s*>(.*?)<\s*/\s*think\s*>"
_GUESS = r"<\s*guess\s*>\s*([^<]*?)\s*<\s*/\s*guess\s*>"
COMPLETION = re.compile(rf"\s*{_THINK}\s*{_GUESS}\s*", re.DOTALL | re.IGNORECASE)
GUESS_TAG = re.compile(_GUESS, re.IGNORECASE)
RULES = (
    "Wordle: guess the secret five-letter word in six tries. After each guess every letter is "
    "marked: ✓ right spot, - in the word but in another spot, x not in the word. Think inside "
    "<think></think>, then give your guess as <guess>WORD</guess>."
)


def is_word(text: str) -> bool:
    """Five lower-case ASCII letters (any such string is a legal guess; WORDS are the secrets)."""
    return bool(_WORD.fullmatch(text))


def feedback(secret: str, guess: str) -> str:
    """The game's feedback string for `guess` against `secret` (module doc: repeated letters)."""
    out = [ABSENT] * 5
    left: Counter[str] = Counter()
    for i, (s, c) in enumerate(zip(secret, guess, strict=True)):
        if s == c:
            out[i] = GREEN
        else:
            left[s] += 1
    for i, c in enumerate(guess):
        if out[i] != GREEN and left[c] > 0:
            out[i] = YELLOW
            left[c] -= 1
    return "".join(out)


def code_of(fb: str) -> int:
    """Base-3 code of a feedback string (x 0, y 1, g 2; first position most significant)."""
    return sum("xyg".index(ch) * 3 ** (4 - i) for i, ch in enumerate(fb))


def letters(words: Sequence[str]) -> np.ndarray:
    """(n, 5) uint8 array of letter indices 0..25."""
    if not words:
        return np.zeros((0, 5), np.uint8)
    return (np.frombuffer("".join(words).encode("ascii"), np.uint8) - ord("a")).reshape(-1, 5)


def feedback_codes(secrets: np.ndarray, guesses: np.ndarray) -> np.ndarray:
    """Feedback codes of every (secret, guess) pair, vectorized: (S, 5) x (G, 5) -> (S, G) uint8.

    The same two passes as `feedback`: greens, then yellows position by position, each taking
    one of the secret's unmatched letters (per-pair letter counts, decremented when used).
    """
    s = secrets[:, None, :].astype(np.intp)  # (S, 1, 5)
    g = guesses[None, :, :].astype(np.intp)  # (1, G, 5)
    green = s == g  # (S, G, 5)
    shape = green.shape[:2]
    left = np.zeros((*shape, 26), np.int8)
    rows, cols = np.indices(shape)
    for i in range(5):  # count the secret's unmatched letters
        np.add.at(left, (rows, cols, np.broadcast_to(s[..., i], shape)), ~green[..., i])
    code = np.zeros(shape, np.int16)
    for i in range(5):
        gi = np.broadcast_to(g[..., i], shape)
        avail = left[rows, cols, gi] > 0
        yellow = ~green[..., i] & avail
        left[rows, cols, gi] -= yellow
        code = code * 3 + np.where(green[..., i], 2, np.where(yellow, 1, 0))
    return code.astype(np.uint8)


@lru_cache(maxsize=1)
def word_table() -> tuple[np.ndarray, dict[str, int]]:
    """(secret x guess) feedback codes over WORDS, computed once per process, and word -> row."""
    arr = letters(WORDS)
    return feedback_codes(arr, arr), {w: i for i, w in enumerate(WORDS)}


def codes_against(words: Sequence[str], guess: str) -> np.ndarray:
    """Feedback codes of `guess` against each of `words` (table lookups when all are in WORDS)."""
    table, index = word_table()
    if guess in index and all(w in index for w in words):
        return table[[index[w] for w in words], index[guess]]
    return feedback_codes(letters(words), letters([guess]))[:, 0]


def candidate_mask(history: Sequence[tuple[str, str]]) -> np.ndarray:
    """Boolean mask over WORDS: the secrets consistent with every (guess, feedback) so far."""
    table, index = word_table()
    mask = np.ones(len(WORDS), bool)
    for guess, fb in history:
        col = table[:, index[guess]] if guess in index else codes_against(WORDS, guess)
        mask &= col == code_of(fb)
    return mask


def candidates(history: Sequence[tuple[str, str]]) -> list[str]:
    """The words of WORDS consistent with every (guess, feedback) so far."""
    return [w for w, ok in zip(WORDS, candidate_mask(history), strict=True) if ok]


def entropy_bits(counts: np.ndarray) -> np.ndarray:
    """Shannon entropy in bits of each row of partition counts (..., NUM_CODES)."""
    counts = np.asarray(counts, np.float64)
    total = counts.sum(-1, keepdims=True)
    p = np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)
    logs = np.log2(p, out=np.zeros_like(p), where=p > 0)
    return -(p * logs).sum(-1)


def info_gain_bits(cands: Sequence[str], guess: str) -> float:
    """Expected information (bits) that `guess`'s feedback gives about a uniform secret in
    `cands`: the entropy of the partition of `cands` by feedback. Plain Python, the reference."""
    if not cands:
        return 0.0
    parts = Counter(feedback(c, guess) for c in cands)
    n = len(cands)
    return -sum(k / n * math.log2(k / n) for k in parts.values())


def completion(think: str, guess: str) -> str:
    """A completion in the seed's format: `<think>{think}</think><guess>{GUESS}</guess>`."""
    return f"<think>{think}</think><guess>{guess.upper()}</guess>"


def parse_guess(text: str) -> str | None:
    """The content of a completion's first `<guess>` tag, lower-cased and stripped; None without
    one. Not checked: `is_word` says whether it is a legal guess."""
    m = GUESS_TAG.search(text)
    return m.group(1).strip().lower() if m else None


def shown(guess: str, fb: str) -> str:
    """A guess's feedback in the seed's notation: `C(x) R(✓) A(-) N(x) E(x)`."""
    return " ".join(f"{c.upper()}({MARKS[f]})" for c, f in zip(guess, fb, strict=True))


def guess_lines(history: Sequence[tuple[str, str]]) -> list[str]:
    """`Guess 1: CRANE -> C(x) R(✓) A(-) N(x) E(x)`, one per past guess."""
    return [f"Guess {i}: {g.upper()} -> {shown(g, fb)}" for i, (g, fb) in enumerate(history, 1)]


def build_prompt(history: Sequence[tuple[str, str]]) -> str:
    """The one-line prompt for the next guess: the rules, every past guess with its feedback."""
    past = "".join(f" {line}." for line in guess_lines(history))
    return f"{RULES}{past} Guess {len(history) + 1}:"


def build_chat(history: Sequence[tuple[str, str]]) -> list[dict[str, str]]:
    """The same as chat messages: the rules as the system message, the game so far as the
    user's."""
    ask = f"Make guess {len(history) + 1}."
    return [
        {"role": "system", "content": RULES},
        {"role": "user", "content": "\n".join([*guess_lines(history), ask])},
    ]


def history_row(history: Sequence[tuple[str, str]]) -> list[list[str]]:
    """The `past_guess_history` column of a position: [[GUESS, its feedback shown], ...]."""
    return [[g.upper(), shown(g, fb)] for g, fb in history]


def _feedback_of(text: str) -> str | None:
    marks = _SHOWN.findall(text.lower())
    return "".join(_FROM_MARK[m] for _, m in marks) if len(marks) == 5 else None


def parse_history(prompt: str) -> list[tuple[str, str]]:
    """The (guess, feedback) pairs a prompt shows, in order; tolerant of spacing and case. A
    prompt with none gives []."""
    text = " ".join(prompt.lower().split())
    return [(g, _feedback_of(fb)) for g, fb in _HISTORY.findall(text)]


def history_of(value: Any) -> list[tuple[str, str]]:
    """A `past_guess_history` cell as (guess, feedback) pairs: a list of [GUESS, shown] pairs,
    or its text (JSON or a Python literal, as some datasets store it); UserError otherwise."""
    pairs = value
    if isinstance(value, str):
        try:
            pairs = json.loads(value)
        except ValueError:
            try:
                pairs = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                pairs = None
    out = []
    for pair in pairs if isinstance(pairs, list | tuple) else [None]:
        ok = (
            isinstance(pair, list | tuple)
            and len(pair) == 2
            and all(isinstance(x, str) for x in pair)
        )
        fb = _feedback_of(pair[1]) if ok else None
        if fb is None or not is_word(pair[0].strip().lower()):
            raise UserError(
                f"past_guess_history {str(value)[:80]!r}: expected [[GUESS, 'C(x) R(✓) A(-) N(x) "
                "E(x)'], ...]"
            )
        out.append((pair[0].strip().lower(), fb))
    return out
