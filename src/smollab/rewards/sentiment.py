"""Lexicon sentiment reward: VADER's compound score, from the lexicon vaderSentiment ships.

No download, no model: the analyzer is built once per process, on first use (about 0.1 s).
"""

from __future__ import annotations

import functools
from typing import Any

from smollab.errors import UserError
from smollab.rewards.conversation import plain_text


@functools.cache
def _analyzer() -> Any:
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


@plain_text
def sentiment(
    completions: list[str],
    prompts: list[str] | None = None,
    *,
    rescale: bool = False,
    **kwargs: Any,
) -> list[float]:
    """VADER compound score of each completion, in [-1, 1]; with `rescale`, (score + 1) / 2 in [0, 1].

    The completion alone is scored, not the prompt. An empty completion scores 0 (0.5 rescaled).
    """
    if not isinstance(rescale, bool):
        raise UserError(f"sentiment: rescale must be true or false, got {rescale!r}")
    analyzer = _analyzer()
    scores = [float(analyzer.polarity_scores(c)["compound"]) for c in completions]
    if rescale:
        scores = [(s + 1.0) / 2.0 for s in scores]
    return scores
