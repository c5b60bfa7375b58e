"""The probe's levels (k runs at once), its stopping rules and its two optima; pure functions.

Aggregate throughput = sum over runs of 1 / median step time (steps/s), times tokens per step
(pretrain) or completions per step (grpo). The doubling stops when the aggregate falls `drop`
below the best so far, when on a CPU a level with more runs than threads does not beat the
best (more processes only share the same cores), when the next k would not fit in memory, when
a run fails (out of memory), or at `max_k` (and the MPS client limit).

Two optima, each with its rule in probe.json:
- best_throughput: the k with the highest aggregate steps/s (within 2%, the smaller k);
- best_latency: the largest k whose median step time stays within `latency_tolerance` of k = 1
  (packing that many costs each run almost nothing).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from smollab.lab.probe.spec import ProbeSpec

CUDA_CONTEXT_MB = 500.0  # per process, not in torch's allocator count


@dataclass
class RunMeasure:
    step_s: float | None
    steps: int
    peak_mem_mb: float | None = None
    error: str | None = None
    pid: int | None = None
    start_s: float | None = None  # launch to its first logged step (process levels)


@dataclass
class Level:
    k: int
    threads: int | None
    runs: list[RunMeasure]
    step_s: float | None = None  # median over runs of their median step time
    steps_per_s: float | None = None  # aggregate
    units_per_s: float | None = None  # tokens/s (pretrain) or completions/s (grpo)
    peak_mem_mb: float | None = None  # per process, the largest
    observed_steps_per_s: float | None = None  # counted by the parent over the window
    error: str | None = None
    mps: dict | None = None
    start_s: float | None = None  # median over runs of launch to first logged step

    def summarize(self, units_per_step: float | None) -> Level:
        good = [r for r in self.runs if r.step_s]
        if self.error is None and len(good) < self.k:
            bad = [r.error for r in self.runs if r.error]
            self.error = bad[0] if bad else "a run logged no steady-state steps"
        if good:
            self.step_s = statistics.median(r.step_s for r in good)
            self.steps_per_s = sum(1 / r.step_s for r in good)
            self.units_per_s = self.steps_per_s * units_per_step if units_per_step else None
        mems = [r.peak_mem_mb for r in self.runs if r.peak_mem_mb]
        self.peak_mem_mb = max(mems) if mems else None
        starts = [r.start_s for r in self.runs if r.start_s is not None]
        self.start_s = statistics.median(starts) if starts else None
        return self


MeasureFn = Callable[[int, "int | None"], tuple[list[RunMeasure], float | None]]


def next_k(
    levels: list[Level], spec: ProbeSpec, device: dict[str, Any], mps_on: bool
) -> tuple[int | None, str]:
    """The next k to measure, or None and why the probe stops (per k, its best thread split)."""
    levels = best_per_k(levels)
    last = levels[-1]
    if last.error:
        return None, f"k={last.k} failed: {last.error}"
    best = max((lv for lv in levels if lv.steps_per_s), key=lambda lv: lv.steps_per_s)
    if last.steps_per_s < (1 - spec.drop) * best.steps_per_s:
        fall = 1 - last.steps_per_s / best.steps_per_s
        return None, (
            f"aggregate throughput at k={last.k} is {100 * fall:.0f}% below the best "
            f"(k={best.k}), more than the {100 * spec.drop:.0f}% allowed"
        )
    cores = device.get("threads") or 0
    if device.get("kind") == "cpu" and cores and last.k > cores and best.k < last.k:
        # k processes on fewer cores share the same compute: once an oversubscribed level does
        # not beat the best, doubling again can only repeat that (it cost 2.5 min per level for
        # the 1.25M GRPO workload on 2 cores).
        return None, (
            f"k={last.k} runs oversubscribe the {cores} CPU threads and did not beat k={best.k}"
        )
    if spec.ks:
        later = [k for k in spec.ks if k > last.k]
        nxt = later[0] if later else None
        if nxt is None:
            return None, f"tried every k in {spec.ks}"
    else:
        nxt = last.k * 2
    if nxt > spec.max_k:
        return None, f"reached max_k={spec.max_k}"
    if mps_on and nxt > ch_mps_limit():
        return None, f"k={nxt} exceeds the MPS client limit of {ch_mps_limit()}"
    mem = device.get("memory_mb")
    per = last.peak_mem_mb
    if mem and per:
        extra = CUDA_CONTEXT_MB if device.get("kind") == "cuda" else 0.0
        need = nxt * (per + extra)
        if need > spec.mem_fraction * mem:
            return None, (
                f"k={nxt} would need about {need:,.0f} MB ({per + extra:,.0f} per run), "
                f"over {100 * spec.mem_fraction:.0f}% of {mem:,.0f} MB available"
            )
    return nxt, ""


def best_per_k(levels: list[Level]) -> list[Level]:
    """One level per k (its fastest thread split; a failed one only if all failed), by k."""
    out: dict[int, Level] = {}
    for lv in levels:
        cur = out.get(lv.k)
        if (
            cur is None
            or (cur.error and not lv.error)
            or (
                not lv.error
                and lv.steps_per_s
                and cur.steps_per_s
                and lv.steps_per_s > cur.steps_per_s
            )
        ):
            out[lv.k] = lv
    return [out[k] for k in sorted(out)]


def ch_mps_limit() -> int:
    from smollab.lab.mps import MAX_CLIENTS

    return MAX_CLIENTS


def optima(levels: list[Level], spec: ProbeSpec) -> tuple[dict | None, dict | None]:
    ok = sorted((lv for lv in levels if lv.steps_per_s and not lv.error), key=lambda lv: lv.k)
    if not ok:
        return None, None
    top = max(lv.steps_per_s for lv in ok)
    bt = min(
        (lv for lv in ok if lv.steps_per_s >= 0.98 * top), key=lambda lv: (lv.k, lv.threads or 0)
    )
    k0 = ok[0].k
    base = min((lv for lv in ok if lv.k == k0), key=lambda lv: lv.step_s)
    within = [lv for lv in ok if lv.step_s <= (1 + spec.latency_tolerance) * base.step_s]
    bl = max(within, key=lambda lv: (lv.k, lv.steps_per_s)) if within else base

    def pick(lv: Level, rule: str) -> dict:
        return {
            "k": lv.k,
            "threads_per_run": lv.threads,
            "step_s": lv.step_s,
            "steps_per_s": lv.steps_per_s,
            "units_per_s": lv.units_per_s,
            "speedup_vs_k1": lv.steps_per_s / base.steps_per_s if base.steps_per_s else None,
            "rule": rule,
        }

    return (
        pick(
            bl,
            f"the largest k whose median step time is within {100 * spec.latency_tolerance:.0f}% "
            f"of the fastest k={base.k} run ({base.k} x {base.threads} threads, {base.step_s:.4g}s)",
        ),
        pick(bt, "the k with the highest aggregate steps/s (within 2% of the top, the smallest k)"),
    )
