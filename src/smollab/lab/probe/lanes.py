"""The probe's lane counts (`lanes: [1, 2, 4, 8]`): N GRPO runs as lanes of one process,
and, with `lane_workers: [1, 2]`, as W concurrent processes of N lanes each.

For each W and N, W `smollab lanes grpo BASE ... --lane "run.seed=0 ..." ... --lane "..."`
processes run at once (each on the probe's threads / W, at least 1, as the process levels
split them) until each has logged `steps` steps after the last one passed its `warmup`, then
are stopped. A lanes iteration steps every lane of a process at once and each lane logs its
time as `step_s`, so a process's iteration time is the median over its lanes of their median
`step_s` in that window, and the level's aggregate is the sum over processes of N lane steps
per iteration: steps/s = sum N / step_s, completions/s = steps/s x train.batch_size, the same
units as the process levels' aggregate (k runs' steps/s summed), so all are compared directly
and the probe recommends the best of processes, lanes and workers x lanes.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from smollab.lab import children as ch
from smollab.lab.probe.measure import step_times
from smollab.lab.probe.spec import ProbeSpec
from smollab.lab.zygote import Zygote
from smollab.rundir.runs import RunView


@dataclass
class LaneLevel:
    lanes: int  # per process
    threads: int | None  # per process
    step_s: float | None = None  # seconds per lanes iteration (median over processes and lanes)
    steps: int = 0  # steady-state steps measured per lane (the fewest of any lane)
    steps_per_s: float | None = None  # aggregate lane steps/s: sum over processes of lanes / step_s
    units_per_s: float | None = None  # completions/s: steps_per_s x train.batch_size
    peak_mem_mb: float | None = None  # per process, the largest
    error: str | None = None
    workers: int = 1  # concurrent `smollab lanes grpo` processes of `lanes` lanes each
    worker_step_s: list[float] = field(default_factory=list)  # each process's iteration time


LanesMeasureFn = Callable[[int, int, int], LaneLevel]  # (lanes, threads per process, workers)


def label(lv: LaneLevel | dict) -> str:
    """`lanes=4`, or `2 workers x lanes=4`: how messages and the table name a level."""
    n, w = (
        (lv.lanes, lv.workers) if isinstance(lv, LaneLevel) else (lv["lanes"], lv.get("workers", 1))
    )
    return f"lanes={n}" if w == 1 else f"{w} workers x lanes={n}"


class LanesProcess:
    """Measures one level with `workers` real `smollab lanes grpo` processes of n lanes each."""

    def __init__(
        self,
        spec: ProbeSpec,
        overrides: list[str],
        probe_dir: Path,
        out: Any,
        env: dict[str, str] | None = None,
        poll_s: float = 0.1,
        zygote: Zygote | None = None,
        pss: bool = False,
    ):
        self.spec, self.overrides, self.dir, self.out = spec, overrides, probe_dir, out
        self.env, self.poll_s = env, poll_s
        self.zygote, self.pss = zygote, pss  # as `ProcessLevel`'s: memory as PSS when warm

    def __call__(self, n: int, threads: int, workers: int = 1) -> LaneLevel:
        spec = self.spec
        name = f"lanes{n}" if workers == 1 else f"lanes{n}x{workers}"
        level_dir = (self.dir / name).absolute()
        shutil.rmtree(level_dir, ignore_errors=True)
        proc_dirs = [level_dir] if workers == 1 else [level_dir / f"p{j}" for j in range(workers)]
        kids, tails = [], []
        for j, pdir in enumerate(proc_dirs):
            run_dirs = [pdir / f"l{i}" for i in range(n)]
            args = [
                "grpo",
                *([spec.base] if spec.base else []),
                *self.overrides,
                "run.resume=never",
            ]
            for i, d in enumerate(run_dirs):
                args += ["--lane", f"run.seed={j * n + i} run.dir={d}"]
            args += ["--threads", str(threads)]
            kids.append(
                ch.launch(
                    f"{name}p{j}",
                    ch.lanes_argv(args),
                    pdir,
                    threads=threads,
                    env=self.env,
                    zygote=self.zygote,
                )
            )
            tails.append([ch.MetricsTail(RunView(d).metrics_path) for d in run_dirs])
        # when each process's steps were first seen (its lanes step together: lane 0 is its
        # clock); the window opens when the last process has passed its warm-up
        seen: list[dict[int, float]] = [{} for _ in kids]
        rss, error, start, w0 = 0.0, None, time.time(), None
        try:
            while True:
                now = time.time()
                for j, kid in enumerate(kids):
                    rss = max(rss, (kid.pss_mb() if self.pss else kid.peak_rss_mb()) or 0.0)
                    for s, _ in step_times(tails[j][0].read(), "grpo"):
                        seen[j].setdefault(s, now)
                    if error is None and kid.poll() is not None:
                        error = (
                            f"run exited (code {kid.proc.returncode}): "
                            f"{ch.last_log_line(kid.run_dir)}"
                        )
                if error:
                    break
                if w0 is None and all(any(s > spec.warmup for s in st) for st in seen):
                    w0 = now
                if w0 is not None and all(
                    sum(1 for t in st.values() if t > w0) >= spec.steps for st in seen
                ):
                    break
                if now - start > spec.timeout_s:
                    error = f"timed out after {spec.timeout_s:.0f}s"
                    break
                time.sleep(self.poll_s)
        finally:
            ch.stop_all(kids, timeout=30)
        per_proc, counts, mems = [], [], []
        for j, lane_tails in enumerate(tails):
            window = set(sorted(s for s, t in seen[j].items() if w0 and t > w0)[: spec.steps])
            medians = []
            for t in lane_tails:
                t.invalidate()  # read the file whole once more
                rows = t.read()
                times = [dt for s, dt in step_times(rows, "grpo") if s in window]
                counts.append(len(times))
                if times:
                    medians.append(statistics.median(times))
                mems += [r["peak_mem_mb"] for r in rows if r.get("peak_mem_mb")]
            if len(medians) == n:
                per_proc.append(statistics.median(medians))
        lv = LaneLevel(
            lanes=n,
            threads=threads,
            workers=workers,
            steps=min(counts),
            error=error,
            peak_mem_mb=max(mems) if mems and not self.pss else (rss or None),
        )
        if error is None and len(per_proc) < workers:
            lv.error = "a lane logged no steady-state steps"
        if lv.error is None:
            lv.step_s, lv.worker_step_s = statistics.median(per_proc), per_proc
        return lv


def summarize(lv: LaneLevel, batch_size: int) -> LaneLevel:
    if lv.step_s:
        per = lv.worker_step_s or [lv.step_s] * lv.workers
        lv.steps_per_s = sum(lv.lanes / s for s in per)
        lv.units_per_s = lv.steps_per_s * batch_size
    return lv


def next_lanes(levels: list[LaneLevel], spec: ProbeSpec) -> tuple[int | None, str]:
    """The next lane count to measure with the same workers, or None and why the climb stops:
    a failed level (more lanes would not fit either), an aggregate `drop` below the best of
    these workers, or the list's end."""
    last = levels[-1]
    if last.error:
        return None, f"{label(last)} failed: {last.error}"
    best = max((lv for lv in levels if lv.steps_per_s), key=lambda lv: lv.steps_per_s)
    if last.steps_per_s < (1 - spec.drop) * best.steps_per_s:
        fall = 1 - last.steps_per_s / best.steps_per_s
        return None, (
            f"aggregate throughput at {label(last)} is {100 * fall:.0f}% below "
            f"the best ({label(best)})"
        )
    later = [n for n in spec.lanes or [] if n > last.lanes]
    return (later[0], "") if later else (None, f"tried every lane count in {spec.lanes}")


