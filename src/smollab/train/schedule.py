"""Learning-rate schedules as pure functions of the step: nothing to save, exact on resume."""

from __future__ import annotations

import math

from smollab.config import OptimConfig


def lr_at(step: int, optim: OptimConfig, max_steps: int) -> float:
    """LR for optimizer step `step` (0-based) of `max_steps`.

    Linear warmup to `lr`, then: cosine to the final LR (`min_lr`, or `lr x min_lr_ratio`)
    reaching it exactly at the last step, constant, or warmup-stable-decay (linear decay to it
    over the final `decay_fraction`).
    """
    last = max(max_steps - 1, 1)
    warmup = min(optim.warmup_steps, last)
    if step < warmup:
        return optim.lr * (step + 1) / warmup
    if optim.schedule == "constant":
        return optim.lr
    end = optim.final_lr
    if optim.schedule == "cosine":
        progress = min((step - warmup) / max(last - warmup, 1), 1.0)
        return end + 0.5 * (optim.lr - end) * (1 + math.cos(math.pi * progress))
    decay_start = max(warmup, round(last * (1 - optim.decay_fraction)))
    if step < decay_start:
        return optim.lr
    progress = min((step - decay_start) / max(last - decay_start, 1), 1.0)
    return optim.lr + (end - optim.lr) * progress


def schedule_note(optim: OptimConfig, max_steps: int) -> str | None:
    """The run log's line when the warmup outlasts the run (a recipe shortened from the command
    line, `train.max_steps=20` on a 50-step warmup): the run goes on, warming up until its end,
    where it reaches `optim.lr`; nothing is left to decay."""
    if optim.warmup_steps and optim.warmup_steps >= max_steps:
        return (
            f"optim.warmup_steps={optim.warmup_steps} is not below train.max_steps="
            f"{max_steps}: the LR warms up over the whole run, reaching optim.lr="
            f"{optim.lr:g} at its end (no {optim.schedule} phase)"
        )
    return None
