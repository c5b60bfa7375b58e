"""What a sweep runs on: the device, how many trials at once, the executor that places them, the
CPU threads they divide, and the CPU peaks their MFU reads.

Plain functions of the spec, settled once before the first trial (the thread share again at each
launch). `Sweep` (`smollab.lab.sweep.scheduler`) calls them and holds what they return; it keeps
the state, this module keeps the decisions, so each reads on its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from smollab.lab import children as ch
from smollab.lab import start
from smollab.lab.sweep.spec import SweepSpec, resolve_config
from smollab.lab.zygote import Zygote
from smollab.rundir.runs import WARM_LOG


def detect_device(spec: SweepSpec) -> str:
    """The device kind the trials run on, from the base config with the spec's overrides."""
    from smollab.lab.probe.cache import device_kind

    return device_kind(resolve_config(spec, {}, spec.seeds[0]).perf.device)


def resolve_concurrency(
    spec: SweepSpec, sweep_dir: Path, device: str, say: Callable[[str], None]
) -> int:
    """The trials at once: the spec's number, the probe's best for `auto`, or the lanes."""
    if spec.executor == "lanes":  # the trials at once are the worker's lanes
        from smollab.lab.sweep.lanes_executor import resolve_lanes

        return resolve_lanes(spec, device, say)
    if spec.concurrency != "auto":
        return int(spec.concurrency)
    from smollab.lab.sweep.concurrency import auto_concurrency

    return auto_concurrency(spec, sweep_dir / "probe", device, out=say)


def start_executor(
    spec: SweepSpec, concurrency: int, device: str, sweep_dir: Path, say: Callable[[str], None]
) -> Any:
    """A RayExecutor or LanesExecutor as the spec's `executor` says; None for local children.
    Each imports only when chosen (Ray is an optional extra)."""
    if spec.executor == "ray":
        from smollab.lab.sweep.ray_executor import RayExecutor

        return RayExecutor(spec, concurrency, device, say)
    if spec.executor == "lanes":
        from smollab.lab.sweep.lanes_executor import LanesExecutor

        return LanesExecutor(spec, concurrency, sweep_dir, say)
    return None


def executor_threads(spec: SweepSpec, executor: Any, concurrency: int) -> int:
    """The CPU threads an executor's trials use together (the sweep's log and sweep.json)."""
    if spec.executor == "ray":  # the trials' CPU threads: what their Ray slots reserve
        return spec.threads or executor.cpu_threads(concurrency)
    return executor.cpu_threads(concurrency)  # lanes workers sharing the sweep's threads


def prepare_peaks(
    spec: SweepSpec, device: str, concurrency: int, total_threads: int, say: Callable[[str], None]
) -> None:
    """Measure the CPU peaks the trials' MFU needs now, before any trial competes."""
    from smollab.lab.peaks import prepare_sweep_peaks

    prepare_sweep_peaks(spec, device, concurrency, total_threads, say)


def mps_context(
    spec: SweepSpec, device: str, say: Callable[[str], None]
) -> AbstractContextManager[dict[str, str] | None]:
    """The CUDA MPS daemon for the sweep's life (`mps: true` on CUDA), yielding the children's
    env additions; else a context yielding None (on CUDA saying so when a daemon runs anyway:
    the trials attach to it, and concurrency auto read a time-sliced probe)."""
    if spec.mps and device == "cuda":
        from smollab.lab.mps import mps_daemon

        return mps_daemon(out=say)
    if device == "cuda":
        from smollab.lab.mps import daemon_in_the_way

        daemon_in_the_way(say)
    return contextlib.nullcontext(None)


def start_server(
    spec: SweepSpec, sweep_dir: Path, env: dict[str, str] | None, say: Callable[[str], None]
) -> Zygote | None:
    """The warm start server the trials fork from, ready, or None for cold starts; the sweep's
    log says which and why (`smollab.lab.start`)."""
    return start.open_server(
        spec.start,
        sweep_dir / WARM_LOG,
        say,
        env=env,
        refused=spec.warm_refused(),
    )


def user_sets_threads(spec: SweepSpec) -> bool:
    return "perf.threads" in spec.overrides or "perf.threads" in spec.space


def trial_threads(
    spec: SweepSpec,
    executor: Any,
    total_threads: int,
    concurrency: int,
    running: Collection[ch.Child],
    remaining: Callable[[], int],
) -> int | None:
    """A new trial's `perf.threads`: what its executor's slot reserves, else an even share of the
    threads the running trials leave free among the trials about to start (`remaining`, asked
    only then, counts those still to launch); None when the spec sets `perf.threads` itself."""
    if user_sets_threads(spec):
        return None
    if executor:  # what its Ray slot reserves
        return executor.trial_threads
    free = total_threads - sum(c.threads or 0 for c in running)
    n_start = max(1, min(concurrency - len(running), remaining() + 1))
    return ch.split_threads(max(free, 1), n_start)[0]
