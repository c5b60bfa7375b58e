"""The trials of a sweep: which one runs next, what a previous sweep process left behind, how a
child's logged values feed the pruner, and how its ending is told to Optuna.

Each trial is one child run with its own run directory `<dir>/trials/<NNN>-<short params>-s<seed>`,
and that directory is the trial's identity: a rerun of the same command finds finished runs
(kept), interrupted ones (continued from their checkpoints by the child's `run.resume=auto`) and
failed ones (retried in place).

How a child's ending maps to Optuna (status is always kept as the user attribute `status`):

| child status                  | Optuna state | why |
|-------------------------------|--------------|-----|
| completed                     | COMPLETE     | the metric (final value, or at `at_step`) |
| diverged, degenerate, stuck   | PRUNED       | a result for the report, but samplers must steer away from it: TPE ranks pruned trials below every complete one, while FAIL trials are ignored (and would be proposed again) |
| pruned (by the sweep's pruner)| PRUNED       | stopped by SIGINT, then `set_status(run, "pruned", evidence)` |
| failed (crash, no metric)     | FAIL         | nothing was learned about the point; retried on a rerun |
| interrupted (sweep stopped)   | RUNNING      | left open: the rerun continues the same trial and run dir |
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import time
from pathlib import Path
from typing import Any

from smollab.lab import children as ch
from smollab.lab.spec import SweepSpec
from smollab.lab.sweep_study import distributions
from smollab.runs import FINISHED, set_status

RESULT_FIELDS = ["trial", "status", "seed", "steps", "wall_s", "reason", "run_dir"]
FAILURE_STATUSES = ("diverged", "degenerate", "stuck")


# ---- reading a finished run ---------------------------------------------------------------------


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


def last_log_line(run_dir: Path) -> str:
    """The child's last words (an error line or the end of a traceback)."""
    try:
        lines = [
            ln.strip() for ln in (run_dir / ch.CHILD_LOG).read_text(errors="replace").splitlines()
        ]
    except OSError:
        return "no child log"
    lines = [ln for ln in lines if ln and not ln.startswith("$ ")]
    errors = [ln for ln in lines if ln.startswith("smollab: error:") or "Error" in ln.split(":")[0]]
    return (errors or lines or ["child exited without output"])[-1][:300]


