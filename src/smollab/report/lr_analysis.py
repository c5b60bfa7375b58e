"""The learning-rate sweep analysis: each run's pattern, the best LR, the first diverging LR.

Pure functions of loss curves, so they are tested on synthetic curves and re-applied to any
sweep directory by `smollab report`.

Patterns (the first that applies):
- diverged: the run says so (status `diverged`), or its loss is NaN/inf, or it ends above its start.
- unstable: the loss climbs back more than `spike_tol` (relative) above its running minimum,
  after the first 10% of the logged points; or, with a larger LR than the
  best one, it ends clearly worse than the best run (too large a step: noisy or stalled).
- too slow: with a smaller LR than the best one, it ends clearly worse than the best run (or,
  given a target loss, misses it): the LR was too small for the budget.
- converged: otherwise (a target loss, when given, is met).
"Clearly worse" means a final loss more than `slow_tol` (relative) above the best LR's mean.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

PATTERNS = ("converged", "too slow", "unstable", "diverged")

DEFINITIONS = {
    "best_lr": "the learning rate with the lowest mean final loss over its seeds, among "
    "learning rates none of whose runs diverged",
    "first_diverging_lr": "the smallest learning rate at which at least one run diverged",
    "ratio": "first diverging LR / best LR: how far the best learning rate sits below the "
    "smallest one that blew up, in this sweep's grid (known only to within one grid "
    "step). It is a practical safety margin, not the 'edge of stability' of Cohen et "
    "al. (2021), which concerns the sharpness (top Hessian eigenvalue) rising to 2/lr.",
}


@dataclass
class RunCurve:
    name: str
    lr: float
    seed: int | None
    status: str | None
    steps: list[float]
    loss: list[float]  # the training-loss curve, in step order
    final: float | None = None  # the ranking loss (e.g. final val loss); default: last of `loss`
    evidence: str | None = None

    def final_loss(self) -> float | None:
        if self.final is not None:
            return self.final
        return self.loss[-1] if self.loss else None


@dataclass
class RunPattern:
    name: str
    lr: float
    seed: int | None
    pattern: str
    why: str
    final: float | None
    met_target: bool | None = None


@dataclass
class LRAnalysis:
    best_lr: float | None
    best_final: float | None
    first_diverging_lr: float | None
    largest_stable_lr: float | None
    ratio: float | None
    runs: list[RunPattern]
    per_lr: list[dict] = field(default_factory=list)
    target_loss: float | None = None
    definitions: dict = field(default_factory=lambda: dict(DEFINITIONS))

    def to_dict(self) -> dict:
        return asdict(self)


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def is_diverged(c: RunCurve) -> str | None:
    """Why the run counts as diverged, or None."""
    if c.status == "diverged":
        return c.evidence or "the run stopped itself as diverged"
    bad = next((i for i, v in enumerate(c.loss) if not math.isfinite(v)), None)
    if bad is not None:
        return f"loss is {c.loss[bad]} at step {c.steps[bad]:g}"
    final = c.final_loss()
    if final is not None and not math.isfinite(final):
        return f"final loss is {final}"
    if len(c.loss) >= 2 and c.loss[-1] > c.loss[0]:
        return f"loss ends at {c.loss[-1]:.3f}, above its start {c.loss[0]:.3f}"
    return None


def spike(c: RunCurve) -> tuple[float, float | None]:
    """Largest climb of the loss above its running minimum, relative to that minimum (0.25 =
    25% above the best loss seen so far), ignoring the first 10% of the logged points; and the
    step where it happens."""
    if len(c.loss) < 4:
        return 0.0, None
    skip = max(1, len(c.loss) // 10)
    run_min, worst, at = c.loss[0], 0.0, None
    for i, v in enumerate(c.loss):
        if i >= skip and run_min > 0 and (v - run_min) / run_min > worst:
            worst, at = (v - run_min) / run_min, c.steps[i]
        run_min = min(run_min, v)
    return worst, at


def classify(
    c: RunCurve,
    best_lr: float | None,
    best_final: float | None,
    target_loss: float | None = None,
    spike_tol: float = 0.1,
    slow_tol: float = 0.05,
) -> tuple[str, str]:
    why = is_diverged(c)
    if why:
        return "diverged", why
    frac, at = spike(c)
    if frac > spike_tol:
        return "unstable", f"loss climbs {100 * frac:.0f}% above its running minimum at step {at:g}"
    final = c.final_loss()
    if final is None:
        return "too slow", "no loss logged"
    if target_loss is not None:
        if final <= target_loss:
            return "converged", f"final loss {final:.4f} meets the target {target_loss:g}"
        side = "unstable" if best_lr is not None and c.lr > best_lr else "too slow"
        return side, f"final loss {final:.4f} misses the target {target_loss:g}"
    if best_final is None or best_lr is None:
        return "converged", f"final loss {final:.4f}"
    gap = (final - best_final) / max(abs(best_final), 1e-12)
    if gap > slow_tol and c.lr < best_lr:
        trend = _trend(c)
        return "too slow", f"ends {100 * gap:.1f}% above the best LR's loss{trend}"
    if gap > slow_tol and c.lr > best_lr:
        return "unstable", f"ends {100 * gap:.1f}% above the best LR's loss at a larger LR"
    return "converged", f"final loss {final:.4f} (within {100 * slow_tol:.0f}% of the best)"


def _trend(c: RunCurve) -> str:
    """', still falling' when the last fifth of the curve is still going down clearly."""
    n = len(c.loss)
    if n < 5:
        return ""
    tail = c.loss[-max(2, n // 5) :]
    drop = c.loss[0] - min(c.loss)
    if drop > 0 and (tail[0] - tail[-1]) > 0.02 * drop:
        return ", still falling at the end"
    return ""


def analyze(
    curves: list[RunCurve],
    target_loss: float | None = None,
    spike_tol: float = 0.1,
    slow_tol: float = 0.05,
) -> LRAnalysis:
    by_lr: dict[float, list[RunCurve]] = {}
    for c in curves:
        by_lr.setdefault(c.lr, []).append(c)
    per_lr = []
    for lr in sorted(by_lr):
        runs = by_lr[lr]
        n_div = sum(1 for c in runs if is_diverged(c))
        finals = [c.final_loss() for c in runs if not is_diverged(c) and _finite(c.final_loss())]
        per_lr.append(
            {
                "lr": lr,
                "runs": len(runs),
                "diverged": n_div,
                "mean": statistics.fmean(finals) if finals else None,
                "std": statistics.stdev(finals) if len(finals) > 1 else (0.0 if finals else None),
                "n": len(finals),
            }
        )
    clean = [p for p in per_lr if p["diverged"] == 0 and p["mean"] is not None]
    pool = clean or [p for p in per_lr if p["mean"] is not None]
    best = min(pool, key=lambda p: p["mean"]) if pool else None
    best_lr = best["lr"] if best else None
    best_final = best["mean"] if best else None
    div_lrs = [p["lr"] for p in per_lr if p["diverged"]]
    first_div = min(div_lrs) if div_lrs else None
    stable = [
        p["lr"] for p in per_lr if not p["diverged"] and (first_div is None or p["lr"] < first_div)
    ]
    largest_stable = max(stable) if stable else None
    ratio = first_div / best_lr if first_div is not None and best_lr else None

    runs = []
    for c in sorted(curves, key=lambda c: (c.lr, c.seed if c.seed is not None else -1, c.name)):
        pattern, why = classify(c, best_lr, best_final, target_loss, spike_tol, slow_tol)
        final = c.final_loss()
        met = None
        if target_loss is not None:
            met = bool(pattern != "diverged" and _finite(final) and final <= target_loss)
        runs.append(
            RunPattern(c.name, c.lr, c.seed, pattern, why, final if _finite(final) else None, met)
        )
    for p in per_lr:
        p["patterns"] = sorted({r.pattern for r in runs if r.lr == p["lr"]}, key=PATTERNS.index)
        if target_loss is not None:
            p["met_target"] = p["mean"] is not None and p["mean"] <= target_loss
    return LRAnalysis(
        best_lr=best_lr,
        best_final=best_final,
        first_diverging_lr=first_div,
        largest_stable_lr=largest_stable,
        ratio=ratio,
        runs=runs,
        per_lr=per_lr,
        target_loss=target_loss,
    )


def summary_lines(a: LRAnalysis) -> list[str]:
    """The analysis as markdown bullet lines (the report's LR section)."""
    lines = []
    if a.best_lr is not None:
        lines.append(f"- **Best LR: {a.best_lr:g}** (mean final loss {a.best_final:.4f})")
    else:
        lines.append("- **Best LR: none** (no run finished without diverging)")
    if a.first_diverging_lr is not None:
        lines.append(f"- **First diverging LR: {a.first_diverging_lr:g}**")
    else:
        top = max((p["lr"] for p in a.per_lr), default=None)
        lines.append(
            f"- **First diverging LR: none** up to {top:g} (extend the grid upwards to find it)"
            if top is not None
            else "- **First diverging LR: none**"
        )
    if a.ratio is not None:
        lines.append(f"- **Ratio (first diverging LR / best LR): {a.ratio:.3g}**")
    elif a.best_lr is not None and a.per_lr:
        top = max(p["lr"] for p in a.per_lr)
        lines.append(f"- **Ratio: above {top / a.best_lr:.3g}** (no run diverged)")
    if a.largest_stable_lr is not None:
        lines.append(
            f"- Largest LR below the first diverging one that did not diverge: "
            f"{a.largest_stable_lr:g}"
        )
    if a.target_loss is not None:
        met = [p["lr"] for p in a.per_lr if p.get("met_target")]
        lines.append(
            f"- Target loss {a.target_loss:g}: "
            + (f"met at LR {', '.join(f'{x:g}' for x in met)}" if met else "**not met** by any LR")
        )
    return lines
