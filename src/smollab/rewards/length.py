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
    completion_ids: list[list[int]] | None = None,
    **kwargs: Any,
) -> list[float]:
    """Reward sentences of `target` units; n is the mean complete-sentence length (module doc)."""
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
    out = []
    for i, text in enumerate(completions):
        n = measured_length(text, unit, len(completion_ids[i]) if unit == "tokens" else None)
        if mode == "exact":
            out.append(1.0 if math.floor(n + 0.5) == target else 0.0)
        else:
            out.append(max(0.0, 1.0 - 0.2 * abs(target - n)))
    return out
