"""What a sweep's trials resulted in: a run's metric (`metric_value`) and summary, and the
sweep's results.csv: one row per trial run directory (the latest study trial of each, a retry
superseding the failed one), with its point, seed, status, metric, steps, wall time and, when it
did not complete, the reason; routing baselines' rows follow their routed trials'.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from smollab.errors import UserError
from smollab.lab.sweep.spec import SweepSpec
from smollab.rundir.atomic import atomic_write_text
from smollab.rundir.runs import SWEEP_RESULTS, RunView

if TYPE_CHECKING:
    from smollab.lab.sweep.trials import Trials


class Live(NamedTuple):
    """A running trial's progress so far, for its results.csv row."""

    steps: int | None
    wall_s: float
    start_s: float | None = None  # launch to first logged step, once seen


def metric_value(rows: list[dict[str, float | None]], spec: SweepSpec) -> float | None:
    m = spec.metric
    pts = [
        (r["step"], r[m.name])
        for r in rows
        if r.get(m.name) is not None and r.get("step") is not None
    ]
    if m.at_step is not None:
        if not rows or max(r["step"] or 0 for r in rows) < m.at_step:
            return None
        pts = [p for p in pts if p[0] <= m.at_step]
    if not pts:
        return None
    vals = [v for _, v in pts]
    if m.reduce == "best":
        finite = [v for v in vals if math.isfinite(v)]
        if not finite:
            return vals[-1]
        return min(finite) if m.goal == "min" else max(finite)
    return vals[-1]


def read_summary(run_dir: Path) -> dict[str, Any]:
    """A trial's summary.json; empty while missing or unreadable."""
    try:
        return RunView(run_dir).summary()
    except (UserError, OSError):
        return {}


def result_rows(trials: Trials, live: Mapping[str, Live]) -> list[dict[str, Any]]:
    """The study trials' rows (this sweep dir's own), sorted by run directory; `live` holds the
    running trials' progress."""
    from optuna.trial import TrialState

    spec, prefix = trials.spec, trials.trials_dir.name
    rows = []
    for name, t in sorted(trials.latest_by_dir().items(), key=lambda kv: kv[0]):
        params, seed = trials.point(t)
        ua = t.user_attrs
        now = live.get(name)
        if t.state == TrialState.RUNNING:
            status = "running" if now is not None else ua.get("status") or "interrupted"
        elif t.state == TrialState.FAIL:
            status = "failed"
        else:
            status = ua.get("status", t.state.name.lower())
        steps = now.steps if now is not None else ua.get("steps")
        wall = now.wall_s if now is not None else ua.get("wall_s")
        start = now.start_s if now is not None else ua.get("start_s")
        value = t.value if t.state == TrialState.COMPLETE else None
        row = {
            "trial": name[:3] if name[:3].isdigit() else t.number,
            **params,
            "seed": seed,
            "status": status,
            spec.metric.label: value,
            "steps": steps,
            "wall_s": None if wall is None else round(wall, 1),
            "start_s": None if start is None else round(start, 2),
            "reason": ua.get("reason") if status not in ("running", "completed") else None,
            "run_dir": f"{prefix}/{name}",
        }
        if spec.pbt is not None:  # the lineage (smollab.lab.sweep.pbt)
            row.update(
                member=ua.get("pbt_member"),
                generation=ua.get("pbt_generation"),
                parent=ua.get("parent"),
                parent_trial=ua.get("parent_trial"),
                parent_step=ua.get("parent_step"),
                perturbed=" ".join(f"{k}*{f:g}" for k, f in (ua.get("perturbed") or {}).items())
                or None,
            )
        if trials.baselines.enabled:
            routed = any(name in b.of for b in trials.baselines.by_name.values())
            row.update(role="routed" if routed else None, baseline_of=None)
        rows.append(row)
    return rows


def write_results_csv(trials: Trials, live: Mapping[str, Live]) -> None:
    spec = trials.spec
    fields = [
        "trial",
        *spec.param_keys(),
        "seed",
        "status",
        spec.metric.label,
        "steps",
        "wall_s",
        "start_s",
        "reason",
        "run_dir",
    ]
    if spec.pbt is not None:
        fields += ["member", "generation", "parent", "parent_trial", "parent_step", "perturbed"]
    if trials.baselines.enabled or trials.measure.by_name:
        fields += ["role", "baseline_of"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in trials.rows(live):
        w.writerow({k: ("" if v is None else _csv(v)) for k, v in r.items()})
    atomic_write_text(trials.dir / SWEEP_RESULTS, buf.getvalue())


def _csv(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return v
