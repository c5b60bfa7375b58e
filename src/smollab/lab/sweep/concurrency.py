"""`concurrency: auto`: how many trials a sweep runs at once, from the probe of its workload.

The probe's cached result for this device and workload signature is used when there is one;
otherwise a quick probe runs first (and is cached for the next sweep). On CUDA the probe runs
under the sweep's own MPS setting (`mps`, default false), and the signature records it: k runs
time-slicing the GPU and k runs sharing it through the MPS daemon pack very differently, so a
concurrency measured in one regime says nothing about the other.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from smollab.lab import children as ch
from smollab.lab.probe.cache import (
    cache_lookup,
    cache_path,
    device_info,
    device_key,
    mps_daemon_setting,
    workload_signature,
)
from smollab.lab.probe.run import Probe
from smollab.lab.probe.spec import ProbeSpec
from smollab.lab.spec_common import override_value
from smollab.lab.sweep.spec import SweepSpec, resolve_config


def auto_concurrency(
    sweep_spec: SweepSpec,
    probe_dir: Path,
    device_kind: str,
    out: Callable[[str], None] = print,
    probe_kw: dict[str, Any] | None = None,
) -> int:
    """The cached probe of this workload on this device, else a quick probe: its best k."""
    point = sweep_spec.grid_points()[0] if sweep_spec.sampler == "grid" else {}
    cfg = resolve_config(sweep_spec, point, sweep_spec.seeds[0])
    threads = sweep_spec.threads or ch.cpu_count()
    device = (probe_kw or {}).get("device") or device_info(device_kind, threads)
    mps = mps_daemon_setting(device_kind, sweep_spec.mps)
    regime = "" if mps is None else f", MPS daemon {'on' if mps else 'off'}"
    signature = workload_signature(sweep_spec.command, cfg, mps)
    hit = cache_lookup(device, signature)
    if hit and hit.get("best_throughput"):
        k = int(hit["best_throughput"]["k"])
        out(
            f"concurrency auto: {k} (best throughput of the probe of {hit.get('created')} on "
            f"{device_key(device)}{regime}; {cache_path(device, signature)})"
        )
        return k
    out(
        f"concurrency auto: no probe of this workload on this device{regime} yet; running a "
        "quick probe first (warm-up 3 steps, 10 measured, k up to 8)"
    )
    other = None if mps is None else workload_signature(sweep_spec.command, cfg, not mps)
    if other and cache_lookup(device, other):
        out(
            f"concurrency auto: (a probe with the MPS daemon {'off' if mps else 'on'} is cached, "
            f"but this sweep runs with mps: {str(mps).lower()})"
        )
    overrides = [f"{k}={override_value(v)}" for k, v in sweep_spec.overrides.items()]
    overrides += [f"{k}={override_value(v)}" for k, v in point.items()]
    spec = ProbeSpec(
        command=sweep_spec.command,
        base=sweep_spec.base,
        warmup=3,
        steps=10,
        max_k=8,
        threads=sweep_spec.threads,
        mps=sweep_spec.mps,
        dir=str(probe_dir),
        # the runs start as the trials will: a cold process holds more memory than a warm fork
        start=sweep_spec.start if sweep_spec.warm_refused() is None else "cold",
    )
    result = Probe(spec, overrides, out=out, **(probe_kw or {})).run(probe_dir)
    best = result.get("best_throughput")
    if not best:
        out(
            f"concurrency auto: the probe found no working k ({result.get('stop_reason')}); using 1"
        )
        return 1
    out(f"concurrency auto: {best['k']} from the probe just run")
    return int(best["k"])