BEST_RULE = (
    "the workers x lanes with the highest aggregate steps/s (within 2% of the top, the "
    "fewest trials at once, then the fewest workers)"
)


def pick_best(levels: list[dict]) -> dict | None:
    """The best of lane levels as probe.json records them (a cache of an older probe has no
    `workers`: one process each), by `BEST_RULE`; None if none succeeded."""
    ok = [lv for lv in levels if lv.get("steps_per_s") and not lv.get("error")]
    if not ok:
        return None
    top = max(lv["steps_per_s"] for lv in ok)
    near = [lv for lv in ok if lv["steps_per_s"] >= 0.98 * top]
    return min(near, key=lambda lv: (lv["lanes"] * lv.get("workers", 1), lv.get("workers", 1)))


def best_lanes(levels: list[LaneLevel], best_processes: dict | None) -> dict | None:
    lv = pick_best([asdict(lv) for lv in levels])
    if lv is None:
        return None
    vs = (best_processes or {}).get("steps_per_s")
    return {
        "lanes": lv["lanes"],
        "workers": lv["workers"],
        "threads": lv["threads"],
        "step_s": lv["step_s"],
        "steps_per_s": lv["steps_per_s"],
        "units_per_s": lv["units_per_s"],
        "vs_best_processes": lv["steps_per_s"] / vs if vs else None,
        "rule": BEST_RULE,
    }


