"""Known failure rules: the training loops stop or flag on them, and reports show them by name.

Each rule returns `None` or a `Failure` with the evidence a user needs to believe it. The rules
are pure functions of logged values, so a sweep can re-apply them to any run's metrics.csv.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Failure:
    status: str  # "diverged" | "degenerate" | "stuck"
    evidence: str


def diverged_loss(
    loss: float, start_loss: float | None, factor: float, step: int
) -> Failure | None:
    """NaN or inf loss, or loss above `factor` x its starting value."""
    if not math.isfinite(loss):
        return Failure("diverged", f"loss is {loss} at step {step}")
    if start_loss is not None and loss > factor * start_loss:
        return Failure(
            "diverged", f"loss {loss:.3f} at step {step} > {factor:g} x start loss {start_loss:.3f}"
        )
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
        return Failure(
            "degenerate",
            f"unique completions {unique_fraction:.2f} < {limits.min_unique:g} at step {step}",
        )
    if jaccard > limits.max_jaccard:
        return Failure(
            "degenerate",
            f"mean pairwise word Jaccard {jaccard:.2f} > {limits.max_jaccard:g} at step {step}",
        )
    if repetition > limits.max_repetition:
        return Failure(
            "degenerate",
            f"repeated word 4-grams {repetition:.2f} > {limits.max_repetition:g} at step {step}",
        )
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
        return Failure(
            "stuck",
            f"reward {recent:.3f} (mean of last {baseline_steps} steps) not above "
            f"baseline {baseline:.3f} + {margin:g} after {step} steps",
        )
    return None


class RLWatch:
    """The RL rules applied step after step: diverged at once, degenerate after `patience` steps
    in a row, stuck after its grace period. Each status is reported once, the first time."""

    def __init__(self, limits, flags: dict[str, str] | None = None):
        self.limits = limits  # the `failure` config section
        if isinstance(flags, str):  # checkpoints written before the run scaffold saved JSON text
            flags = json.loads(flags)
        self.flags = dict(flags or {})  # status -> evidence, saved with the run's state
        self.streak = 0

    def new_failure(self, row: dict, rewards: Sequence[float], step: int) -> Failure | None:
        fc = self.limits
        failure = diverged_rl(row["kl"], row["loss"], fc.max_kl, step)
        deg = degenerate(row["unique_fraction"], row["jaccard"], row["repetition"], fc, step)
        self.streak = self.streak + 1 if deg else 0
        if failure is None and deg and self.streak >= fc.patience:
            failure = deg
        failure = failure or stuck(
            rewards, fc.baseline_steps, fc.stuck_grace_steps, fc.stuck_margin, step
        )
        if failure is None or failure.status in self.flags:
            return None
        self.flags[failure.status] = failure.evidence
        return failure
