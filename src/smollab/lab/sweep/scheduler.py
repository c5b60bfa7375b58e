"""`smollab sweep SPEC`: an Optuna study (ask and tell) over child `smollab` processes.

The parent owns the study; children know nothing of Optuna. This module is the scheduler: it
holds the sweep dir's lock (`smollab.lab.sweep.lock`), prepares the data once, resolves the
concurrency, launches trials with their share of the CPU threads, watches their metrics for the
pruner and their clocks for `trial_timeout_s` and `stall_timeout_s`, stops them cleanly on
Ctrl-C (SIGINT, then SIGKILL after `stop_timeout_s`), and refreshes results.csv and the report.
Nothing it waits on is unbounded: a child that survives even SIGKILL is given up on and recorded
as failed. The study is in `smollab.lab.sweep.study`; the trials (run directories as their
identity, resume and retries, how an ending maps to Optuna, results.csv) in
`smollab.lab.sweep.trials`; what they run on (device, concurrency, executor, thread shares, CPU
peaks) in `smollab.lab.sweep.resources`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smollab.errors import UserError
from smollab.lab import children as ch
from smollab.lab.spec_common import override_value
from smollab.lab.sweep import resources
from smollab.lab.sweep.lock import SweepLock
from smollab.lab.sweep.measure import fresh_seeds
from smollab.lab.sweep.pruning import intermediate_values
from smollab.lab.sweep.setup import check_models, preflight_data, write_meta
from smollab.lab.sweep.spec import SweepSpec
from smollab.lab.sweep.study import (
    JOURNAL,
    close_study,
    open_study,
    ping_storage,
    prune_evidence,
    prunes,
    repair_journal,
    study_name,
)
from smollab.lab.sweep.study_lock import StudyLock
from smollab.lab.sweep.trials import (
    TRIALS,
    Live,
    NextTrial,
    Trials,
    fmt,
    read_summary,
    reported_steps,
)
from smollab.lab.zygote import Zygote, ZygoteError
from smollab.rundir.runs import CHILD_LOG, FINISHED, REPORT, SWEEP_RESULTS, RunView, set_status

KILL_WAIT_S = 30.0  # after SIGKILL: a child still not gone is stuck in the kernel; give up on it


def _now() -> str:
    return time.strftime("%H:%M:%S")


def _print(msg: str) -> None:
    print(msg, flush=True)


@dataclass
class RunningTrial:
    """What the sweep follows of a launched trial, beside its process (a `children.Child`)."""

    trial: Any  # optuna.trial.Trial: reported to while it runs, told how it ended
    tail: ch.MetricsTail
    reported: set[int]  # steps already reported to the pruner, in this or an earlier process
    prior_wall: float  # seconds the trial ran under earlier sweep processes
    last_step: int | None = None
    last_reported: tuple[int, float] | None = None  # (step, value) last given to the pruner
    verdict: tuple[str, str] | None = None  # (status, evidence) the sweep gave it: pruned, failed
    # the step a relaunched trial continues after (its checkpoint's; pbt: its parent's): rows up
    # to it are an earlier process's, so its start is its first row past it (None: fresh)
    after_step: int | None = None
    start_s: float | None = None  # launch to its first logged step


class Sweep:
    def __init__(self, spec: SweepSpec, out: Callable[[str], None] | None = None):
        self.spec = spec
        self.dir = spec.sweep_dir()
        self.out = out or _print
        self.running: dict[ch.Child, RunningTrial] = {}
        self.stop = ch.StopFlag()
        self.stopping = False
        self.abort: str | None = None
        self.concurrency = 1
        self.total_threads = spec.threads or ch.cpu_count()
        self.device = "cpu"
        self.lock = SweepLock(self.dir)
        self._last_plots = 0.0
        self._last_results = 0.0
        self.study = None
        self.study_lock: StudyLock | None = None
        self.owner: str | None = None  # this dir's id among parents sharing an RDB study
        self.trials: Trials | None = None
        self.env: dict[str, str] | None = None
        self.executor: Any = None  # a RayExecutor (ray_executor) or LanesExecutor (lanes_executor)
        self.launched = False  # a trial was started: from then on, the dir holds results
        self.zygote: Zygote | None = None  # the warm start server trials fork from

    # ---- setup ----------------------------------------------------------------------------

    def _say(self, msg: str) -> None:
        self.out(f"[{_now()}] {msg}")

    # ---- launching ------------------------------------------------------------------------

    def _launch(self, nxt: NextTrial) -> None:
        run_dir = self.trials.run_dir(nxt.name)
        threads = resources.trial_threads(
            self.spec,
            self.executor,
            self.total_threads,
            self.concurrency,
            self.running,
            self.trials.remaining,
        )
        # A trial draws no end-of-run plots unless the spec asks: matplotlib costs a micro trial
        # about as much as its run, and the sweep's report draws the curves across trials
        # (`smollab report <trial dir>` draws one trial's). Any run.plots the spec sets wins.
        overrides = ["run.plots=false"]
        overrides += [f"{k}={override_value(v)}" for k, v in self.spec.overrides.items()]
        overrides += [f"{k}={override_value(v)}" for k, v in {**nxt.params, **nxt.extra}.items()]
        overrides += [f"run.seed={nxt.seed}", f"run.dir={run_dir}", "run.resume=auto"]
        if "run.group" not in self.spec.overrides:  # trackers group the trials by their study
            overrides.append(f"run.group={json.dumps(self.trials.study.study_name)}")  # a str
        if threads:
            overrides.append(f"perf.threads={threads}")
        argv = ch.smollab_argv(self.spec.command, self.spec.base, overrides)
        metrics_path = RunView(run_dir).metrics_path
        # Before the launch: a warm trial can write its first rows before launch() returns.
        resuming = metrics_path.exists()
        self.launched = True
        grace = self.spec.stop_timeout_s
        try:
            if self.executor:
                child = self.executor.launch(
                    nxt.name, argv, run_dir, threads=threads, env=self.env, grace=grace
                )
            else:
                child = ch.launch(
                    nxt.name,
                    argv,
                    run_dir,
                    threads=threads,
                    env=self.env,
                    grace=grace,
                    zygote=self.zygote,
                )
        except ZygoteError as e:  # left RUNNING in the study: a rerun launches it
            self._server_failed(str(e))
            return
        trial = nxt.trial
        prior = trial.user_attrs.get("wall_s", 0.0) if hasattr(trial, "user_attrs") else 0.0
        self.running[child] = RunningTrial(
            trial=trial,
            tail=ch.MetricsTail(metrics_path),
            reported=set(reported_steps(trial)),
            prior_wall=prior,
            after_step=RunView(run_dir).resume_step() if resuming else None,
        )
        shown = " ".join(
            f"{k.split('.')[-1]}={fmt(v)}" for k, v in {**nxt.params, **nxt.extra}.items()
        )
        resumed = " (resuming)" if resuming else ""
        where = (
            f"a lane of worker pid {child.pid}"
            if self.spec.executor == "lanes"
            else f"{threads or 'default'} thread(s), pid {child.pid}"
        )
        self._say(f"trial {nxt.name}: started{resumed} {shown} seed={nxt.seed}, {where}")

    def _server_failed(self, why: str) -> None:
        """The warm start server died or refused a trial: say so in one line and stop the sweep
        (its running trials stop cleanly and resume on a rerun) rather than start trials
        another way than the spec and this log say."""
        self.abort = (
            f"trial start: {why}; the sweep stops, a rerun resumes it (start: cold uses no server)"
        )
        self._say(self.abort)
        if self.running:
            self._stop_children()

    # ---- watching, pruning and finishing --------------------------------------------------

    def _watch(self, child: ch.Child) -> None:
        """Report the child's new values to the pruner; stop it (SIGINT) if the pruner says so."""
        rt = self.running[child]
        rows = rt.tail.read()
        self._note_start(child, rt, rows)
        steps = [r["step"] for r in rows if r.get("step") is not None]
        if steps:
            rt.last_step = int(steps[-1])
        population = self.trials.population
        if population and not child.stop_sent and population.segment_over(rt.trial, child.run_dir):
            end = population.segment_end(rt.trial)
            self._stop(child, "completed", f"pbt: its generation ends at step {end}")
        pruner = self.spec.pruner
        pm = pruner.metric or self.spec.metric.name
        new = False
        for step, v in intermediate_values(pruner, pm, rows, child.run_dir):
            if step in rt.reported or child.stop_sent:
                continue
            rt.trial.report(v, step)
            rt.reported.add(step)
            rt.last_reported = (step, v)
            new = True
        if new and prunes(pruner) and not child.stop_sent and rt.trial.should_prune():
            step, value = rt.last_reported
            evidence = prune_evidence(pruner, pm, step, value)
            self._stop(child, "pruned", evidence)

    def _stop(self, child: ch.Child, status: str, evidence: str) -> None:
        """The sweep's verdict on a running trial: SIGINT now, SIGKILL after stop_timeout_s."""
        self.running[child].verdict = (status, evidence)
        child.interrupt(f"{status}: {evidence}")
        self._say(f"trial {child.name}: stopping, {status} ({evidence})")

    def _check_clocks(self, child: ch.Child) -> None:
        """Stop a trial past trial_timeout_s, or one that has written nothing for stall_timeout_s."""
        spec, now = self.spec, time.time()
        if child.stop_sent:
            return
        if spec.trial_timeout_s and now - child.started > spec.trial_timeout_s:
            self._stop(child, "failed", f"timed out after {spec.trial_timeout_s:g} s")
        elif spec.stall_timeout_s and now - child.last_output() > spec.stall_timeout_s:
            self._stop(child, "failed", f"stalled: wrote nothing for {spec.stall_timeout_s:g} s")

    def _escalate(self, child: ch.Child, now_kill: bool = False) -> bool:
        """SIGKILL a child past its grace; True when even SIGKILL did not end it in KILL_WAIT_S."""
        now = time.time()
        if child.kill_sent is None:
            late = child.stop_sent and now - child.stop_sent > self.spec.stop_timeout_s
            if late or now_kill:
                why = (
                    f"still running {self.spec.stop_timeout_s:g} s after SIGINT"
                    if late
                    else "Ctrl-C twice"
                )
                self._say(f"trial {child.name}: {why}; SIGKILL")
                child.kill()
            return False
        return now - child.kill_sent > KILL_WAIT_S

    @staticmethod
    def _note_start(child: ch.Child, rt: RunningTrial, rows: list) -> None:
        """The trial's start_s, the first time its metrics show a row of this launch's."""
        if rt.after_step is not None:
            rows = [r for r in rows if (r.get("step") or 0) > rt.after_step]
        if rt.start_s is None and rows:
            rt.start_s = ch.first_row_s(rows, rt.tail.mtime, child.started)

    def _finish(self, child: ch.Child, code: int | None) -> None:
        """Record a trial whose child exited (`code`), or was given up on (None)."""
        rt = self.running.pop(child)
        self._note_start(child, rt, rt.tail.read())  # rows written since the last look
        summary = read_summary(child.run_dir)
        wall = rt.prior_wall + (time.time() - child.started)
        status = summary.get("status")
        if code is None:
            rt.verdict = (
                "failed",
                f"pid {child.pid} did not exit {KILL_WAIT_S:g} s after SIGKILL"
                + (f" ({rt.verdict[1]})" if rt.verdict else ""),
            )
            status = None
        population = self.trials.population
        if code is not None and population and population.end_segment(rt.trial, child.run_dir):
            summary, status, rt.verdict = read_summary(child.run_dir), "completed", None
        if rt.verdict and status not in FINISHED:
            verdict, evidence = rt.verdict
            if status == "failed" and summary.get("evidence"):  # the child's own words first
                evidence = f"{summary['evidence']} (stopped: {evidence})"
            summary = set_status(child.run_dir, verdict, evidence)
            status = verdict
        self._conclude(rt.trial, child.name, status, summary, code, wall, rt.start_s)

    def _conclude(
        self,
        trial: Any,
        name: str,
        status: str | None,
        summary: dict[str, Any],
        code: int | None,
        wall: float,
        start_s: float | None = None,
    ) -> None:
        """Record how a trial ended, say so, give up on a sweep whose every trial fails, and
        refresh results.csv and the report."""
        run_dir = self.trials.run_dir(name)
        end = self.trials.record(
            trial, run_dir, status, summary, code, wall, self.stopping, start_s
        )
        metric_txt = (
            f" {self.spec.metric.label}={fmt(end.metric)}" if end.metric is not None else ""
        )
        why = f": {end.reason}" if end.reason and end.status != "completed" else ""
        done, total = self.trials.progress()
        at = f"at step {end.steps}" if end.steps is not None else "before its first step"
        self._say(
            f"trial {name}: {end.status}{metric_txt} {at} in {wall:.1f}s{why} "
            f"[{done}/{total} done, {len(self.running)} running]"
        )
        if self.trials.all_failing(self.concurrency):
            self.abort = (
                f"every trial fails so far; the last: {end.reason} (see {run_dir / CHILD_LOG})"
            )
        self.write_results()
        self.write_report(plots=False)

    # ---- outputs --------------------------------------------------------------------------

    def _live(self) -> dict[str, Live]:
        now = time.time()
        return {
            c.name: Live(rt.last_step, rt.prior_wall + now - c.started, rt.start_s)
            for c, rt in self.running.items()
        }

    def write_results(self) -> None:
        self.trials.write_results(self._live())
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
        fresh = first_missing(self.dir)  # what this sweep makes, removed again on bad input
        if self.spec.storage:
            ping_storage(self.spec.storage)  # a bad URL fails now, before anything is made
        check_models(self.spec)
        self.lock.acquire()
        refused = False
        try:
            return self._run()
        except UserError:
            refused = not self.launched  # bad input found later (Ray, a probe, the data)
            raise
        finally:
            try:
                self._cleanup()
            finally:
                if self.study_lock is not None:
                    self.study_lock.close()
                if self.study is not None:  # its pooled database connections
                    close_study(self.study)
                if self.executor:
                    self.executor.close()
                if self.zygote is not None:
                    self.zygote.close()
                self.lock.release()
                if refused and fresh is not None:
                    shutil.rmtree(fresh, ignore_errors=True)

    def _cleanup(self) -> None:
        """After an unexpected error: no child outlives the sweep, and results.csv says so."""
        if self.running:
            self.stopping = True
            self._say(f"stopping {len(self.running)} running trial(s) after an error")
            with contextlib.suppress(Exception):
                self._stop_children()
            for child in list(self.running):  # whatever could not be recorded
                with contextlib.suppress(Exception):  # a Ray child after Ray's end: no call
                    child.kill()
                self.running.pop(child)
        if self.trials is not None:
            with contextlib.suppress(Exception):
                self.write_results()

    def _run(self) -> dict[str, Any]:
        spec = self.spec
        (self.dir / TRIALS).mkdir(parents=True, exist_ok=True)
        self.device = resources.detect_device(spec)
        preflight_data(spec, self._say, self.out)
        self.concurrency = resources.resolve_concurrency(spec, self.dir, self.device, self._say)
        self.executor = resources.start_executor(
            spec, self.concurrency, self.device, self.dir, self._say
        )
        if self.executor:  # else local children divide spec.threads or every CPU thread
            self.total_threads = resources.executor_threads(spec, self.executor, self.concurrency)
        resources.prepare_peaks(spec, self.device, self.concurrency, self.total_threads, self._say)
        self.zygote = resources.start_server(spec, self.dir, self.env, self._say)
        spec.study_name = study_name(spec, self.dir)
        self.owner = write_meta(self.dir, spec, self.concurrency, self.total_threads, self.device)
        if not spec.storage:
            repair_journal(self.dir / JOURNAL)
        self.study_lock = StudyLock(spec.storage, spec.study_name)
        with self.study_lock:  # parents starting at once would race to create the tables
            self.study = open_study(spec, self.dir)
        self.trials = Trials(
            spec, self.study, self.dir, self._say, owner=self.owner, lock=self.study_lock
        )
        with resources.mps_context(spec, self.device, self._say) as mps_env:
            if mps_env:
                self.env = {**os.environ, **mps_env}
            with self.study_lock:  # once per study, however many parents start at once
                if spec.enqueue and not self.study.get_trials(deepcopy=False):
                    for point in spec.enqueue:  # bracketing points first
                        self.study.enqueue_trial(point, user_attrs={"seed": spec.seeds[0]})
            over = " (oversubscribed)" if self.concurrency > self.total_threads else ""
            at_once = (
                self.executor.at_once()
                if spec.executor == "lanes"
                else f"concurrency {self.concurrency}{over}, "
                f"{self.total_threads} CPU threads divided among trials"
            )
            plots = (
                f"trial plots: run.plots={spec.overrides['run.plots']} (the spec's)"
                if "run.plots" in spec.overrides
                else "trial plots: off (run.plots=false: the report draws the sweep's)"
            )
            self._say(
                f"sweep {self.dir}: {spec.total_runs()} trials ({spec.sampler}), "
                f"{at_once}, device {self.device}; {plots}"
            )
            self.trials.settle_previous(spec.stop_timeout_s, self._conclude)
            self.write_results()
            with self.stop.installed():
                self._loop()
                if spec.measure and not self.stop and not self.abort:
                    self._measure()
        self.write_results()
        self.write_report(plots=True)
        counts: dict[str, int] = {}
        for r in self.trials.rows(self._live()):
            counts[r["status"]] = counts.get(r["status"], 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        self._say(
            f"sweep {'stopped' if self.stop else 'done'}: {summary}; "
            f"results in {self.dir / SWEEP_RESULTS}, report in {self.dir / REPORT}"
        )
        for r in self.trials.rows(self._live()):
            if r["status"] == "failed":
                self.out(f"  failed: {r['run_dir']}: {r['reason']}")
        if self.abort and not self.stop:
            raise UserError(self.abort)
        if self.stop:
            raise KeyboardInterrupt
        return counts

    def _loop(self) -> None:
        while not self.stop:
            launched = waiting = False
            while not self.abort and len(self.running) < self.concurrency and not self.stop:
                if self.executor and not self.executor.can_launch(len(self.running)):
                    waiting = self.trials.remaining() > 0  # for a Ray slot to be placed
                    break
                nxt = self.trials.next_trial()
                if nxt is None:
                    break
                self._launch(nxt)
                launched = True
            if launched:
                self.write_results()
            if not self.running and not waiting:
                break
            deadline = time.time() + self.spec.poll_s
            while time.time() < deadline and not self.stop:
                time.sleep(min(0.1, self.spec.poll_s))
            for child in list(self.running):
                self._watch(child)
                self._check_clocks(child)
                gone = self._escalate(child)
                code = child.poll()
                if code is not None or gone:
                    self._finish(child, code)
            if self.zygote is not None and not self.abort and self.zygote.died():
                self._server_failed(f"the warm start server {self.zygote.gone}")
            if time.time() - self._last_results > 10:
                self.write_results()
        if self.stop and self.running:
            self._stop_children()

    def _measure(self) -> None:
        """The measure step, once the search has ended: the best configurations on fresh seeds,
        launched and packed as the search's trials were (`smollab.lab.sweep.measure`)."""
        try:
            total, queued = self.trials.plan_measure(self.spec.stop_timeout_s)
        except UserError as e:  # nothing to measure: said once the results are written
            self.abort = str(e)
            return
        m = self.spec.measure
        self._say(
            f"measure: the best {m.top_k} configuration(s) x fresh seeds "
            f"{fresh_seeds(self.spec)}: {total} run(s), {queued} to run"
        )
        self.write_results()
        self._loop()

    def _stop_children(self) -> None:
        self.stopping = True
        self._say(f"stopping {len(self.running)} running trial(s) cleanly (Ctrl-C again to kill)")
        for c in self.running:
            if c.stop_sent is None:  # a second SIGINT would cut short a child's clean stop
                c.interrupt("sweep stopped")
        while self.running:
            for c in list(self.running):
                gone = self._escalate(c, now_kill=self.stop.count >= 2)
                code = c.poll()
                if code is not None or gone:
                    self._finish(c, code)
            time.sleep(0.1)


def first_missing(path: Path) -> Path | None:
    """The outermost directory of `path` that does not exist yet (None: `path` exists)."""
    path, missing = Path(path).absolute(), None
    while not path.exists():
        missing, path = path, path.parent
    return missing


def run_sweep(spec: SweepSpec, out: Callable[[str], None] = _print) -> dict[str, Any]:
    return Sweep(spec, out=out).run()


def dry_run(spec: SweepSpec, out: Callable[[str], None] = print) -> None:
    """Print what the sweep would run, without starting anything."""
    for line in spec.describe():
        out(line)