def sweep_keys(lanes: int, workers: int) -> str:
    return f"executor: lanes, lanes: {lanes}" + (
        f", lane_workers: {workers}" if workers > 1 else ""
    )


def recommend(best_processes: dict | None, lanes: dict | None) -> dict | None:
    """Processes or (workers x) lanes: whichever gives the higher aggregate steps/s (and so
    units/s)."""
    if not lanes and not best_processes:
        return None
    if lanes and (not best_processes or lanes["steps_per_s"] > best_processes["steps_per_s"]):
        w = lanes.get("workers", 1)
        return {
            "executor": "lanes",
            "lanes": lanes["lanes"],
            "lane_workers": w,
            "steps_per_s": lanes["steps_per_s"],
            "units_per_s": lanes["units_per_s"],
            "sweep": sweep_keys(lanes["lanes"], w),
        }
    bp = best_processes
    return {
        "executor": "local",
        "concurrency": bp["k"],
        "steps_per_s": bp["steps_per_s"],
        "units_per_s": bp["units_per_s"],
        "sweep": f"concurrency: {bp['k']}",
    }


def lanes_table(result: dict[str, Any]) -> list[str]:
    """The lane levels, in the process table's columns (threads and MB: per process)."""
    levels = result.get("lanes") or []
    if not levels:
        return []
    unit = result.get("unit") or "units/s"
    head = (
        f"{'workers':>7} {'lanes':>5} {'threads':>7} {'step ms':>9} {'steps/s':>9} "
        f"{unit:>14} {'MB':>9}  note"
    )
    lines = [head, "-" * len(head)]
    bl = result.get("best_lanes") or {}
    best = (bl.get("workers", 1), bl.get("lanes"))

    def f(v, fmt):
        return format(v, fmt) if v is not None else "-"

    for lv in levels:
        w = lv.get("workers", 1)
        note = ", ".join(
            x
            for x in ("best lanes" if (w, lv["lanes"]) == best else "", lv.get("error") or "")
            if x
        )
        lines.append(
            f"{w:>7} {lv['lanes']:>5} {f(lv['threads'], '>7')} "
            f"{f(lv['step_s'] * 1000 if lv['step_s'] else None, '>9.1f')} "
            f"{f(lv['steps_per_s'], '>9.2f')} {f(lv['units_per_s'], '>14,.0f')} "
            f"{f(lv['peak_mem_mb'], '>9,.0f')}  {note}"
        )
    return lines


def recommendation_line(result: dict[str, Any]) -> str | None:
    rec, bl, bt = result.get("recommended"), result.get("best_lanes"), result.get("best_throughput")
    if not rec:
        return None
    unit = result.get("unit") or "units/s"
    rate = (
        f"{rec['units_per_s']:,.0f} {unit}"
        if rec.get("units_per_s")
        else f"{rec['steps_per_s']:.2f} steps/s"
    )
    if rec["executor"] == "lanes":
        vs = (
            f", {bl['vs_best_processes']:.2f}x the best process packing (k={bt['k']})"
            if bt and bl.get("vs_best_processes")
            else ""
        )
        w = rec.get("lane_workers", 1)
        what = (
            f"{rec['lanes']} lanes in one process"
            if w == 1
            else f"{w} workers x {rec['lanes']} lanes ({w} processes, {bl['threads']} thread(s) each)"
        )
        return f"recommended: {what} ({rate}{vs}); a sweep: {rec['sweep']}"
    vs = (
        f"; lanes top out at {bl['vs_best_processes']:.2f}x it ({label(bl)})"
        if bl and bl.get("vs_best_processes")
        else ""
    )
    return f"recommended: {rec['concurrency']} processes ({rate}{vs}); a sweep: {rec['sweep']}"
