"""The probe's lane counts (`lanes: [1, 2, 4, 8]`): N GRPO LoRA runs as lanes of one process.

For each N one `smollab lanes grpo BASE ... --lane "run.seed=0 ..." ... --lane "run.seed=N-1 ..."`
runs (on all the probe's threads) until every lane has logged `warmup` + `steps` steps, then is
stopped. A lanes iteration steps every lane at once and each lane logs its time as `step_s`, so
a level's step time is the median over lanes of their median `step_s` past the warm-up, and its
aggregate is N lane steps per iteration: steps/s = N / step_s, completions/s = N x
train.batch_size / step_s, the same units as the process levels' aggregate (k runs' steps/s
summed), so the two are compared directly and the probe recommends the better.
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smollab.lab import children as ch
from smollab.lab.probe.measure import step_times
from smollab.lab.probe.spec import ProbeSpec
from smollab.runs import RunView


@dataclass
class LaneLevel:
    lanes: int
    threads: int | None
    step_s: float | None = None  # seconds per lanes iteration (median over lanes and steps)
    steps: int = 0  # steady-state steps measured per lane (the fewest of any lane)
    steps_per_s: float | None = None  # aggregate lane steps/s: lanes / step_s
    units_per_s: float | None = None  # completions/s: steps_per_s x train.batch_size
    peak_mem_mb: float | None = None  # the one process's
    error: str | None = None


LanesMeasureFn = Callable[[int, int], LaneLevel]


class LanesProcess:
    """Measures one lane count with one real `smollab lanes grpo` process."""

    def __init__(self, spec: ProbeSpec, overrides: list[str], probe_dir: Path, out: Any,
                 env: dict[str, str] | None = None, poll_s: float = 0.1):  # fmt: skip
        self.spec, self.overrides, self.dir, self.out = spec, overrides, probe_dir, out
        self.env, self.poll_s = env, poll_s

    def __call__(self, n: int, threads: int) -> LaneLevel:
        spec = self.spec
        level_dir = (self.dir / f"lanes{n}").absolute()
        shutil.rmtree(level_dir, ignore_errors=True)
        run_dirs = [level_dir / f"l{i}" for i in range(n)]
        args = ["grpo", *([spec.base] if spec.base else []), *self.overrides, "run.resume=never"]
        for i, d in enumerate(run_dirs):
            args += ["--lane", f"run.seed={i} run.dir={d}"]
        args += ["--threads", str(threads)]
        child = ch.launch(f"lanes{n}", ch.lanes_argv(args), level_dir, threads=threads,
                          env=self.env)  # fmt: skip
        tails = [ch.MetricsTail(RunView(d).metrics_path) for d in run_dirs]
        need = spec.warmup + spec.steps
        rss, error, start = 0.0, None, time.time()
        try:
            while True:
                rss = max(rss, child.peak_rss_mb() or 0.0)
                logged = [len(step_times(t.read(), "grpo")) for t in tails]
                if min(logged) >= need:
                    break
                if child.poll() is not None:
                    error = (
                        f"run exited (code {child.proc.returncode}): {ch.last_log_line(level_dir)}"
                    )
                    break
                if time.time() - start > spec.timeout_s:
                    error = f"timed out after {spec.timeout_s:.0f}s"
                    break
                time.sleep(self.poll_s)
        finally:
            ch.stop_all([child], timeout=30)
        per_lane, counts, mems = [], [], []
        for t in tails:
            t.invalidate()  # read the file whole once more
            rows = t.read()
            times = [dt for s, dt in step_times(rows, "grpo") if s > spec.warmup][: spec.steps]
            counts.append(len(times))
            if times:
                per_lane.append(statistics.median(times))
            mems += [r["peak_mem_mb"] for r in rows if r.get("peak_mem_mb")]
        lv = LaneLevel(lanes=n, threads=threads, steps=min(counts), error=error,
                       peak_mem_mb=max(mems) if mems else (rss or None))  # fmt: skip
        if error is None and len(per_lane) < n:
            lv.error = "a lane logged no steady-state steps"
        if per_lane and lv.error is None:
            lv.step_s = statistics.median(per_lane)
        return lv


def summarize(lv: LaneLevel, batch_size: int) -> LaneLevel:
    if lv.step_s:
        lv.steps_per_s = lv.lanes / lv.step_s
        lv.units_per_s = lv.steps_per_s * batch_size
    return lv


def next_lanes(levels: list[LaneLevel], spec: ProbeSpec) -> tuple[int | None, str]:
    """The next lane count to measure, or None and why the lanes stop: a failed level (more
    lanes would not fit either), an aggregate `drop` below the best, or the list's end."""
    last = levels[-1]
    if last.error:
        return None, f"lanes={last.lanes} failed: {last.error}"
    best = max((lv for lv in levels if lv.steps_per_s), key=lambda lv: lv.steps_per_s)
    if last.steps_per_s < (1 - spec.drop) * best.steps_per_s:
        fall = 1 - last.steps_per_s / best.steps_per_s
        return None, (f"aggregate throughput at lanes={last.lanes} is {100 * fall:.0f}% below "
                      f"the best (lanes={best.lanes})")  # fmt: skip
    later = [n for n in spec.lanes or [] if n > last.lanes]
    return (later[0], "") if later else (None, f"tried every lane count in {spec.lanes}")


