"""What a running trial tells the sweep's pruner, as (step, value) pairs read from its run dir.

A curve pruner (median, asha, threshold, patience) sees the logged metric, each value or, with
`pruner.smooth: k`, the moving mean of the last k logged values: one jittery RL evaluation then
cannot stop a trial that is improving. The Wilcoxon pruner sees instances instead of a curve: each
held-out prompt's reward from the trial's `eval_prompts.jsonl`, paired prompt by prompt with the
best trial's by Optuna's signed-rank test.
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path
from statistics import fmean

from smollab.lab.sweep.spec import Pruner
from smollab.rundir.runs import RunView


def intermediate_values(
    p: Pruner, metric: str, rows: list[dict[str, float | None]], run_dir: Path
) -> list[tuple[int, float]]:
    """Every (step, value) the trial has to report so far, in order (the caller skips steps
    reported already)."""
    if p.type == "wilcoxon":
        return prompt_rewards(RunView(run_dir).eval_prompts())
    return curve(rows, p.metric or metric, p.smooth)


def curve(
    rows: list[dict[str, float | None]], name: str, smooth: int | None
) -> list[tuple[int, float]]:
    """The metric's logged values by step, each the mean of the last `smooth` (1: itself); a
    step without a finite value reports nothing and is not in any window."""
    out: list[tuple[int, float]] = []
    window: deque[float] = deque(maxlen=smooth or 1)
    for r in rows:
        step, v = r.get("step"), r.get(name)
        if step is None or v is None or not math.isfinite(v):
            continue
        window.append(float(v))
        out.append((int(step), fmean(window)))
    return out


def prompt_rewards(evals: list[dict]) -> list[tuple[int, float]]:
    """Each evaluation's per-prompt rewards as instances, step = evaluation number x prompts +
    prompt index. Optuna keeps only the first value reported at a step, so every evaluation's
    prompts need steps of their own; the same (evaluation, prompt) step in two trials is the same
    prompt at the same point of training, which is what the test pairs. A resumed run rewrites its
    later evaluations: the last line of a training step counts."""
    by_step: dict[int, list] = {}
    for e in evals:
        by_step[int(e["step"])] = e["rewards"]
    out: list[tuple[int, float]] = []
    n = len(by_step[min(by_step)]) if by_step else 0
    for j, step in enumerate(sorted(by_step)):
        for i, r in enumerate(by_step[step][:n]):
            if isinstance(r, int | float) and math.isfinite(r):
                out.append((j * n + i, float(r)))
    return out