def _summary(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / "summary.json"
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _reported_steps(trial) -> list[int]:
    with contextlib.suppress(Exception):
        return list(trial.storage.get_trial(trial._trial_id).intermediate_values)
    return []


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


# ---- trial names ------------------------------------------------------------------------------


def short_key(key: str, keys: list[str]) -> str:
    last = key.split(".")[-1]
    clashes = [k for k in keys if k.split(".")[-1] == last]
    return last if len(clashes) == 1 else key.replace(".", "_")


def fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def trial_name(number: int, params: dict[str, Any], seed: int) -> str:
    keys = list(params)
    parts = [f"{short_key(k, keys)}{fmt_value(v)}" for k, v in params.items()]
    name = "-".join([f"{number:03d}", *parts, f"s{seed}"])
    name = re.sub(r"[^A-Za-z0-9._=+-]", "_", name)
    if len(name) > 80:
        name = name[:72] + "-s" + str(seed)
    return name


# ---- the trials of a sweep ----------------------------------------------------------------


class TrialBook:
    """Trial bookkeeping, a base of `smollab.lab.sweep.Sweep`, which holds the state it reads and
    writes (spec, study, trials_dir, running, resume_queue, stopping, concurrency, abort,
    fails_in_a_row, successes) and provides `_say`, `write_results` and `write_report`."""

    def _point(self, t) -> tuple[dict[str, Any], int]:
        params = {k: t.params[k] for k in self.spec.space if k in t.params}
        seed = t.params.get("seed", t.user_attrs.get("seed", self.spec.seeds[0]))
        return params, int(seed)

    def _run_dir_name(self, t) -> str:
        name = t.user_attrs.get("run_dir")
        if name:
            return name
        params, seed = self._point(t)
        return trial_name(t.number, params, seed)

    def _latest_by_dir(self) -> dict[str, Any]:
        from optuna.trial import TrialState

        latest: dict[str, Any] = {}
        for t in self.study.get_trials(deepcopy=False):
            if t.state != TrialState.WAITING:
                latest[self._run_dir_name(t)] = t
        return latest

    def _fresh_count(self) -> int:
        """Trials that count towards the grid or n_trials x seeds (retries do not)."""
        return sum(
            1 for t in self.study.get_trials(deepcopy=False) if not t.user_attrs.get("retry")
        )

    def _waiting(self) -> bool:
        from optuna.trial import TrialState

        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def _settle_previous(self) -> None:
        """After a previous parent: finished runs are recorded, open ones queued to continue,
        failed ones enqueued again (same run dir) when `retry_failed`."""
        from optuna.trial import TrialState

        running_dirs = set()
        for name, t in self._latest_by_dir().items():
            run_dir = self.trials_dir / name
            if t.state == TrialState.RUNNING:
                if ch.reap_stale(run_dir, self.spec.stop_timeout_s):
                    self._say(f"trial {name}: stopped a child left by the previous sweep process")
                summary = _summary(run_dir)
                status = summary.get("status")
                if status in FINISHED:
                    trial = self._attach(t)
                    wall = float(t.user_attrs.get("wall_s", 0.0))
                    self._record(trial, run_dir, name, status, summary, code=0, wall=wall)
                else:
                    self.resume_queue.append(t)
                    running_dirs.add(name)
            elif t.state == TrialState.FAIL and self.spec.retry_failed:
                params, seed = self._point(t)
                fixed = dict(params)
                if self.spec.sampler == "grid":
                    fixed["seed"] = seed
                self.study.enqueue_trial(fixed, user_attrs={"run_dir": name, "seed": seed, "retry": True,
                                                            "wall_s": t.user_attrs.get("wall_s", 0.0)})  # fmt: skip
                self._say(
                    f"trial {name}: failed before ({t.user_attrs.get('reason', '?')}); retrying"
                )
        if self.resume_queue:
            self._say(
                f"resuming {len(self.resume_queue)} unfinished trial(s) from their checkpoints"
            )

    def _attach(self, frozen):
        import optuna

        return optuna.trial.Trial(self.study, frozen._trial_id)

    def _next_trial(self):
        """(trial, name, params, seed) of the next trial to launch, or None."""
        if self.resume_queue:
            frozen = self.resume_queue.pop(0)
            params, seed = self._point(frozen)
            return self._attach(frozen), self._run_dir_name(frozen), params, seed
        if not self._waiting() and self._fresh_count() >= self.spec.total_runs():
            return None
        trial = self.study.ask(distributions(self.spec))
        params = {k: trial.params[k] for k in self.spec.space}
        seed = int(trial.params.get("seed", trial.user_attrs.get("seed", self.spec.seeds[0])))
        name = trial.user_attrs.get("run_dir") or trial_name(trial.number, params, seed)
        trial.set_user_attr("run_dir", name)
        trial.set_user_attr("seed", seed)
        fresh = not trial.user_attrs.get("retry") and not trial.user_attrs.get("sibling")
        if self.spec.sampler != "grid" and fresh:
            for s in self.spec.seeds[1:]:  # the same configuration once per further seed
                self.study.enqueue_trial(params, user_attrs={"seed": s, "sibling": True})
        return trial, name, params, seed

    def _remaining(self) -> int:
        """Trials still to launch (an estimate for the thread split)."""
        from optuna.trial import TrialState

        waiting = len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        fresh_left = max(0, self.spec.total_runs() - self._fresh_count())
        return len(self.resume_queue) + waiting + fresh_left

    # ---- watching children ----------------------------------------------------------------

    def _watch(self, child: ch.Child) -> None:
        d = child.data
        rows = d["tail"].read()
        pm = self.spec.pruner.metric or self.spec.metric.name
        new = False
        for r in rows:
            step, v = r.get("step"), r.get(pm)
            if step is None:
                continue
            d["last_step"] = int(step)
            if r.get(self.spec.metric.name) is not None:
                d["last_value"] = r[self.spec.metric.name]
            if v is None or not math.isfinite(v) or int(step) in d["reported"] or child.stop_sent:
                continue
            d["trial"].report(float(v), int(step))
            d["reported"].add(int(step))
            d["last_reported"] = (int(step), float(v))
            new = True
        if (
            new
            and self.spec.pruner.type != "none"
            and not child.stop_sent
            and d["trial"].should_prune()
        ):
            step, value = d["last_reported"]
            p = self.spec.pruner
            evidence = f"{p.type} pruner at step {step}: {pm} {_fmt(value)}"
            if p.type == "threshold" and p.upper is not None and value > p.upper:
                evidence += f" above the upper bound {p.upper:g}"
            elif p.type == "threshold" and p.lower is not None and value < p.lower:
                evidence += f" below the lower bound {p.lower:g}"
            elif p.type == "median":
                evidence += " worse than the median of earlier trials at this step"
            elif p.type == "asha":
                evidence += f" not in the top 1/{p.reduction_factor} of its rung"
            child.interrupt(f"pruned: {evidence}")
            self._say(f"trial {child.name}: pruning ({evidence})")

    def _finish(self, child: ch.Child, code: int) -> None:
        self.running.remove(child)
        d = child.data
        summary = _summary(child.run_dir)
        wall = d["prior_wall"] + (time.time() - child.started)
        status = summary.get("status")
        if child.stop_reason and child.stop_reason.startswith("pruned") and status not in FINISHED:
            evidence = child.stop_reason.removeprefix("pruned: ")
            summary = set_status(child.run_dir, "pruned", evidence)
            status = "pruned"
        self._record(d["trial"], child.run_dir, child.name, status, summary, code, wall, d)

    def _record(self, trial, run_dir: Path, name: str, status: str | None, summary: dict,
                code: int | None, wall: float, d: dict | None = None) -> None:  # fmt: skip
        """Tell Optuna how a trial ended (see the module docstring for the mapping)."""
        from optuna.trial import TrialState

        from smollab.runs import read_metrics

        rows = read_metrics(run_dir / "metrics.csv")
        steps = (
            int(rows[-1]["step"])
            if rows and rows[-1].get("step") is not None
            else summary.get("steps")
        )
        reason = summary.get("evidence")
        attrs = {"steps": steps, "wall_s": round(wall, 2)}
        if status == "completed":
            value = metric_value(rows, self.spec)
            if value is None or not math.isfinite(value):
                status, state = "failed", TrialState.FAIL
                reason = (
                    f"metric {self.spec.metric.label} is {'not logged' if value is None else value}"
                )
            else:
                state = TrialState.COMPLETE
                attrs["metric"] = value
        elif status in FAILURE_STATUSES or status == "pruned":
            state = TrialState.PRUNED
        elif (self.stopping or code in (130, -2)) and status in ("interrupted", "running", None):
            status, state = "interrupted", None  # left RUNNING: the rerun continues it
            reason = reason or "sweep stopped"
        else:
            state = TrialState.FAIL
            reason = (summary.get("evidence") if status == "failed" else None) or last_log_line(
                run_dir
            )
            status = "failed"
        attrs.update(status=status, reason=reason)
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        if state is not None:
            self.study.tell(trial, attrs.get("metric") if state == TrialState.COMPLETE else None,
                            state=state)  # fmt: skip
        if status == "failed":
            self.fails_in_a_row += 1
        elif status != "interrupted":
            self.fails_in_a_row, self.successes = 0, self.successes + 1
        metric_txt = (
            f" {self.spec.metric.label}={_fmt(attrs['metric'])}" if "metric" in attrs else ""
        )
        why = f": {reason}" if reason and status != "completed" else ""
        done, total = self._progress()
        at = f"at step {steps}" if steps is not None else "before its first step"
        self._say(f"trial {name}: {status}{metric_txt} {at} in {wall:.1f}s{why} "
                  f"[{done}/{total} done, {len(self.running)} running]")  # fmt: skip
        if self.fails_in_a_row >= max(2, min(self.concurrency, 4)) and not self.successes:
            self.abort = (
                f"every trial fails so far; the last: {reason} (see {run_dir / ch.CHILD_LOG})"
            )
        self.write_results()
        self.write_report(plots=False)

    def _progress(self) -> tuple[int, int]:

        done = sum(1 for t in self._latest_by_dir().values() if t.state.is_finished())
        return done, max(self.spec.total_runs(), done)
