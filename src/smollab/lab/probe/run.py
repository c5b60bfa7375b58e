"""`smollab probe WORKLOAD`: how many identical runs does this device hold at once?

For k = 1, 2, 4, ... the probe launches k copies of the workload (through `children.launch`,
forked from one warm start server for the whole probe where `start` resolves to warm, each
with its CPU threads = available / k; on CUDA under the MPS daemon unless `mps: false`, so that
it measures the regime the sweep will run in), lets each pass `warmup`
logged steps, and then measures only while *all k* run (`smollab.lab.probe.measure`). The
doubling stops by the rules of `smollab.lab.probe.levels`, which also picks the two optima,
best_throughput and best_latency. With `bisect`, k between the last good and the first bad level
are tried by bisection.

The result is cached per device and workload signature (`smollab.lab.probe.cache`; on CUDA the
signature records the MPS setting), which is what `concurrency: auto` in a sweep reads
(`smollab.lab.sweep.concurrency`).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from smollab.lab import children as ch
from smollab.lab import start
from smollab.lab.probe.cache import (
    cache_store,
    device_info,
    device_kind,
    lanes_signature,
    mps_daemon_setting,
    workload_signature,
)
from smollab.lab.probe.lanes import (
    LaneLevel,
    LanesMeasureFn,
    LanesProcess,
    best_lanes,
    label,
    lanes_table,
    next_lanes,
    recommend,
    recommendation_line,
    summarize,
)
from smollab.lab.probe.levels import Level, MeasureFn, best_per_k, next_k, optima
from smollab.lab.probe.measure import ProcessLevel
from smollab.lab.probe.report import memory_line, mps_line, plot_probe, table
from smollab.lab.probe.spec import ProbeSpec
from smollab.lab.zygote import Zygote
from smollab.rundir.atomic import atomic_write_json
from smollab.rundir.runs import WARM_LOG


class Probe:
    def __init__(
        self,
        spec: ProbeSpec,
        overrides: list[str],
        out=None,
        measure: MeasureFn | None = None,
        device: dict[str, Any] | None = None,
        mps=None,
        lanes_measure: LanesMeasureFn | None = None,
    ):
        self.spec = spec
        self.overrides = overrides
        self.out = out or (lambda m: print(m, flush=True))
        self._measure = measure
        self._lanes_measure = lanes_measure
        self.device = device
        self.mps = mps
        self.threads_total = spec.threads or ch.cpu_count()

    def units(self, cfg) -> tuple[float | None, str]:
        if self.spec.command == "grpo":
            return float(cfg.train.batch_size), "completions/s"
        if hasattr(cfg.train, "seq_len"):
            return float(
                cfg.train.batch_size * cfg.train.seq_len * cfg.train.grad_accum
            ), "tokens/s"
        return None, ""

    def run(self, probe_dir: Path) -> dict[str, Any]:
        from smollab.config.load import load_config

        spec = self.spec
        cfg = load_config(spec.command, spec.base, self.overrides)
        kind = self.device["kind"] if self.device else device_kind(cfg.perf.device)
        device = self.device or device_info(kind, self.threads_total)
        units_per_step, unit_name = self.units(cfg)
        mps_setting = mps_daemon_setting(kind, spec.mps)
        mps_on = bool(mps_setting)
        signature = workload_signature(spec.command, cfg, mps_setting)
        from smollab.models.loading import check_model_source

        check_model_source(cfg.model)  # every run loads it: a missing one stops here, once
        probe_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_data(cfg)
        self.out(
            f"probe {probe_dir}: {spec.command} {spec.base or '(schema defaults)'} on {device['kind']} "
            f"({device['name']}), {self.threads_total} CPU threads"
            + ("" if mps_setting is None else f", MPS daemon {'on' if mps_on else 'off'}")
            + f"; warm-up {spec.warmup} steps, then {spec.steps} steps per run while all run"
        )

        with self._server(probe_dir) as zygote:
            warm = zygote is not None
            pss = warm and kind == "cpu"  # a warm run's memory: its PSS (`ProcessLevel`)
            ctx: contextlib.AbstractContextManager = contextlib.nullcontext(None)
            in_the_way = None
            if mps_on:
                from smollab.lab.mps import MPS, mps_daemon

                self.mps = self.mps or MPS()
                ctx = mps_daemon(out=self.out, mps=self.mps)
            elif mps_setting is False:  # time-slicing asked for: unless a daemon runs anyway
                from smollab.lab.mps import daemon_in_the_way

                if in_the_way := daemon_in_the_way(self.out, self.mps):
                    self.mps = in_the_way  # the runs are its clients: measured and cached so
            levels: list[Level] = []
            with ctx as mps_env:
                mps_used = mps_env is not None or in_the_way is not None
                measure = self._measure or ProcessLevel(
                    spec,
                    self._child_overrides(),
                    probe_dir,
                    self.out,
                    env={**os.environ, **mps_env} if mps_env else None,
                    mps=self.mps if mps_used else None,
                    zygote=zygote,
                    pss=pss,
                )
                k: int | None = spec.ks[0] if spec.ks else 1
                reason = ""
                while k is not None:
                    t = self._threads(k)
                    levels.append(self._level(measure, k, units_per_step, unit_name, t))
                    if kind == "cpu" and spec.split and t > 1 and not levels[-1].error:
                        levels.append(self._level(measure, k, units_per_step, unit_name, 1))
                    k, reason = next_k(levels, spec, device, mps_used)
                if spec.bisect:
                    reason += self._bisect(
                        levels, measure, units_per_step, unit_name, device, mps_used
                    )
            if mps_setting is not None:  # cached under the regime measured, not the one asked for
                signature = workload_signature(spec.command, cfg, mps_used)
            best_latency, best_throughput = optima(levels, spec)
            lanes: dict[str, Any] = {}
            if spec.lanes:  # one process: outside the MPS daemon
                lane_levels, lanes_reason = self._measure_lanes(
                    probe_dir, cfg.train.batch_size, unit_name, zygote, pss
                )
                best_l = best_lanes(lane_levels, best_throughput)
                lanes = {
                    "lanes": [asdict(lv) for lv in lane_levels],
                    "lanes_stop_reason": lanes_reason,
                    "best_lanes": best_l,
                    "recommended": recommend(best_throughput, best_l),
                }
        result = {
            "device": device,
            "workload": signature,
            "command": spec.command,
            "base": spec.base,
            "mps_daemon": (
                None if mps_setting is None else {"requested": bool(mps_setting), "used": mps_used}
            ),
            "overrides": self.overrides,
            "unit": unit_name,
            "threads_total": self.threads_total,
            "start": "warm" if warm else "cold",
            "run_memory": "pss" if pss else "peak",
            "levels": [
                _level_dict(lv) for lv in sorted(levels, key=lambda lv: (lv.k, lv.threads or 0))
            ],
            "stop_reason": reason,
            "best_latency": best_latency,
            "best_throughput": best_throughput,
            "spec": spec.model_dump(mode="json"),
            "created": time.strftime("%Y-%m-%d %H:%M:%S"),
            **lanes,
        }
        atomic_write_json(probe_dir / "probe.json", result)
        plot_probe(result, probe_dir / "probe.png")
        for line in table(result):
            self.out(line)
        self.out(memory_line(result))
        self.out(f"stopped: {reason}")
        if line := mps_line(result):
            self.out(line)
        if best_throughput:
            self.out(
                f"best throughput: k={best_throughput['k']}"
                + _split(best_throughput, kind)
                + f" ({best_throughput['speedup_vs_k1']:.2f}x the aggregate of k=1)"
            )
            self.out(
                f"best latency:    k={best_latency['k']}"
                + _split(best_latency, kind)
                + f" ({best_latency['rule']})"
            )
        if lanes:
            for line in lanes_table(result):
                self.out(line)
            self.out(f"lanes stopped: {lanes['lanes_stop_reason']}")
            if line := recommendation_line(result):
                self.out(line)
        if spec.cache and best_throughput:
            path = cache_store(result)
            self.out(f"cached for `concurrency: auto`: {path}")
        if spec.cache and lanes.get("best_lanes"):
            path = cache_store(result, lanes_signature(signature))
            self.out(f"cached for `lanes: auto`: {path}")
        return result

    def _server(self, probe_dir: Path) -> contextlib.AbstractContextManager[Zygote | None]:
        """The warm start server the runs fork from, for this probe's life (`start`), or None:
        cold, or every level measured by a function given (the tests')."""
        if self._measure is not None and (not self.spec.lanes or self._lanes_measure is not None):
            return contextlib.nullcontext(None)
        return start.server(self.spec.start, probe_dir / WARM_LOG, self.out, what="run")

    def _measure_lanes(
        self,
        probe_dir: Path,
        batch_size: int,
        unit_name: str,
        zygote: Zygote | None = None,
        pss: bool = False,
    ) -> tuple[list[LaneLevel], str]:
        """For each W of `lane_workers`, each lane count of `lanes` as W processes of N lanes, the
        threads split among them as the process levels split them, until `next_lanes` stops."""
        spec = self.spec
        measure = self._lanes_measure or LanesProcess(
            spec, self._child_overrides(), probe_dir, self.out, zygote=zygote, pss=pss
        )
        levels: list[LaneLevel] = []
        reasons = []
        for w in spec.lane_workers:
            t = self._threads(w)
            series: list[LaneLevel] = []
            n: int | None = spec.lanes[0]
            while n is not None:
                what = (
                    f"one process, {n} lane(s), {t} thread(s)"
                    if w == 1
                    else f"{w} processes of {n} lane(s), {t} thread(s) each"
                    + (" (oversubscribed)" if w > self.threads_total else "")
                )
                self.out(f"{label(LaneLevel(n, t, workers=w))}: {what}")
                lv = summarize(measure(n, t, w), batch_size)
                series.append(lv)
                if lv.error:
                    self.out(f"{label(lv)}: failed: {lv.error}")
                else:
                    self.out(
                        f"{label(lv)}: iteration {lv.step_s * 1000:.1f} ms, "
                        f"{lv.steps_per_s:.2f} lane steps/s, {lv.units_per_s:,.0f} {unit_name}"
                        + (f", {lv.peak_mem_mb:,.0f} MB" if lv.peak_mem_mb else "")
                    )
                n, reason = next_lanes(series, spec)
            levels += series
            reasons.append(reason if len(spec.lane_workers) == 1 else f"{w} worker(s): {reason}")
        return levels, "; ".join(reasons)

    def _prepare_data(self, cfg) -> None:
        """Prepare the data dir once, not in k children at the same time."""
        data = getattr(cfg, "data", None)
        if data is None or self.spec.command == "sft":  # records, no data directory to prepare
            return
        from smollab.data.prepare import ensure_prepared

        ensure_prepared(
            data, exact=self.spec.command == "pretrain", log=lambda m: self.out(f"  {m}")
        )

    def _child_overrides(self) -> list[str]:
        big = 10**8
        fixed = [
            "train.log_interval=1",
            f"train.eval_interval={big}",
            f"train.save_interval={big}",
            f"train.max_steps={big}",
            f"train.max_time={self.spec.timeout_s:g}",
        ]
        if self.spec.command in ("sft", "grpo"):
            fixed.append("train.epochs=null")  # the length is max_steps (and max_time)
        return [*self.overrides, *fixed]

    def _threads(self, k: int) -> int:
        return max(1, self.threads_total // k)

    def _level(
        self, measure: MeasureFn, k: int, units_per_step, unit_name, t: int | None = None
    ) -> Level:
        t = t or self._threads(k)
        self.out(
            f"k={k}: {k} run(s) x {t} thread(s)"
            + (" (oversubscribed)" if k > self.threads_total else "")
        )
        runs, observed = measure(k, t)
        lv = Level(k=k, threads=t, runs=runs, observed_steps_per_s=observed).summarize(
            units_per_step
        )
        if isinstance(measure, ProcessLevel):
            lv.mps = measure.mps_report
        if lv.error:
            self.out(f"k={k}: failed: {lv.error}")
        else:
            self.out(
                f"k={k}: step {lv.step_s * 1000:.1f} ms, {lv.steps_per_s:.2f} steps/s"
                + (f", {lv.units_per_s:,.0f} {unit_name}" if lv.units_per_s else "")
                + (f", {lv.peak_mem_mb:,.0f} MB per run" if lv.peak_mem_mb else "")
                + (f", first step {lv.start_s:.2f} s after launch" if lv.start_s else "")
            )
        return lv

    def _bisect(self, levels, measure, units_per_step, unit_name, device, mps_on) -> str:
        done = {lv.k for lv in levels}
        ok = [lv for lv in best_per_k(levels) if lv.steps_per_s and not lv.error]
        if not ok:
            return ""
        best = max(ok, key=lambda lv: lv.steps_per_s)
        good = [lv for lv in ok if lv.steps_per_s >= (1 - self.spec.drop) * best.steps_per_s]
        lo = max(lv.k for lv in good)
        higher = [lv.k for lv in levels if lv.k > lo]
        if not higher:
            return ""
        hi = min(higher)
        tried = []
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if mid in done:
                break
            lv = self._level(measure, mid, units_per_step, unit_name)
            levels.append(lv)
            done.add(mid)
            tried.append(mid)
            best = max([best, lv] if lv.steps_per_s else [best], key=lambda x: x.steps_per_s)
            if not lv.error and lv.steps_per_s >= (1 - self.spec.drop) * best.steps_per_s:
                lo = mid
            else:
                hi = mid
        return f"; bisection tried k={', '.join(map(str, tried))}" if tried else ""


def _split(o: dict, kind: str) -> str:
    return f" ({o['k']} processes x {o['threads_per_run']} threads)" if kind == "cpu" else ""


def _level_dict(lv: Level) -> dict[str, Any]:
    d = asdict(lv)
    d["runs"] = [asdict(r) for r in lv.runs]
    return d


def run_probe(spec: ProbeSpec, overrides: list[str], **kw) -> dict[str, Any]:
    return Probe(spec, overrides, **kw).run(Path(spec.dir))
