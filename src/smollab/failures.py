"""Known failure rules, shared by the training loops (which stop or flag) and the lab (which reports).

Each rule returns `None` or a `Failure` with the evidence a user needs to believe it. The rules
are pure functions of logged values, so a sweep can re-apply them to any run's metrics.csv.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Failure:
    status: str  # "diverged" | "degenerate" | "stuck"
    evidence: str


def diverged_loss(loss: float, start_loss: float | None, factor: float, step: int) -> Failure | None:
    """NaN or inf loss, or loss above `factor` x its starting value."""
    if not math.isfinite(loss):
        return Failure("diverged", f"loss is {loss} at step {step}")
    if start_loss is not None and loss > factor * start_loss:
        return Failure("diverged", f"loss {loss:.3f} at step {step} > {factor:g} x start loss "
                                   f"{start_loss:.3f}")  # fmt: skip
    return None


def diverged_rl(kl: float, loss: float, max_kl: float, step: int) -> Failure | None:
    """NaN or inf in the objective, or KL to the reference exploding past `max_kl` nats/token."""
    for name, v in (("loss", loss), ("kl", kl)):
        if not math.isfinite(v):
            return Failure("diverged", f"{name} is {v} at step {step}")
    if kl > max_kl:
        return Failure("diverged", f"kl {kl:.3f} at step {step} > {max_kl:g}")
    return None


def degenerate(
    unique_fraction: float, jaccard: float, repetition: float, limits, step: int
) -> Failure | None:
    """Collapsed diversity: high reward from templates is a failure, not a success.

    `limits` carries min_unique, max_jaccard and max_repetition (the `failure` config section).
    """
    if unique_fraction < limits.min_unique:
        return Failure("degenerate", f"unique completions {unique_fraction:.2f} < "
                                     f"{limits.min_unique:g} at step {step}")  # fmt: skip
    if jaccard > limits.max_jaccard:
        return Failure("degenerate", f"mean pairwise word Jaccard {jaccard:.2f} > "
                                     f"{limits.max_jaccard:g} at step {step}")  # fmt: skip
    if repetition > limits.max_repetition:
        return Failure("degenerate", f"repeated word 4-grams {repetition:.2f} > "
                                     f"{limits.max_repetition:g} at step {step}")  # fmt: skip
    return None


def stuck(
    rewards: Sequence[float], baseline_steps: int, grace_steps: int, margin: float, step: int
) -> Failure | None:
    """Reward not above its first-steps baseline plus `margin` once the grace period is over.

    `rewards` holds one mean reward per step from the start; the recent level is the mean of the
    last `baseline_steps` values so one lucky batch does not count as progress.
    """
    if step < grace_steps or len(rewards) < 2 * baseline_steps:
        return None
    baseline = sum(rewards[:baseline_steps]) / baseline_steps
    recent = sum(rewards[-baseline_steps:]) / baseline_steps
    if recent <= baseline + margin:
        return Failure("stuck", f"reward {recent:.3f} (mean of last {baseline_steps} steps) not above "
                                f"baseline {baseline:.3f} + {margin:g} after {step} steps")  # fmt: skip
    return None
