"""Structural reward: sentences of a target length (the seed's `sentence_length_10`).

What is measured (n): the MEAN length of the completion's complete sentences. A sentence is a run
of text ending in one or more of `.`, `!`, `?` ("Wait..." and "Really?!" are one sentence each);
the unfinished fragment after the last sentence end (often the cut at max_completion_length) is
left out, so truncation does not punish the sample. A completion with no sentence end is measured
whole. The mean rather than the first sentence, so that every sentence counts (the seed's intent
was "make each sentence about `target` long"); note that a mean of 9 and 11 is 10.

Units:
- "words": pieces between whitespace that hold at least one letter or digit (a lone quote mark
  or dash is not a word).
- "tokens": the completion's token count, `len(completion_ids[i])`, as the caller passes it
  (TRL passes the generated ids, EOS included when one was generated). Per-sentence token
  counts are not known without the tokenizer, so the tokens are shared among the text in
  proportion to non-space characters: n = tokens * chars(complete sentences) / chars(all) /
  sentences. When the completion ends at a sentence end this is exactly tokens / sentences.

per_sentence: true scores each complete sentence on its own length (tokens: its share of the
completion's tokens by non-space characters, as above) and averages the scores, 0.0 without a
complete sentence: small-rl's `sentence_length_10_smooth`, which averaged per-sentence scores (a
mean of 9 and 11 then scores 0.8, not 1.0). That run counted each sentence's tokens with its
tokenizer and let EOS end the last sentence; here the tokens are shared by characters and the
unfinished tail is left out (EOS is not in the text a reward reads).

Modes: "exact" pays 1.0 when n rounded to the nearest whole unit equals `target`, else 0.0;
"smooth" pays max(0, 1 - 0.2 * |target - n|) (full reward at the target, none 5 units away).
"""

from __future__ import annotations

import math
import re
from typing import Any

from smollab.errors import UserError
from smollab.rewards.conversation import plain_text

_SENTENCE = re.compile(r"[^.!?]*[.!?]+")
_WORDLIKE = re.compile(r"\w")
UNITS = ("tokens", "words")
MODES = ("exact", "smooth")


def _word_count(text: str) -> int:
    return sum(1 for piece in text.split() if _WORDLIKE.search(piece))


def _nonspace(text: str) -> int:
    return sum(1 for ch in text if not ch.isspace())


def sentence_lengths(text: str, unit: str, num_tokens: int | None = None) -> list[float]:
    """Each complete sentence's length (tokens: its share of num_tokens by non-space chars)."""
    sentences = [m.group() for m in _SENTENCE.finditer(text) if _word_count(m.group())]
    if unit == "words":
        return [float(_word_count(t)) for t in sentences]
    if num_tokens is None:
        raise UserError("sentence_length: unit 'tokens' needs completion_ids from the caller")
    total = _nonspace(text)
    return [num_tokens * _nonspace(t) / total for t in sentences]


def measured_length(text: str, unit: str, num_tokens: int | None = None) -> float:
    """n for one completion: mean length of its complete sentences (see the module docstring)."""
    sentences = [m for m in _SENTENCE.finditer(text) if _word_count(m.group())]
    if unit == "words":
        if not sentences:
            return float(_word_count(text))
        return sum(_word_count(m.group()) for m in sentences) / len(sentences)
    if num_tokens is None:
        raise UserError("sentence_length: unit 'tokens' needs completion_ids from the caller")
    if not sentences:
        return float(num_tokens)
    total = _nonspace(text)
    complete = _nonspace(text[: sentences[-1].end()])
    return num_tokens * complete / total / len(sentences)


@plain_text
def sentence_length(
    completions: list[str],
    prompts: list[str] | None = None,
    *,
    target: int = 10,
    unit: str = "words",
    mode: str = "smooth",
    per_sentence: bool = False,
    completion_ids: list[list[int]] | None = None,
    **kwargs: Any,
) -> list[float]:
    """Reward sentences of `target` units; n is the mean complete-sentence length, or with
    per_sentence each sentence is scored and the scores averaged (module doc)."""
    if isinstance(target, bool) or not isinstance(target, int) or target < 1:
        raise UserError(f"sentence_length: target must be an integer >= 1, got {target!r}")
    if unit not in UNITS:
        raise UserError(f"sentence_length: unit must be one of {UNITS}, got {unit!r}")
    if mode not in MODES:
        raise UserError(f"sentence_length: mode must be one of {MODES}, got {mode!r}")
    if unit == "tokens":
        if completion_ids is None:
            raise UserError("sentence_length: unit 'tokens' needs completion_ids from the caller")
        if len(completion_ids) != len(completions):
            raise UserError(
                f"sentence_length: {len(completion_ids)} completion_ids "
                f"for {len(completions)} completions"
            )
    if not isinstance(per_sentence, bool):
        raise UserError(
            f"sentence_length: per_sentence must be true or false, got {per_sentence!r}"
        )

    def score(n: float) -> float:
        if mode == "exact":
            return 1.0 if math.floor(n + 0.5) == target else 0.0
        return max(0.0, 1.0 - 0.2 * abs(target - n))

    out = []
    for i, text in enumerate(completions):
        tokens = len(completion_ids[i]) if unit == "tokens" else None
        if per_sentence:
            scores = [score(n) for n in sentence_lengths(text, unit, tokens)]
            out.append(sum(scores) / len(scores) if scores else 0.0)
        else:
            out.append(score(measured_length(text, unit, tokens)))
    return out
