"""The trials of a sweep (`Trials`): their identity, which one runs next, what a previous sweep
process left behind, how each ending is told to Optuna, and results.csv.

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

Several parents may share one study through an RDB `storage:` (two machines, each with its own
sweep dir). Each trial then records its parent's `owner` (the sweep dir's id in sweep.json), and
a parent settles, resumes, retries and lists only its own: another parent's RUNNING trial is
alive elsewhere, not left behind. Counting and asking for a trial, and creating a retry, happen
under the study's lock (`smollab.lab.sweep.study_lock`), so each grid point runs once overall.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smollab.lab import children as ch
from smollab.lab.sweep.baseline import Baseline, Baselines, BaselineTrial
from smollab.lab.sweep.measure import Measure
from smollab.lab.sweep.results import (
    Live,
    metric_value,
    read_summary,
    result_rows,
    write_results_csv,
)
from smollab.lab.sweep.spec import SweepSpec
from smollab.lab.sweep.study import distributions
from smollab.rundir.runs import FINISHED, RunView

TRIALS = "trials"  # the sweep dir's folder of trial run directories
FAILURE_STATUSES = ("diverged", "degenerate", "stuck")


# ---- a trial in Optuna ----------------------------------------------------------------------------


def reported_steps(trial: Any) -> list[int]:
    """Steps a trial has already reported to the pruner (in an earlier sweep process too)."""
    try:
        return list(trial.storage.get_trial(trial._trial_id).intermediate_values)
    except Exception:
        return []


def fmt(v: Any) -> str:
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


@dataclass
class NextTrial:
    trial: Any  # optuna.trial.Trial, or a BaselineTrial
    name: str  # its run directory under trials/
    params: dict[str, Any]
    seed: int
    extra: dict[str, Any] = field(default_factory=dict)  # overrides after params (a baseline's)


@dataclass
class Ending:
    """How a trial ended, as the study records it (status and reason also as user attributes)."""

    status: str
    reason: str | None
    steps: int | None
    metric: float | None  # only for a completed trial with a finite metric


# conclude(trial, name, status, summary, exit code, wall seconds): the scheduler records an ending
Conclude = Callable[[Any, str, "str | None", dict[str, Any], "int | None", float], None]


class Trials:
    """A sweep's trials, held in its Optuna study and named by their run directories.

    It owns what a trial is (its point, seed and run directory), the queue of trials a previous
    sweep process left open, the tally of failures, and results.csv. It launches nothing: the
    scheduler (`smollab.lab.sweep.scheduler.Sweep`) asks it for the next trial and tells it how
    each ended.
    """

    def __init__(
        self,
        spec: SweepSpec,
        study: Any,
        sweep_dir: Path,
        say: Callable[[str], None],
        owner: str | None = None,
        lock: contextlib.AbstractContextManager[Any] | None = None,
    ):
        self.spec = spec
        self.owner = owner  # this sweep dir's id: its trials in a study shared with other parents
        self.lock = lock or contextlib.nullcontext()  # a StudyLock: one parent asks at a time
        self.study = study
        self.dir = sweep_dir
        self.trials_dir = sweep_dir / TRIALS
        self.say = say
        self.resume_queue: list[Any] = []  # FrozenTrials to continue
        self.fails_in_a_row = 0
        self.successes = 0
        self.baselines = Baselines(spec)  # routing_baseline: the routed trials' baselines
        self.baseline_queue: list[Baseline] = []
        self.baseline_runs: dict[str, BaselineTrial] = {}  # launched by this sweep process
        self.measure = Measure(spec)  # the measure step's runs, once planned
        self.population = None  # sampler pbt: who runs next (smollab.lab.sweep.pbt)
        if spec.pbt is not None:
            from smollab.lab.sweep.pbt import Population

            self.population = Population(spec, study, self.trials_dir, say, self.add_running)

    # ---- identity -------------------------------------------------------------------------

    def point(self, t: Any) -> tuple[dict[str, Any], int]:
        params = {k: t.params[k] for k in self.spec.param_keys() if k in t.params}
        seed = t.params.get("seed", t.user_attrs.get("seed", self.spec.seeds[0]))
        return params, int(seed)

    def run_dir_name(self, t: Any) -> str:
        name = t.user_attrs.get("run_dir")
        if name:
            return name
        params, seed = self.point(t)
        return trial_name(t.number, params, seed)

    def run_dir(self, name: str) -> Path:
        return self.trials_dir / name

    def owns(self, name: str, t: Any) -> bool:
        """Whether the trial is this sweep dir's. A journal study is the dir's alone; in a shared
        RDB study a trial without an owner (from before owners) is the dir's that holds its run."""
        if not self.spec.storage:
            return True
        owner = t.user_attrs.get("owner")
        return owner == self.owner if owner else self.run_dir(name).exists()

    def latest_by_dir(self, own: bool = True) -> dict[str, Any]:
        """The latest study trial of each run directory (a retry supersedes the failed one),
        those of this sweep dir unless `own` is False."""
        from optuna.trial import TrialState

        latest: dict[str, Any] = {}
        for t in self.study.get_trials(deepcopy=False):
            if t.state != TrialState.WAITING:
                latest[self.run_dir_name(t)] = t
        if own:
            return {name: t for name, t in latest.items() if self.owns(name, t)}
        return latest

    def _fresh_count(self) -> int:
        """Trials that count towards the grid or n_trials x seeds (retries do not)."""
        return sum(
            1 for t in self.study.get_trials(deepcopy=False) if not t.user_attrs.get("retry")
        )

    def _waiting(self) -> bool:
        from optuna.trial import TrialState

        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def remaining(self) -> int:
        """Trials still to launch (an estimate for the thread split)."""
        from optuna.trial import TrialState

        waiting = len(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        fresh_left = max(0, self.spec.total_runs() - self._fresh_count())
        return len(self.resume_queue) + len(self.baseline_queue) + waiting + fresh_left

    def progress(self) -> tuple[int, int]:
        done = sum(1 for t in self.latest_by_dir(own=False).values() if t.state.is_finished())
        done += sum(1 for r in self._baseline_rows({}) if r["status"] in FINISHED)
        side = len(self.baselines.by_name) + len(self.measure.by_name)
        return done, max(self.spec.total_runs() + side, done)

    # ---- routing baselines ----------------------------------------------------------------

    def _note_baseline(
        self, routed: str, params: dict[str, Any], seed: int, stop_timeout: float | None = None
    ) -> None:
        """Find the routed trial's baseline; queue it, once per sweep process, unless its run
        finished (a failed one only when `retry_failed`). After a previous parent
        (`stop_timeout` given), a child it left in the baseline's run dir is stopped first."""
        b = self.baselines.add(routed, params, seed)
        if b is None or b.name in self.baseline_runs or b in self.baseline_queue:
            return
        status = read_summary(self.run_dir(b.name)).get("status")
        if status in FINISHED or (status == "failed" and not self.spec.retry_failed):
            return
        if stop_timeout is not None and ch.reap_stale(self.run_dir(b.name), stop_timeout):
            self.say(f"baseline {b.name}: stopped a child left by the previous sweep process")
        self.baseline_queue.append(b)

    # ---- the measure step -----------------------------------------------------------------

    def plan_measure(self, stop_timeout: float) -> tuple[int, int]:
        """Queue the measure step's runs that have not finished (a failed one only when
        `retry_failed`), run as baselines are; (runs in all, runs queued). A child a previous
        parent left in one of their run dirs is stopped first."""
        planned = self.measure.plan(result_rows(self, {}))
        for b in planned:
            status = read_summary(self.run_dir(b.name)).get("status")
            done = status in FINISHED or (status == "failed" and not self.spec.retry_failed)
            if done or b.name in self.baseline_runs or b in self.baseline_queue:
                continue
            if ch.reap_stale(self.run_dir(b.name), stop_timeout):
                self.say(f"measure {b.name}: stopped a child left by the previous sweep process")
            self.baseline_queue.append(b)
        return len(planned), len(self.baseline_queue)

    # ---- what runs next -------------------------------------------------------------------

    def settle_previous(self, stop_timeout: float, conclude: Conclude) -> None:
        """After a previous parent of this dir: finished runs are recorded (through `conclude`),
        open ones queued to continue, failed ones (a crash the child recorded itself counts)
        retried (same run dir) when `retry_failed`. Stopping a child the previous parent left
        may take stop_timeout_s, and `conclude` writes results.csv and the report, so neither
        happens under the study's lock (a parent sharing the study would wait on it to ask)."""
        from optuna.trial import TrialState

        failed = []
        for name, t in self.latest_by_dir().items():
            run_dir = self.run_dir(name)
            self._note_baseline(name, *self.point(t), stop_timeout=stop_timeout)
            if t.state == TrialState.RUNNING:
                if ch.reap_stale(run_dir, stop_timeout):
                    self.say(f"trial {name}: stopped a child left by the previous sweep process")
                summary = read_summary(run_dir)
                status = summary.get("status")
                if status in FINISHED or status == "failed":
                    wall = float(t.user_attrs.get("wall_s", 0.0))
                    conclude(self.attach(t), name, status, summary, 0, wall)
                    t = self.study.get_trials(deepcopy=False)[t.number]  # now told: its state
                else:
                    self.resume_queue.append(t)
            # pbt: the next generation replaces a failed member from a top one, no retry
            if t.state == TrialState.FAIL and self.spec.retry_failed and not self.population:
                failed.append((name, t))
        if failed:
            with self.lock:
                for name, t in failed:
                    self.resume_queue.append(self._retry(name, t))
                    self.say(
                        f"trial {name}: failed before ({t.user_attrs.get('reason', '?')}); retrying"
                    )
        if self.resume_queue:
            self.say(
                f"resuming {len(self.resume_queue)} unfinished trial(s) from their checkpoints"
            )

    def _retry(self, name: str, failed: Any) -> Any:
        """A new RUNNING trial at the failed one's point, owned by this parent, to launch in the
        same run dir. Not an enqueued WAITING trial: in a shared study whichever parent asks
        first would take that, and run it under this dir's name in its own dir."""
        params, seed = self.point(failed)
        if self.spec.sampler == "grid":
            params["seed"] = seed
        space = distributions(self.spec)
        attrs = {
            "run_dir": name,
            "seed": seed,
            "retry": True,
            "retry_of": failed.number,
            "wall_s": failed.user_attrs.get("wall_s", 0.0),
        }
        return self.add_running(params, {k: space[k] for k in params}, attrs)

    def add_running(self, params: dict[str, Any], dists: dict[str, Any], attrs: dict[str, Any]):
        """Record a trial this parent launches itself (a retry, a pbt member) as RUNNING, owned
        by it, and return it (the newest RUNNING trial of its run dir)."""
        import optuna
        from optuna.trial import TrialState

        if self.owner:
            attrs["owner"] = self.owner
        self.study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.RUNNING,
                params=params,
                user_attrs=attrs,
                distributions=dists,
                system_attrs={"fixed_params": params},  # GridSampler: not a fresh grid point
            )
        )
        running = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        return next(t for t in reversed(running) if t.user_attrs["run_dir"] == attrs["run_dir"])

    def attach(self, frozen: Any) -> Any:
        import optuna

        return optuna.trial.Trial(self.study, frozen._trial_id)

    def next_trial(self) -> NextTrial | None:
        """The next trial to launch: an open one to continue first, else one asked of the study."""
        if self.resume_queue:
            frozen = self.resume_queue.pop(0)
            params, seed = self.point(frozen)
            extra = dict(frozen.user_attrs.get("overrides") or {})  # a pbt member's
            name = self.run_dir_name(frozen)
            return NextTrial(self.attach(frozen), name, params, seed, extra=extra)
        if self.population is not None:
            with self.lock:
                return self.population.next_trial()
        if self.baseline_queue:
            b = self.baseline_queue.pop(0)
            trial = self.baseline_runs[b.name] = BaselineTrial(b)
            return NextTrial(trial, b.name, b.params, b.seed, extra=b.extra)
        with self.lock:  # counting and asking are one step for every parent on the study
            if not self._waiting() and self._fresh_count() >= self.spec.total_runs():
                return None
            trial = self.study.ask(distributions(self.spec))
            params = {k: trial.params[k] for k in self.spec.space}
            seed = int(trial.params.get("seed", trial.user_attrs.get("seed", self.spec.seeds[0])))
            name = trial.user_attrs.get("run_dir") or trial_name(trial.number, params, seed)
            if self.owner:
                trial.set_user_attr("owner", self.owner)
            trial.set_user_attr("run_dir", name)
            trial.set_user_attr("seed", seed)
            fresh = not trial.user_attrs.get("retry") and not trial.user_attrs.get("sibling")
            if self.spec.sampler != "grid" and fresh:
                for s in self.spec.seeds[1:]:  # the same configuration once per further seed
                    self.study.enqueue_trial(params, user_attrs={"seed": s, "sibling": True})
        self._note_baseline(name, params, seed)  # launched next, beside its routed trial
        return NextTrial(trial, name, params, seed)

    # ---- endings --------------------------------------------------------------------------

    def record(
        self,
        trial: Any,
        run_dir: Path,
        status: str | None,
        summary: dict[str, Any],
        code: int | None,
        wall: float,
        stopping: bool,
        start_s: float | None = None,
    ) -> Ending:
        """Tell Optuna how a trial ended (see the module docstring for the mapping)."""
        from optuna.trial import TrialState

        rows = RunView(run_dir).metrics()
        steps = (
            int(rows[-1]["step"])
            if rows and rows[-1].get("step") is not None
            else summary.get("steps")
        )
        reason = summary.get("evidence")
        attrs: dict[str, Any] = {"steps": steps, "wall_s": round(wall, 2)}
        if start_s is not None:  # launch to first logged step (`children.first_row_s`)
            attrs["start_s"] = round(start_s, 2)
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
        elif (stopping or code in (130, -2)) and status in ("interrupted", "running", None):
            status, state = "interrupted", None  # left RUNNING: the rerun continues it
            reason = reason or "sweep stopped"
        else:
            state = TrialState.FAIL
            reason = (summary.get("evidence") if status == "failed" else None) or ch.last_log_line(
                run_dir
            )
            status = "failed"
        attrs.update(status=status, reason=reason)
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        if state is not None and not isinstance(trial, BaselineTrial):
            self.study.tell(
                trial, attrs.get("metric") if state == TrialState.COMPLETE else None, state=state
            )
        if status == "failed":
            self.fails_in_a_row += 1
        elif status != "interrupted":
            self.fails_in_a_row, self.successes = 0, self.successes + 1
        return Ending(status=status, reason=reason, steps=steps, metric=attrs.get("metric"))

    def all_failing(self, concurrency: int) -> bool:
        """No trial has succeeded and enough failed in a row (at least 2, at most 4, about one per
        slot) to say the workload itself is broken: launching more would only repeat it."""
        return self.fails_in_a_row >= max(2, min(concurrency, 4)) and not self.successes

    # ---- results.csv (smollab.lab.sweep.results) -----------------------------------------

    def rows(self, live: Mapping[str, Live]) -> list[dict[str, Any]]:
        """One row per run directory; `live` holds the running trials' progress."""
        return result_rows(self, live) + self._baseline_rows(live)

    def _baseline_rows(self, live: Mapping[str, Live]) -> list[dict[str, Any]]:
        """The rows of the runs that are not study trials: routing baselines, measured runs."""
        return self.baselines.rows(self.trials_dir, self.baseline_runs, live) + self.measure.rows(
            self.trials_dir, self.baseline_runs, live
        )

    def write_results(self, live: Mapping[str, Live]) -> None:
        write_results_csv(self, live)
