"""`smollab sweep SPEC`: an Optuna study (ask and tell) over child `smollab` processes.

The parent owns the study; children know nothing of Optuna. Each trial is one child run with its
own run directory `<dir>/trials/<NNN>-<short params>-s<seed>`, and that directory is the trial's
identity: a rerun of the same command finds finished runs (kept), interrupted ones (continued
from their checkpoints by the child's `run.resume=auto`) and failed ones (retried in place).

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
import os
import time
from pathlib import Path
from typing import Any

from smollab.errors import UserError
from smollab.lab import children as ch
from smollab.lab.spec import Distribution, SweepSpec, override_value, resolve_config, trial_name
from smollab.runs import FINISHED, atomic_write_json, atomic_write_text, read_json, set_status

RESULT_FIELDS = ["trial", "status", "seed", "steps", "wall_s", "reason", "run_dir"]
FAILURE_STATUSES = ("diverged", "degenerate", "stuck")


def _now() -> str:
    return time.strftime("%H:%M:%S")


# ---- Optuna pieces ----------------------------------------------------------------------------


def _grid_sampler_cls():
    from optuna.samplers import GridSampler

    class AskTellGrid(GridSampler):
        """GridSampler whose after_trial does not call `study.stop()`: that only works inside
        `study.optimize`, and raises under ask and tell on the last grid point."""

        def after_trial(self, study, trial, state, values) -> None:
            return None

    return AskTellGrid


def make_sampler(spec: SweepSpec):
    import optuna

    if spec.sampler == "grid":
        space = {k: list(v) for k, v in spec.space.items()}
        space["seed"] = list(spec.seeds)
        return _grid_sampler_cls()(space, seed=spec.sampler_seed)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=spec.sampler_seed)
    if spec.sampler == "qmc":
        return optuna.samplers.QMCSampler(seed=spec.sampler_seed, warn_independent_sampling=False)
    return optuna.samplers.TPESampler(seed=spec.sampler_seed)


def make_pruner(spec: SweepSpec):
    import optuna

    p = spec.pruner
    if p.type == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.n_startup_trials,
                                           n_warmup_steps=p.n_warmup_steps,
                                           interval_steps=p.interval_steps)  # fmt: skip
    if p.type == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=p.min_resource,
                                                      reduction_factor=p.reduction_factor)  # fmt: skip
    if p.type == "threshold":
        return optuna.pruners.ThresholdPruner(lower=p.lower, upper=p.upper,
                                              n_warmup_steps=p.n_warmup_steps,
                                              interval_steps=p.interval_steps)  # fmt: skip
    return optuna.pruners.NopPruner()


def distributions(spec: SweepSpec) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution

    d = {k: v.optuna() if isinstance(v, Distribution) else CategoricalDistribution(v)
         for k, v in spec.space.items()}  # fmt: skip
    if spec.sampler == "grid":
        d["seed"] = CategoricalDistribution(list(spec.seeds))
    return d


def open_study(spec: SweepSpec, sweep_dir: Path):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if spec.storage:
        storage = spec.storage
    else:
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        storage = JournalStorage(JournalFileBackend(str(sweep_dir / "study.journal")))
    return optuna.create_study(
        storage=storage, study_name=spec.study_name, load_if_exists=True,
        direction="minimize" if spec.metric.goal == "min" else "maximize",
        sampler=make_sampler(spec), pruner=make_pruner(spec),
    )  # fmt: skip


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


# ---- the sweep ---------------------------------------------------------------------------------


class Sweep:
    def __init__(self, spec: SweepSpec, out=None):
        self.spec = spec
        self.dir = spec.sweep_dir()
        self.trials_dir = self.dir / "trials"
        self.out = out or _print
        self.running: list[ch.Child] = []
        self.stop = ch.StopFlag()
        self.stopping = False
        self.abort: str | None = None
        self.fails_in_a_row = 0
        self.successes = 0
        self.resume_queue: list[Any] = []  # FrozenTrials to continue
        self.concurrency = 1
        self.total_threads = spec.threads or ch.cpu_count()
        self.device = "cpu"
        self._lock_file = None
        self._last_plots = 0.0
        self._last_results = 0.0
        self.study = None
        self.env: dict[str, str] | None = None

    # ---- setup ----------------------------------------------------------------------------

    def _say(self, msg: str) -> None:
        self.out(f"[{_now()}] {msg}")

    def _lock(self) -> None:
        import fcntl

        self.dir.mkdir(parents=True, exist_ok=True)
        f = open(self.dir / ".sweep.lock", "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            owner = f.read().strip() or "?"
            f.close()
            raise UserError(
                f"sweep dir {self.dir} is in use by another sweep (pid {owner})"
            ) from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._lock_file = f

    def _unlock(self) -> None:
        if self._lock_file:
            self._lock_file.close()
            self._lock_file = None

    def _write_meta(self) -> None:
        path = self.dir / "sweep.json"
        ident = self.spec.identity()
        if path.exists():
            old = read_json(path)
            if old.get("identity") != ident:
                changed = [k for k in ident if (old.get("identity") or {}).get(k) != ident[k]]
                raise UserError(f"sweep dir {self.dir} holds a different sweep ({', '.join(changed)} "
                                f"changed): use another dir= or remove it")  # fmt: skip
        atomic_write_json(path, {
            "identity": ident, "spec": self.spec.model_dump(mode="json"),
            "concurrency": self.concurrency, "threads": self.total_threads, "device": self.device,
            "updated": time.strftime("%Y-%m-%d %H:%M:%S"),
        })  # fmt: skip

    def _preflight_data(self) -> None:
        """Prepare the data dir once here instead of in every child at the same time."""
        spec = self.spec
        if spec.command not in ("pretrain", "grpo") or any(
            k.startswith("data.") for k in spec.space
        ):
            return
        cfg = resolve_config(spec, {}, spec.seeds[0])
        if spec.command == "grpo" and (Path(cfg.data.dir) / "meta.json").exists():
            return
        from smollab.data.prepare import prepare

        self._say(f"data: preparing {cfg.data.dir} once for all trials")
        prepare(cfg.data, log=lambda m: self.out(f"  {m}"))

    def _detect_device(self) -> str:
        cfg = resolve_config(self.spec, {}, self.spec.seeds[0])
        want = cfg.perf.device
        if want != "auto":
            return want
        import torch

        if torch.cuda.is_available():
            return "cuda"
        return "mps" if torch.backends.mps.is_available() else "cpu"

    def _resolve_concurrency(self) -> int:
        if self.spec.concurrency != "auto":
            return int(self.spec.concurrency)
        from smollab.lab.probe import auto_concurrency

        return auto_concurrency(self.spec, self.dir / "probe", self.device, out=self._say)

    # ---- trials ---------------------------------------------------------------------------

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

    def _user_sets_threads(self) -> bool:
        return "perf.threads" in self.spec.overrides or "perf.threads" in self.spec.space

    def _launch(self, trial, name: str, params: dict[str, Any], seed: int) -> None:
        run_dir = self.trials_dir / name
        threads = None
        if not self._user_sets_threads():
            free = self.total_threads - sum(c.threads or 0 for c in self.running)
            n_start = max(1, min(self.concurrency - len(self.running), self._remaining() + 1))
            threads = ch.split_threads(max(free, 1), n_start)[0]
        overrides = [f"{k}={override_value(v)}" for k, v in self.spec.overrides.items()]
        overrides += [f"{k}={override_value(v)}" for k, v in params.items()]
        overrides += [f"run.seed={seed}", f"run.dir={run_dir}", "run.resume=auto"]
        if threads:
            overrides.append(f"perf.threads={threads}")
        argv = ch.smollab_argv(self.spec.command, self.spec.base, overrides)
        child = ch.launch(name, argv, run_dir, threads=threads, env=self.env)
        prior = trial.user_attrs.get("wall_s", 0.0) if hasattr(trial, "user_attrs") else 0.0
        child.data.update(trial=trial, tail=ch.MetricsTail(run_dir / "metrics.csv"), params=params,
                          seed=seed, reported=set(_reported_steps(trial)), prior_wall=prior,
                          last_step=None, last_value=None)  # fmt: skip
        self.running.append(child)
        shown = " ".join(f"{k.split('.')[-1]}={_fmt(v)}" for k, v in params.items())
        resumed = " (resuming)" if (run_dir / "metrics.csv").exists() else ""
        self._say(f"trial {name}: started{resumed} {shown} seed={seed}, "
                  f"{threads or 'default'} thread(s), pid {child.pid}")  # fmt: skip

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

    # ---- outputs --------------------------------------------------------------------------

    def result_rows(self) -> list[dict[str, Any]]:
        from optuna.trial import TrialState

        live = {c.name: c for c in self.running}
        rows = []
        for name, t in sorted(self._latest_by_dir().items(), key=lambda kv: kv[0]):
            params, seed = self._point(t)
            ua = t.user_attrs
            c = live.get(name)
            if t.state == TrialState.RUNNING:
                status = "running" if c else ua.get("status") or "interrupted"
            elif t.state == TrialState.FAIL:
                status = "failed"
            else:
                status = ua.get("status", t.state.name.lower())
            steps = c.data.get("last_step") if c else ua.get("steps")
            wall = (c.data["prior_wall"] + time.time() - c.started) if c else ua.get("wall_s")
            value = t.value if t.state == TrialState.COMPLETE else None
            row = {"trial": name[:3] if name[:3].isdigit() else t.number, **params, "seed": seed,
                   "status": status, self.spec.metric.label: value, "steps": steps,
                   "wall_s": None if wall is None else round(wall, 1),
                   "reason": ua.get("reason") if status not in ("running", "completed") else None,
                   "run_dir": f"trials/{name}"}  # fmt: skip
            rows.append(row)
        return rows

    def write_results(self) -> None:
        import csv
        import io

        fields = ["trial", *self.spec.space, "seed", "status", self.spec.metric.label, "steps",
                  "wall_s", "reason", "run_dir"]  # fmt: skip
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in self.result_rows():
            w.writerow({k: ("" if v is None else _csv(v)) for k, v in r.items()})
        atomic_write_text(self.dir / "results.csv", buf.getvalue())
        self._last_results = time.time()

    def write_report(self, plots: bool) -> None:
        from smollab.report.sweep_report import write_sweep_report

        due = plots or time.time() - self._last_plots >= self.spec.report.plots_every_s
        try:
            write_sweep_report(self.dir, plots=due, target_loss=self.spec.report.target_loss)
        except Exception as e:  # a report must never stop a sweep
            self._say(f"report: not written ({type(e).__name__}: {e})")
            return
        if due:
            self._last_plots = time.time()

    # ---- the loop -------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self._lock()
        try:
            return self._run()
        finally:
            self._unlock()

    def _run(self) -> dict[str, Any]:
        spec = self.spec
        self.trials_dir.mkdir(parents=True, exist_ok=True)
        self.device = self._detect_device()
        self._preflight_data()
        self.concurrency = self._resolve_concurrency()
        self._write_meta()
        self.study = open_study(spec, self.dir)
        mps_ctx = contextlib.nullcontext(None)
        if spec.mps and self.device == "cuda":
            from smollab.lab.mps import mps_daemon

            mps_ctx = mps_daemon(out=self._say)
        with mps_ctx as mps_env:
            if mps_env:
                self.env = {**os.environ, **mps_env}
            if spec.enqueue and not self.study.get_trials(deepcopy=False):
                for point in spec.enqueue:  # bracketing points first, once per study
                    self.study.enqueue_trial(point, user_attrs={"seed": spec.seeds[0]})
            over = " (oversubscribed)" if self.concurrency > self.total_threads else ""
            self._say(f"sweep {self.dir}: {spec.total_runs()} trials ({spec.sampler}), "
                      f"concurrency {self.concurrency}{over}, {self.total_threads} CPU threads "
                      f"divided among trials, device {self.device}")  # fmt: skip
            self._settle_previous()
            self.write_results()
            with self.stop.installed():
                self._loop()
        self.write_results()
        self.write_report(plots=True)
        counts: dict[str, int] = {}
        for r in self.result_rows():
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        self._say(f"sweep {'stopped' if self.stop else 'done'}: {summary}; "
                  f"results in {self.dir / 'results.csv'}, report in {self.dir / 'report.md'}")  # fmt: skip
        if self.abort and not self.stop:
            raise UserError(self.abort)
        if self.stop:
            raise KeyboardInterrupt
        return counts

    def _loop(self) -> None:
        while not self.stop:
            launched = False
            while not self.abort and len(self.running) < self.concurrency and not self.stop:
                nxt = self._next_trial()
                if nxt is None:
                    break
                self._launch(*nxt)
                launched = True
            if launched:
                self.write_results()
            if not self.running:
                break
            deadline = time.time() + self.spec.poll_s
            while time.time() < deadline and not self.stop:
                time.sleep(min(0.1, self.spec.poll_s))
            for child in list(self.running):
                self._watch(child)
                if child.stop_sent and time.time() - child.stop_sent > self.spec.stop_timeout_s:
                    child.kill()
                code = child.poll()
                if code is not None:
                    self._finish(child, code)
            if time.time() - self._last_results > 10:
                self.write_results()
        if self.stop and self.running:
            self._stop_children()

    def _stop_children(self) -> None:
        self.stopping = True
        self._say(f"stopping {len(self.running)} running trial(s) cleanly (Ctrl-C again to kill)")
        for c in self.running:
            c.interrupt(c.stop_reason or "sweep stopped")
        deadline = time.time() + self.spec.stop_timeout_s
        killed = False
        while self.running:
            if not killed and (self.stop.count >= 2 or time.time() > deadline):
                for c in self.running:
                    c.kill()
                killed = True
            for c in list(self.running):
                code = c.poll()
                if code is not None:
                    self._finish(c, code)
            time.sleep(0.1)


# ---- helpers --------------------------------------------------------------------------------


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


def _csv(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def _print(msg: str) -> None:
    print(msg, flush=True)


def run_sweep(spec: SweepSpec, out=_print) -> dict[str, Any]:
    return Sweep(spec, out=out).run()


def dry_run(spec: SweepSpec, out=print) -> None:
    """Print what the sweep would run, without starting anything."""
    out(f"sweep {spec.sweep_dir()}: command {spec.command}, base {spec.base or '(defaults)'}")
    if spec.overrides:
        out("overrides: " + " ".join(f"{k}={override_value(v)}" for k, v in spec.overrides.items()))
    if spec.sampler == "grid":
        points = spec.grid_points()
        out(f"grid: {len(points)} points x {len(spec.seeds)} seed(s) = {spec.total_runs()} trials")
        for p in points:
            out("  " + " ".join(f"{k}={_fmt(v)}" for k, v in p.items()))
    else:
        out(f"{spec.sampler}: {spec.n_trials} configurations x {len(spec.seeds)} seed(s)")
        for k, v in spec.space.items():
            out(f"  {k}: {v}")
    out(f"metric: {spec.metric.label} ({spec.metric.goal}); pruner: {spec.pruner.type}; "
        f"concurrency: {spec.concurrency}")  # fmt: skip
