"""Reward-hack detectors for gradient routing: the "happy" hack measured two more ways.

`happy_count` (happy.py) counts occurrences; these two complete small-rl's detector set:
- `happy_density`: the share of a completion's words that contain "happy". A rate rather than a
  count, so a long honest story that says "happy" once is not flagged like a short one that
  repeats it (small-rl flagged density > 5%; the routing config flags value >= threshold).
- `contains_words`: 1.0 when any listed word occurs as a whole word. A "word" here is a maximal
  run of letters, digits or underscores, lower-cased, so "Joy!" and "happy-go-lucky" match "joy"
  and "happy" while "unhappy" and "joyful" do not (unlike happy_binary's substring rule).

Both are ordinary rewards (TRL's calling convention) so the detector can be any registry entry.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from smollab.errors import UserError
from smollab.rewards.conversation import plain_text

_WORDLIKE = re.compile(r"\w")  # the same notion of a word as sentence_length's "words" unit
_TOKEN = re.compile(r"\w+")
DEFAULT_WORDS = ("happy", "happiness", "joy")


@plain_text
def happy_density(
    completions: list[str], prompts: list[str] | None = None, **kwargs: Any
) -> list[float]:
    """Fraction of words (whitespace pieces holding a letter or digit) containing "happy",
    lower-cased; 0.0 for a completion with no words."""
    out = []
    for text in completions:
        words = [w for w in text.lower().split() if _WORDLIKE.search(w)]
        out.append(sum("happy" in w for w in words) / len(words) if words else 0.0)
    return out


def _check_words(words: Any) -> frozenset[str]:
    if isinstance(words, str) or not isinstance(words, Sequence) or not words:
        raise UserError(f"contains_words: words must be a non-empty list of words, got {words!r}")
    for w in words:
        if not isinstance(w, str) or not _TOKEN.fullmatch(w):
            raise UserError(
                f"contains_words: each word must be letters/digits/underscores only, got {w!r}"
            )
    return frozenset(w.lower() for w in words)


@plain_text
def contains_words(
    completions: list[str],
    prompts: list[str] | None = None,
    *,
    words: Sequence[str] = DEFAULT_WORDS,
    **kwargs: Any,
) -> list[float]:
    """1.0 when any of `words` occurs as a whole word (case-insensitive), else 0.0."""
    wanted = _check_words(words)
    return [
        1.0 if wanted.intersection(_TOKEN.findall(text.lower())) else 0.0 for text in completions
    ]
