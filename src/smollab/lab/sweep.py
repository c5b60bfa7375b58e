"""`smollab sweep SPEC`: an Optuna study (ask and tell) over child `smollab` processes.

The parent owns the study; children know nothing of Optuna. This module is the scheduler: it
holds the sweep dir's lock, prepares the data once, resolves the concurrency, launches trials with
their share of the CPU threads, polls them, stops them cleanly on Ctrl-C, and writes results.csv
and the report. The study is in `smollab.lab.sweep_study`; the trials (run directories as their
identity, resume and retries, pruning, and how a child's ending maps to Optuna) in
`smollab.lab.sweep_trials`.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from smollab.errors import UserError
from smollab.lab import children as ch
from smollab.lab.spec import SweepSpec, override_value, resolve_config
from smollab.lab.sweep_study import open_study
from smollab.lab.sweep_trials import TrialBook, _fmt, _reported_steps
from smollab.runs import atomic_write_json, atomic_write_text, read_json


def _now() -> str:
    return time.strftime("%H:%M:%S")


class Sweep(TrialBook):
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

    # ---- launching ------------------------------------------------------------------------

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
