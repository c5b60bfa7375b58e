"""The seed experiments' "happy" rewards: the original binary rule and a count (hack detector).

Both match the lower-cased substring "happy", so "Happy", "HAPPY" and "unhappy" all count, as in
the original rule.
"""

from __future__ import annotations

from typing import Any

from smollab.errors import UserError
from smollab.rewards.conversation import plain_text


@plain_text
def happy_binary(
    completions: list[str], prompts: list[str] | None = None, **kwargs: Any
) -> list[float]:
    """1.0 when the lower-cased completion contains "happy", else 0.0 (the seed's original reward)."""
    return [1.0 if "happy" in c.lower() else 0.0 for c in completions]


@plain_text
def happy_count(
    completions: list[str],
    prompts: list[str] | None = None,
    *,
    cap: float | None = None,
    **kwargs: Any,
) -> list[float]:
    """How many times "happy" occurs in the lower-cased completion, at most `cap` when given.

    As a reward it pays for repetition; its main use is as a detector of that hack (a binary
    reward satisfied once, repeated many times), logged beside the reward being optimized.
    """
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int | float) or cap < 0):
        raise UserError(f"happy_count: cap must be a number >= 0 or null, got {cap!r}")
    counts = [float(c.lower().count("happy")) for c in completions]
    if cap is not None:
        counts = [min(n, float(cap)) for n in counts]
    return counts