def best_lanes(levels: list[LaneLevel], best_processes: dict | None) -> dict | None:
    """The lane count with the highest aggregate (within 2% of the top, the fewest lanes)."""
    ok = [lv for lv in levels if lv.steps_per_s and not lv.error]
    if not ok:
        return None
    top = max(lv.steps_per_s for lv in ok)
    lv = min((lv for lv in ok if lv.steps_per_s >= 0.98 * top), key=lambda lv: lv.lanes)
    vs = (best_processes or {}).get("steps_per_s")
    return {"lanes": lv.lanes, "threads": lv.threads, "step_s": lv.step_s,
            "steps_per_s": lv.steps_per_s, "units_per_s": lv.units_per_s,
            "vs_best_processes": lv.steps_per_s / vs if vs else None,
            "rule": "the lane count with the highest aggregate steps/s (within 2% of the top, "
                    "the fewest lanes)"}  # fmt: skip


def recommend(best_processes: dict | None, lanes: dict | None) -> dict | None:
    """Processes or lanes: whichever gives the higher aggregate steps/s (and so units/s)."""
    if not lanes and not best_processes:
        return None
    if lanes and (not best_processes or lanes["steps_per_s"] > best_processes["steps_per_s"]):
        return {"executor": "lanes", "lanes": lanes["lanes"], "steps_per_s": lanes["steps_per_s"],
                "units_per_s": lanes["units_per_s"], "sweep": f"executor: lanes, lanes: {lanes['lanes']}"}  # fmt: skip
    bp = best_processes
    return {"executor": "local", "concurrency": bp["k"], "steps_per_s": bp["steps_per_s"],
            "units_per_s": bp["units_per_s"], "sweep": f"concurrency: {bp['k']}"}  # fmt: skip


def lanes_table(result: dict[str, Any]) -> list[str]:
    """The lane levels, in the process table's columns (MB: the one process's)."""
    levels = result.get("lanes") or []
    if not levels:
        return []
    unit = result.get("unit") or "units/s"
    head = f"{'lanes':>5} {'threads':>7} {'step ms':>9} {'steps/s':>9} {unit:>14} {'MB':>9}  note"
    lines = [head, "-" * len(head)]
    best = (result.get("best_lanes") or {}).get("lanes")

    def f(v, fmt):
        return format(v, fmt) if v is not None else "-"

    for lv in levels:
        note = ", ".join(
            x for x in ("best lanes" if lv["lanes"] == best else "", lv.get("error") or "") if x
        )
        lines.append(f"{lv['lanes']:>5} {f(lv['threads'], '>7')} "
                     f"{f(lv['step_s'] * 1000 if lv['step_s'] else None, '>9.1f')} "
                     f"{f(lv['steps_per_s'], '>9.2f')} {f(lv['units_per_s'], '>14,.0f')} "
                     f"{f(lv['peak_mem_mb'], '>9,.0f')}  {note}")  # fmt: skip
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
        return f"recommended: {rec['lanes']} lanes in one process ({rate}{vs}); a sweep: {rec['sweep']}"
    vs = (
        f"; lanes top out at {bl['vs_best_processes']:.2f}x it (lanes={bl['lanes']})"
        if bl and bl.get("vs_best_processes")
        else ""
    )
    return f"recommended: {rec['concurrency']} processes ({rate}{vs}); a sweep: {rec['sweep']}"
