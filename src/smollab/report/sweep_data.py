"""A sweep as its report sees it, read from the sweep dir alone (sweep.json, results.csv and each
trial's run dir), so the report can be redrawn at any time, live or afterwards.

A sweep process that was killed leaves results.csv saying `running` for trials nothing runs any
more; when no sweep holds the dir's lock, such a row reads as its run's own final status, else
as `interrupted`, so a report is true whenever it is drawn.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smollab.errors import UserError
from smollab.rundir.atomic import read_json
from smollab.rundir.metric import Metric
from smollab.rundir.runs import FINISHED, SWEEP_LOCK, SWEEP_META, SWEEP_RESULTS, RunView

FAILURES = ("diverged", "degenerate", "stuck", "pruned", "failed", "interrupted")
TEXT_COLUMNS = ("trial", "status", "reason", "run_dir", "role", "baseline_of")  # kept as text


@dataclass
class Trial:
    row: dict[str, Any]
    params: dict[str, Any]
    run_dir: Path
    metrics: list[dict[str, float | None]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.row.get("status") or "?"

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def seed(self) -> int | None:
        s = self.row.get("seed")
        return int(float(s)) if s not in (None, "") else None

    @property
    def is_baseline(self) -> bool:
        """A routing sweep's matched mode=none run, not a point of the space."""
        return self.row.get("role") == "baseline"

    @property
    def is_measure(self) -> bool:
        """A run of the measure step: a best configuration on a seed the search did not use."""
        return self.row.get("role") == "measure"


@dataclass
class SweepData:
    dir: Path
    spec: dict[str, Any]
    metric_label: str
    trials: list[Trial]

    @property
    def space(self) -> list[str]:
        return list(self.spec.get("space", {}))

    @property
    def goal(self) -> str:
        return self.spec.get("metric", {}).get("goal", "min")

    @property
    def command(self) -> str:
        return self.spec.get("command", "?")


def _num(v: str | None) -> Any:
    if v is None or v == "":
        return None
    try:
        f = float(v)
    except ValueError:
        return {"True": True, "False": False, "true": True, "false": False}.get(v, v)
    return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f


def sweep_is_live(sweep_dir: str | Path) -> bool:
    """Whether a sweep process holds the dir's lock now (a shared lock, taken for an instant,
    fails only while one does)."""
    import fcntl

    try:
        f = open(Path(sweep_dir) / SWEEP_LOCK)
    except OSError:
        return False
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


def _settle_stale(t: Trial) -> None:
    """A `running` row whose sweep is gone: the run's own final word, else interrupted."""
    status = t.summary.get("status")
    t.row["status"] = status if status in FINISHED or status == "failed" else "interrupted"
    t.row["reason"] = (
        t.row.get("reason") or t.summary.get("evidence") or ("the sweep process ended while it ran")
    )


def load_sweep(sweep_dir: str | Path) -> SweepData:
    d = Path(sweep_dir)
    meta = read_json(d / SWEEP_META) if (d / SWEEP_META).exists() else {}
    spec = meta.get("spec", {})
    if not (d / SWEEP_RESULTS).exists():
        raise UserError(f"{d} has no {SWEEP_RESULTS}: not a sweep directory (yet)")
    label = Metric(**spec["metric"]).label if spec.get("metric") else "metric"
    space = list(spec.get("space", {}))
    trials = []
    live: bool | None = None
    with open(d / SWEEP_RESULTS, newline="") as f:
        for r in csv.DictReader(f):
            row = {k: _num(v) if k not in TEXT_COLUMNS else v for k, v in r.items()}
            if not space:  # no sweep.json: columns between trial and seed are parameters
                keys = list(r)
                space = keys[1 : keys.index("seed")] if "seed" in keys else []
            params = {k: row.get(k) for k in space}
            run_dir = d / (r.get("run_dir") or "")
            t = Trial(row=row, params=params, run_dir=run_dir)
            view = RunView(run_dir)
            t.metrics = view.metrics()
            try:
                t.summary = view.summary()
            except UserError:
                t.summary = {}
            if t.status == "running":
                live = sweep_is_live(d) if live is None else live
                if not live:
                    _settle_stale(t)
            trials.append(t)
    if not spec:
        spec = {"space": {k: None for k in space}}
    return SweepData(dir=d, spec=spec, metric_label=label, trials=trials)


# ---- values as shown ---------------------------------------------------------------------------


def _f(v: Any) -> str:
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _short(key: str) -> str:
    return key.split(".")[-1]


def beside_baselines(trials: list[Trial]) -> list[Trial]:
    """The trials in order, each routing baseline moved to just after the last trial it serves
    (`baseline_of` holds their trial ids), so a table shows it beside them."""
    rest = [t for t in trials if not t.is_baseline]
    out = list(rest)
    for b in (t for t in trials if t.is_baseline):
        served = set(str(b.row.get("baseline_of") or "").split())
        at = [i for i, t in enumerate(out) if str(t.row.get("trial")) in served]
        out.insert(at[-1] + 1 if at else len(out), b)
    return out


# ---- the LR analysis over a sweep ------------------------------------------------------------


def is_lr_sweep(data: SweepData) -> bool:
    label = data.spec.get("metric", {}).get("name", "")
    if data.spec.get("sampler") == "pbt":  # a member's LR changes along its lineage
        return False
    return "optim.lr" in data.space and "loss" in label and data.goal == "min"


def lr_curves(data: SweepData):
    from smollab.report.lr_analysis import RunCurve

    loss_key = "train_loss" if data.command == "pretrain" else "loss"
    name = data.spec.get("metric", {}).get("name", "val_loss")
    curves = []
    for t in data.trials:
        if (
            t.status in ("running", "interrupted", "failed", "pruned")
            or t.params.get("optim.lr") is None
        ):
            continue
        pts = [
            (r["step"], r[loss_key])
            for r in t.metrics
            if r.get(loss_key) is not None and r.get("step") is not None
        ]
        final = t.row.get(data.metric_label)
        if final is None and t.status != "completed":
            vals = [r[name] for r in t.metrics if r.get(name) is not None]
            final = vals[-1] if vals else None
        curves.append(
            RunCurve(
                name=t.name,
                lr=float(t.params["optim.lr"]),
                seed=t.seed,
                status=t.status,
                steps=[p[0] for p in pts],
                loss=[p[1] for p in pts],
                final=final if isinstance(final, int | float) else None,
                evidence=t.row.get("reason") or t.summary.get("evidence"),
            )
        )
    return curves
