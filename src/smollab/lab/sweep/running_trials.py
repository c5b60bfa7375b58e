"""The trials in flight: each launched as a child process with its share of the CPU threads, its
new metrics reported to the pruner, stopped on the sweep's verdict or its clocks (SIGINT, then
SIGKILL after `stop_timeout_s`), and its exit recorded.

`Sweep` (`smollab.lab.sweep.scheduler`) mixes this in: the scheduler keeps the setup, the loop
and the outputs; this module is what happens to one child between its launch and its exit.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smollab.lab import children as ch
from smollab.lab.spec_common import override_value
from smollab.lab.sweep.spec import SweepSpec
from smollab.lab.sweep.study import prune_evidence
from smollab.lab.sweep.trials import NextTrial, Trials, fmt, read_summary, reported_steps
from smollab.runs import FINISHED, RunView, set_status

KILL_WAIT_S = 30.0  # after SIGKILL: a child still not gone is stuck in the kernel; give up on it


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


class RunningTrials:
    """`Sweep`'s handling of its children, one at a time; the attributes below are `Sweep`'s."""

    spec: SweepSpec
    running: dict[ch.Child, RunningTrial]
    trials: Trials | None
    executor: Any
    concurrency: int
    total_threads: int
    env: dict[str, str] | None
    _say: Callable[[str], None]
    _conclude: Callable[..., None]

    # ---- launching ------------------------------------------------------------------------

    def _user_sets_threads(self) -> bool:
        return "perf.threads" in self.spec.overrides or "perf.threads" in self.spec.space

    def _launch(self, nxt: NextTrial) -> None:
        run_dir = self.trials.run_dir(nxt.name)
        threads = None
        if self.executor and not self._user_sets_threads():  # what its Ray slot reserves
            threads = self.executor.trial_threads
        elif not self._user_sets_threads():
            free = self.total_threads - sum(c.threads or 0 for c in self.running)
            n_start = max(1, min(self.concurrency - len(self.running), self.trials.remaining() + 1))
            threads = ch.split_threads(max(free, 1), n_start)[0]
        overrides = [f"{k}={override_value(v)}" for k, v in self.spec.overrides.items()]
        overrides += [f"{k}={override_value(v)}" for k, v in {**nxt.params, **nxt.extra}.items()]
        overrides += [f"run.seed={nxt.seed}", f"run.dir={run_dir}", "run.resume=auto"]
        if "run.group" not in self.spec.overrides:  # trackers group the trials by their study
            overrides.append(f"run.group={json.dumps(self.trials.study.study_name)}")  # a str
        if threads:
            overrides.append(f"perf.threads={threads}")
        argv = ch.smollab_argv(self.spec.command, self.spec.base, overrides)
        launch = self.executor.launch if self.executor else ch.launch
        child = launch(nxt.name, argv, run_dir, threads=threads, env=self.env,
                       grace=self.spec.stop_timeout_s)  # fmt: skip
        trial = nxt.trial
        prior = trial.user_attrs.get("wall_s", 0.0) if hasattr(trial, "user_attrs") else 0.0
        metrics_path = RunView(run_dir).metrics_path
        self.running[child] = RunningTrial(trial=trial, tail=ch.MetricsTail(metrics_path),
                                           reported=set(reported_steps(trial)), prior_wall=prior)  # fmt: skip
        shown = " ".join(
            f"{k.split('.')[-1]}={fmt(v)}" for k, v in {**nxt.params, **nxt.extra}.items()
        )
        resumed = " (resuming)" if metrics_path.exists() else ""
        where = (f"a lane of worker pid {child.pid}" if self.spec.executor == "lanes"
                 else f"{threads or 'default'} thread(s), pid {child.pid}")  # fmt: skip
        self._say(f"trial {nxt.name}: started{resumed} {shown} seed={nxt.seed}, {where}")

    # ---- watching, pruning and finishing --------------------------------------------------

    def _watch(self, child: ch.Child) -> None:
        """Report the child's new values to the pruner; stop it (SIGINT) if the pruner says so."""
        rt = self.running[child]
        rows = rt.tail.read()
        pm = self.spec.pruner.metric or self.spec.metric.name
        new = False
        for r in rows:
            step, v = r.get("step"), r.get(pm)
            if step is None:
                continue
            rt.last_step = int(step)
            if v is None or not math.isfinite(v) or int(step) in rt.reported or child.stop_sent:
                continue
            rt.trial.report(float(v), int(step))
            rt.reported.add(int(step))
            rt.last_reported = (int(step), float(v))
            new = True
        pruner = self.spec.pruner
        if new and pruner.type != "none" and not child.stop_sent and rt.trial.should_prune():
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

    def _finish(self, child: ch.Child, code: int | None) -> None:
        """Record a trial whose child exited (`code`), or was given up on (None)."""
        rt = self.running.pop(child)
        summary = read_summary(child.run_dir)
        wall = rt.prior_wall + (time.time() - child.started)
        status = summary.get("status")
        if code is None:
            rt.verdict = ("failed", f"pid {child.pid} did not exit {KILL_WAIT_S:g} s after SIGKILL"
                          + (f" ({rt.verdict[1]})" if rt.verdict else ""))  # fmt: skip
            status = None
        if rt.verdict and status not in FINISHED:
            verdict, evidence = rt.verdict
            if status == "failed" and summary.get("evidence"):  # the child's own words first
                evidence = f"{summary['evidence']} (stopped: {evidence})"
            summary = set_status(child.run_dir, verdict, evidence)
            status = verdict
        self._conclude(rt.trial, child.name, status, summary, code, wall)
