"""Measuring one probe level with k real child processes.

Each run passes `warmup` logged steps; the window opens when the last one has passed its warm-up
and closes when each has logged `steps` more steps; then all are stopped. Per run it takes the
median step time inside the window (grpo: `step_s`; pretrain: differences of `train_s`, logged
every step), so import, data and compile time never count.

A run's memory is what it logged as `peak_mem_mb` (CUDA: the most tensors held; CPU: its peak
RSS), except for runs forked from a warm start server on a CPU (`pss`): their peak RSS counts
every page they still share with the server, once per run, so k runs would seem to need k times
the server's imports. Their figure is the largest PSS (`children.pss_mb`) the parent saw at its
polls: it adds up across the runs and the server, which is what deciding how many fit needs.
"""

from __future__ import annotations

import math
import shutil
import statistics
import time
from pathlib import Path

from smollab.lab import children as ch
from smollab.lab.probe.levels import RunMeasure
from smollab.lab.probe.spec import ProbeSpec
from smollab.lab.zygote import Zygote
from smollab.rundir.runs import RunView


def step_times(rows: list[dict], command: str) -> list[tuple[int, float]]:
    """(step, seconds) per logged step: grpo logs step_s; pretrain logs cumulative train_s."""
    out = []
    if command == "grpo" or any(r.get("step_s") is not None for r in rows):
        for r in rows:
            if r.get("step_s") is not None and r.get("step") is not None:
                out.append((int(r["step"]), float(r["step_s"])))
        return out
    prev = None
    for r in rows:
        if r.get("train_s") is None or r.get("step") is None:
            continue
        if prev is not None and r["step"] - prev["step"] == 1:
            out.append((int(r["step"]), float(r["train_s"] - prev["train_s"])))
        prev = r
    return out


class ProcessLevel:
    """Measures one level by launching k real child processes."""

    def __init__(
        self,
        spec: ProbeSpec,
        overrides: list[str],
        probe_dir: Path,
        out,
        env: dict[str, str] | None = None,
        poll_s: float = 0.1,
        mps=None,
        zygote: Zygote | None = None,
        pss: bool = False,
    ):
        self.spec, self.overrides, self.dir, self.out = spec, overrides, probe_dir, out
        self.env, self.poll_s, self.mps = env, poll_s, mps
        self.zygote, self.pss = zygote, pss  # the warm start server; memory as PSS (docstring)
        self.mps_report: dict | None = None

    def __call__(self, k: int, threads: int | None) -> tuple[list[RunMeasure], float | None]:
        spec = self.spec
        level_dir = self.dir / f"k{k}"
        shutil.rmtree(level_dir, ignore_errors=True)
        kids = []
        for i in range(k):
            run_dir = level_dir / f"r{i}"
            ov = [*self.overrides, f"run.dir={run_dir}", "run.resume=never", f"run.seed={i}"]
            if threads:
                ov.append(f"perf.threads={threads}")
            kids.append(
                ch.launch(
                    f"k{k}r{i}",
                    ch.smollab_argv(spec.command, spec.base, ov),
                    run_dir,
                    threads=threads,
                    env=self.env,
                    zygote=self.zygote,
                )
            )
        tails = [ch.MetricsTail(RunView(c.run_dir).metrics_path) for c in kids]
        seen: list[dict[int, float]] = [{} for _ in kids]
        rss: list[float] = [0.0 for _ in kids]  # peak RSS, or the largest PSS seen (`pss`)
        errors: list[str | None] = [None for _ in kids]
        starts: list[float | None] = [None for _ in kids]  # launch to first logged step
        start, w0, w1 = time.time(), None, None
        checked_mps = False
        try:
            while True:
                now = time.time()
                for i, (c, t) in enumerate(zip(kids, tails, strict=True)):
                    rows = t.read()
                    if starts[i] is None and rows:
                        starts[i] = ch.first_row_s(rows, t.mtime, c.started)
                    for r in rows:
                        if r.get("step") is not None:
                            seen[i].setdefault(int(r["step"]), now)
                    rss[i] = max(rss[i], (c.pss_mb() if self.pss else c.peak_rss_mb()) or 0.0)
                    if c.poll() is not None and errors[i] is None:
                        errors[i] = (
                            f"run exited (code {c.proc.returncode}): {ch.last_log_line(c.run_dir)}"
                        )
                if any(errors):
                    break
                ready = [min((s for s in st if s > spec.warmup), default=None) for st in seen]
                if all(r is not None for r in ready):
                    if w0 is None:
                        w0 = now
                        if self.mps is not None and not checked_mps:
                            from smollab.lab.mps import check_clients

                            self.mps_report = check_clients(
                                [c.pid for c in kids], self.out, self.mps
                            )
                            checked_mps = True
                    counts = [sum(1 for ts in st.values() if ts > w0) for st in seen]
                    if min(counts) >= spec.steps:
                        w1 = now
                        break
                if now - start > spec.timeout_s:
                    errors = [e or f"timed out after {spec.timeout_s:.0f}s" for e in errors]
                    break
                time.sleep(self.poll_s)
        finally:
            ch.stop_all(kids, timeout=30)
        measures = []
        total = 0
        for i, (c, t) in enumerate(zip(kids, tails, strict=True)):
            t.invalidate()
            rows = t.read()
            times = [
                (s, dt)
                for s, dt in step_times(rows, spec.command)
                if w0 is not None
                and seen[i].get(s, math.inf) > w0
                and (w1 is None or seen[i].get(s, math.inf) <= w1)
            ]
            total += len(times)
            logged = [r.get("peak_mem_mb") for r in rows if r.get("peak_mem_mb")]
            mem = max(logged) if logged and not self.pss else (rss[i] or None)
            measures.append(
                RunMeasure(
                    step_s=statistics.median(dt for _, dt in times) if times else None,
                    steps=len(times),
                    peak_mem_mb=mem,
                    error=errors[i],
                    pid=c.pid,
                    start_s=starts[i],
                )
            )
        observed = total / (w1 - w0) if w0 and w1 and w1 > w0 else None
        return measures, observed
