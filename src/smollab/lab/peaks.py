"""The CPU matmul peaks a sweep measures before it launches any trial, for the trials' MFU.

A CPU's peak is measured, and a measurement taken while other processes compete reads low; so
lab children never measure (`smollab.device.mfu`): they read the cache or report no MFU. The
sweep parent therefore measures, while nothing of its own runs yet, every (dtype, threads) its
pretraining trials will use: the thread shares it hands out (or the `perf.threads` the spec
sets) and the precision each trial will really run (fp32 where the CPU has no native bf16/fp16
matmul). The shares are those of all threads over 1, 2, ... `concurrency` trials starting
together (the last trial of a sweep often runs alone, with every thread); a rarer share (two
trials of different shares ending at once) may be missing: that trial reports no MFU rather than
a wrong one.

The probe and the bench do not measure: neither reports MFU, and a measurement in the bench
would add seconds to the first variant's wall time only. Their children read what is cached.
"""

from __future__ import annotations

from collections.abc import Callable

from smollab.lab import children as ch
from smollab.lab.sweep.spec import Distribution, SweepSpec, resolve_config


def sweep_thread_counts(spec: SweepSpec, concurrency: int, total_threads: int) -> set[int]:
    """The `perf.threads` the sweep's trials run with."""
    if "perf.threads" in spec.overrides:
        values = [spec.overrides["perf.threads"]]
    elif "perf.threads" in spec.space:
        dist = spec.space["perf.threads"]
        if isinstance(dist, Distribution):
            step = int(dist.step or 1)
            values = list(range(int(dist.low), int(dist.high) + 1, step))
        else:
            values = list(dist)
    else:  # `total` over n trials starting together, n = 1 (the last one alone) ... concurrency
        return {
            t for n in range(1, max(1, concurrency) + 1) for t in ch.split_threads(total_threads, n)
        }
    return {int(v) for v in values if isinstance(v, int | float) and v >= 1}


def sweep_precisions(spec: SweepSpec) -> set[str]:
    """The `perf.precision` values the sweep's trials ask for."""
    values = spec.space.get("perf.precision")
    if isinstance(values, list):
        return {str(v) for v in values}
    return {resolve_config(spec, {}, spec.seeds[0]).perf.precision}


def prepare_sweep_peaks(
    spec: SweepSpec, device: str, concurrency: int, total_threads: int, out: Callable[[str], None]
) -> list[tuple[str, int]]:
    """Measure and cache the CPU peaks a CPU pretraining sweep's trials will read; returns the
    (dtype, threads) measured now. Anything else (GPU, GRPO, all cached) measures nothing."""
    if spec.command not in ("pretrain", "sft") or device != "cpu":
        return []
    from smollab.device.mfu import cpu_peak_missing, cpu_run_dtype, ensure_cpu_peak

    # The precision each trial really runs: setup_runtime's own rule, so the keys cannot drift.
    dtypes = {cpu_run_dtype(p) for p in sweep_precisions(spec)}
    threads = sweep_thread_counts(spec, concurrency, total_threads)
    missing = [(d, t) for d in sorted(dtypes) for t in sorted(threads) if cpu_peak_missing(d, t)]
    if missing:
        out(
            f"MFU: measuring the CPU matmul peak for {len(missing)} setting(s) before any trial "
            f"starts (trials only read it: measured while they run, it would read low)"
        )
        for dtype, t in missing:
            ensure_cpu_peak(dtype, t, log=lambda m: out(f"  {m}"))
    return missing
