"""`smollab probe WORKLOAD`: how many identical runs does this device hold at once?

For k = 1, 2, 4, ... the probe launches k copies of the workload (through `children.launch`, each
with its CPU threads = available / k; on CUDA under the MPS daemon), lets each pass `warmup`
logged steps, and then measures only while *all k* run: the window opens when the last one has
passed its warm-up, and closes when each has logged `steps` more steps; then all are stopped.
Per run it takes the median step time inside the window (grpo: `step_s`; pretrain: differences
of `train_s`, logged every step), so import, data and compile time never count.

Aggregate throughput = sum over runs of 1 / median step time (steps/s), times tokens per step
(pretrain) or completions per step (grpo). The doubling stops when the aggregate falls `drop`
below the best so far, when the next k would not fit in memory, when a run fails (out of
memory), or at `max_k` (and the MPS client limit). With `bisect`, k between the last good and
the first bad level are tried by bisection.

Two optima, each with its rule in probe.json:
- best_throughput: the k with the highest aggregate steps/s (within 2%, the smaller k);
- best_latency: the largest k whose median step time stays within `latency_tolerance` of k = 1
  (packing that many costs each run almost nothing).

The result is cached per device and workload signature (model, LoRA rank, batch, sequence or
completion length, precision), which is what `concurrency: auto` in a sweep reads.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from smollab.errors import UserError
from smollab.lab import children as ch
from smollab.lab.spec import SpecSection, _coerce, _flatten, override_value
from smollab.runs import atomic_write_json

CUDA_CONTEXT_MB = 500.0  # per process, not in torch's allocator count


class ProbeSpec(SpecSection):
    command: str = "pretrain"
    base: str | None = None
    overrides: dict[str, Any] = Field(default_factory=dict)
    ks: list[int] | None = Field(None, description="explicit k to try; default 1, 2, 4, ... max_k")
    max_k: int = Field(32, ge=1)
    warmup: int = Field(5, ge=0, description="logged steps each run takes before measuring")
    steps: int = Field(20, ge=3, description="steps measured per run while all k run")
    drop: float = Field(0.1, gt=0, lt=1, description="stop when aggregate throughput falls this "
                                                     "fraction below the best")  # fmt: skip
    latency_tolerance: float = Field(
        0.1, ge=0, description="best_latency: step time within this of k=1"
    )
    mem_fraction: float = Field(0.9, gt=0, le=1)
    bisect: bool = False
    split: bool = Field(True, description="CPU: for k below the thread count, also try 1 thread "
                                          "per run (k x 1 next to k x threads/k)")  # fmt: skip
    threads: int | None = Field(None, ge=1, description="CPU threads to divide (default: all)")
    mps: bool | Literal["auto"] = "auto"
    timeout_s: float = Field(300.0, gt=0, description="per level")
    dir: str | None = None
    cache: bool = True


@dataclass
class RunMeasure:
    step_s: float | None
    steps: int
    peak_mem_mb: float | None = None
    error: str | None = None
    pid: int | None = None


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
        return self


MeasureFn = Callable[[int, "int | None"], tuple[list[RunMeasure], float | None]]


# ---- devices and signatures -------------------------------------------------------------------


def device_info(kind: str, threads: int, runner=None) -> dict[str, Any]:
    """Name and memory of the device the workload runs on (nvidia-smi for CUDA: mockable)."""
    if kind == "cuda":
        from smollab.lab.mps import _run

        r = (runner or _run)(["nvidia-smi", "--query-gpu=name,memory.total,memory.used",
                              "--format=csv,noheader,nounits"])  # fmt: skip
        line = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else ""
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            return {"kind": "cuda", "name": parts[0], "memory_mb": float(parts[1]) - float(parts[2]),
                    "threads": threads}  # fmt: skip
        return {"kind": "cuda", "name": "cuda", "memory_mb": None, "threads": threads}
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                mem = int(line.split()[1]) / 1024
    except OSError:
        pass
    return {"kind": kind, "name": name, "memory_mb": mem, "threads": threads}


def device_key(info: dict[str, Any]) -> str:
    if info["kind"] == "cuda":
        return f"cuda:{info['name']}"
    return f"{info['kind']}:{info['name']}:{info['threads']}threads"


def workload_signature(command: str, cfg) -> dict[str, Any]:
    """What decides how many copies fit: model, LoRA rank, batch, lengths, precision."""
    sig = {
        "command": command,
        "model": cfg.model.path or cfg.model.preset,
        "lora_r": cfg.model.lora.r if cfg.model.lora.enabled else 0,
        "batch_size": cfg.train.batch_size,
        "precision": cfg.perf.precision,
        "compile": cfg.perf.compile,
        "grad_checkpointing": cfg.perf.grad_checkpointing,
    }
    if command == "grpo":
        sig.update(max_completion_length=cfg.grpo.max_completion_length,
                   num_generations=cfg.grpo.num_generations, beta=cfg.grpo.beta > 0)  # fmt: skip
    else:
        sig.update(seq_len=cfg.train.seq_len, grad_accum=cfg.train.grad_accum)
    return sig


def cache_dir() -> Path:
    root = os.environ.get("SMOLLAB_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "smollab"
    )
    return Path(root) / "probe"


def cache_path(device: dict[str, Any], signature: dict[str, Any]) -> Path:
    blob = json.dumps({"device": device_key(device), "workload": signature}, sort_keys=True)
    return cache_dir() / f"{hashlib.sha1(blob.encode()).hexdigest()[:16]}.json"


def cache_lookup(device: dict[str, Any], signature: dict[str, Any]) -> dict[str, Any] | None:
    p = cache_path(device, signature)
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def cache_store(result: dict[str, Any]) -> Path:
    p = cache_path(result["device"], result["workload"])
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(p, result)
    return p


# ---- the stopping rules and the optima (pure) ------------------------------------------------


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
        return None, (f"aggregate throughput at k={last.k} is {100 * fall:.0f}% below the best "
                      f"(k={best.k}), more than the {100 * spec.drop:.0f}% allowed")  # fmt: skip
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
            return None, (f"k={nxt} would need about {need:,.0f} MB ({per + extra:,.0f} per run), "
                          f"over {100 * spec.mem_fraction:.0f}% of {mem:,.0f} MB available")  # fmt: skip
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
        return {"k": lv.k, "threads_per_run": lv.threads, "step_s": lv.step_s,
                "steps_per_s": lv.steps_per_s, "units_per_s": lv.units_per_s,
                "speedup_vs_k1": lv.steps_per_s / base.steps_per_s if base.steps_per_s else None,
                "rule": rule}  # fmt: skip

    return (
        pick(bl, f"the largest k whose median step time is within {100 * spec.latency_tolerance:.0f}% "
                 f"of the fastest k={base.k} run ({base.k} x {base.threads} threads, {base.step_s:.4g}s)"),
        pick(bt, "the k with the highest aggregate steps/s (within 2% of the top, the smallest k)"),
    )  # fmt: skip


# ---- measuring real processes -------------------------------------------------------------------


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

    def __init__(self, spec: ProbeSpec, overrides: list[str], probe_dir: Path, out,
                 env: dict[str, str] | None = None, poll_s: float = 0.1, mps=None):  # fmt: skip
        self.spec, self.overrides, self.dir, self.out = spec, overrides, probe_dir, out
        self.env, self.poll_s, self.mps = env, poll_s, mps
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
            kids.append(ch.launch(f"k{k}r{i}", ch.smollab_argv(spec.command, spec.base, ov), run_dir,
                                  threads=threads, env=self.env))  # fmt: skip
        tails = [ch.MetricsTail(c.run_dir / "metrics.csv") for c in kids]
        seen: list[dict[int, float]] = [{} for _ in kids]
        rss: list[float] = [0.0 for _ in kids]
        errors: list[str | None] = [None for _ in kids]
        start, w0, w1 = time.time(), None, None
        checked_mps = False
        try:
            while True:
                now = time.time()
                for i, (c, t) in enumerate(zip(kids, tails, strict=True)):
                    for r in t.read():
                        if r.get("step") is not None:
                            seen[i].setdefault(int(r["step"]), now)
                    rss[i] = max(rss[i], c.peak_rss_mb() or 0.0)
                    if c.poll() is not None and errors[i] is None:
                        from smollab.lab.sweep import last_log_line

                        errors[i] = (
                            f"run exited (code {c.proc.returncode}): {last_log_line(c.run_dir)}"
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
            t._sig = None
            rows = t.read()
            times = [(s, dt) for s, dt in step_times(rows, spec.command)
                     if w0 is not None and seen[i].get(s, math.inf) > w0 and (w1 is None or seen[i].get(s, math.inf) <= w1)]  # fmt: skip
            total += len(times)
            logged = [r.get("peak_mem_mb") for r in rows if r.get("peak_mem_mb")]
            mem = max(logged) if logged else (rss[i] or None)
            measures.append(RunMeasure(step_s=statistics.median(dt for _, dt in times) if times else None,
                                       steps=len(times), peak_mem_mb=mem, error=errors[i], pid=c.pid))  # fmt: skip
        observed = total / (w1 - w0) if w0 and w1 and w1 > w0 else None
        return measures, observed


# ---- the probe ----------------------------------------------------------------------------------


class Probe:
    def __init__(self, spec: ProbeSpec, overrides: list[str], out=None, measure: MeasureFn | None = None,
                 device: dict[str, Any] | None = None, mps=None):  # fmt: skip
        self.spec = spec
        self.overrides = overrides
        self.out = out or (lambda m: print(m, flush=True))
        self._measure = measure
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
        from smollab.config import load_config

        spec = self.spec
        cfg = load_config(spec.command, spec.base, self.overrides)
        kind = self.device["kind"] if self.device else _detect_kind(cfg.perf.device)
        device = self.device or device_info(kind, self.threads_total)
        units_per_step, unit_name = self.units(cfg)
        signature = workload_signature(spec.command, cfg)
        probe_dir.mkdir(parents=True, exist_ok=True)
        self._prepare_data(cfg)
        mps_on = kind == "cuda" and spec.mps is not False
        self.out(f"probe {probe_dir}: {spec.command} {spec.base or '(schema defaults)'} on {device['kind']} "
                 f"({device['name']}), {self.threads_total} CPU threads; warm-up {spec.warmup} "
                 f"steps, then {spec.steps} steps per run while all run")  # fmt: skip

        import contextlib

        ctx = contextlib.nullcontext(None)
        if mps_on:
            from smollab.lab.mps import MPS, mps_daemon

            self.mps = self.mps or MPS()
            ctx = mps_daemon(out=self.out, mps=self.mps)
        levels: list[Level] = []
        with ctx as mps_env:
            measure = self._measure or ProcessLevel(
                spec, self._child_overrides(), probe_dir, self.out,
                env={**os.environ, **mps_env} if mps_env else None,
                mps=self.mps if mps_env is not None and mps_on else None)  # fmt: skip
            k: int | None = spec.ks[0] if spec.ks else 1
            reason = ""
            while k is not None:
                t = self._threads(k)
                levels.append(self._level(measure, k, units_per_step, unit_name, t))
                if kind == "cpu" and spec.split and t > 1 and not levels[-1].error:
                    levels.append(self._level(measure, k, units_per_step, unit_name, 1))
                k, reason = next_k(levels, spec, device, mps_on)
            if spec.bisect:
                reason += self._bisect(levels, measure, units_per_step, unit_name, device, mps_on)
        best_latency, best_throughput = optima(levels, spec)
        result = {
            "device": device, "workload": signature, "command": spec.command, "base": spec.base,
            "overrides": self.overrides, "unit": unit_name, "threads_total": self.threads_total,
            "levels": [_level_dict(lv) for lv in sorted(levels, key=lambda lv: (lv.k, lv.threads or 0))],
            "stop_reason": reason, "best_latency": best_latency, "best_throughput": best_throughput,
            "spec": spec.model_dump(mode="json"), "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        }  # fmt: skip
        atomic_write_json(probe_dir / "probe.json", result)
        plot_probe(result, probe_dir / "probe.png")
        for line in table(result):
            self.out(line)
        self.out(f"stopped: {reason}")
        if best_throughput:
            self.out(f"best throughput: k={best_throughput['k']}" + _split(best_throughput, kind)
                     + f" ({best_throughput['speedup_vs_k1']:.2f}x the aggregate of k=1)")  # fmt: skip
            self.out(f"best latency:    k={best_latency['k']}" + _split(best_latency, kind)
                     + f" ({best_latency['rule']})")  # fmt: skip
        if spec.cache and best_throughput:
            path = cache_store(result)
            self.out(f"cached for `concurrency: auto`: {path}")
        return result

    def _prepare_data(self, cfg) -> None:
        """Prepare the data dir once, not in k children at the same time."""
        data = getattr(cfg, "data", None)
        if data is None or (
            self.spec.command != "pretrain" and (Path(data.dir) / "meta.json").exists()
        ):
            return
        from smollab.data.prepare import prepare

        prepare(data, log=lambda m: self.out(f"  {m}"))

    def _child_overrides(self) -> list[str]:
        big = 10**8
        fixed = ["train.log_interval=1", f"train.eval_interval={big}", f"train.save_interval={big}",
                 f"train.max_steps={big}", f"train.max_time={self.spec.timeout_s:g}"]  # fmt: skip
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
            self.out(f"k={k}: step {lv.step_s * 1000:.1f} ms, {lv.steps_per_s:.2f} steps/s"
                     + (f", {lv.units_per_s:,.0f} {unit_name}" if lv.units_per_s else "")
                     + (f", {lv.peak_mem_mb:,.0f} MB per run" if lv.peak_mem_mb else ""))  # fmt: skip
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


def _detect_kind(want: str) -> str:
    if want != "auto":
        return want
    import torch

    if torch.cuda.is_available():
        return "cuda"
    return "mps" if torch.backends.mps.is_available() else "cpu"


def _level_dict(lv: Level) -> dict[str, Any]:
    d = asdict(lv)
    d["runs"] = [asdict(r) for r in lv.runs]
    return d


def table(result: dict[str, Any]) -> list[str]:
    unit = result.get("unit") or "units/s"
    head = f"{'k':>4} {'threads':>7} {'step ms':>9} {'steps/s':>9} {unit:>14} {'MB/run':>9}  note"
    lines = [head, "-" * len(head)]

    def key(o):
        return (o.get("k"), o.get("threads_per_run")) if o else None

    bl, bt = key(result.get("best_latency")), key(result.get("best_throughput"))
    for lv in result["levels"]:
        note = lv.get("error") or ""
        marks = [
            m
            for m, o in (("best latency", bl), ("best throughput", bt))
            if o == (lv["k"], lv["threads"])
        ]
        note = ", ".join(marks) + (f"; {note}" if note and marks else note)
        f = lambda v, fmt: format(v, fmt) if v is not None else "-"  # noqa: E731
        lines.append(f"{lv['k']:>4} {f(lv['threads'], '>7')} "
                     f"{f(lv['step_s'] * 1000 if lv['step_s'] else None, '>9.1f')} "
                     f"{f(lv['steps_per_s'], '>9.2f')} {f(lv['units_per_s'], '>14,.0f')} "
                     f"{f(lv['peak_mem_mb'], '>9,.0f')}  {note}")  # fmt: skip
    return lines


def plot_probe(result: dict[str, Any], path: Path) -> None:
    from smollab.report.plots import _plt, _save

    per_k: dict[int, dict] = {}
    for lv in result["levels"]:
        if lv.get("steps_per_s") and (
            lv["k"] not in per_k or lv["steps_per_s"] > per_k[lv["k"]]["steps_per_s"]
        ):
            per_k[lv["k"]] = lv
    levels = [per_k[k] for k in sorted(per_k)]
    if not levels:
        return
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    ks = [lv["k"] for lv in levels]
    a1.plot(ks, [lv["step_s"] * 1000 for lv in levels], "-o")
    a1.set_ylabel("median step time per run (ms)")
    a2.plot(ks, [lv["steps_per_s"] for lv in levels], "-o", color="C1")
    a2.set_ylabel("aggregate steps/s")
    if result.get("unit") and all(lv.get("units_per_s") for lv in levels):
        a3 = a2.twinx()
        a3.plot(ks, [lv["units_per_s"] for lv in levels], alpha=0)
        a3.set_ylabel(f"aggregate {result['unit']}")
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("concurrent runs k")
        ax.grid(alpha=0.3)
    for key, color, label in (("best_latency", "green", "best latency"),
                              ("best_throughput", "red", "best throughput")):  # fmt: skip
        o = result.get(key)
        if o:
            for ax in (a1, a2):
                ax.axvline(o["k"], color=color, ls=":", label=f"{label}: k={o['k']}")
    a2.legend(fontsize=8)
    dev = result["device"]
    fig.suptitle(f"probe: {result['command']} {Path(result.get('base') or '').name} on "
                 f"{dev['kind']} ({dev['name']})", fontsize=10)  # fmt: skip
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def report_probe(probe_dir: str | Path) -> Path:
    d = Path(probe_dir)
    result = json.loads((d / "probe.json").read_text())
    plot_probe(result, d / "probe.png")
    for line in table(result):
        print(line)
    print(f"stopped: {result.get('stop_reason')}")
    return d / "probe.png"


# ---- loading and the sweep's `concurrency: auto` -------------------------------------------------


def load_probe(workload: str, overrides: list[str]) -> tuple[ProbeSpec, list[str]]:
    """WORKLOAD is a probe recipe (has `command:`) or a training config. `key=value` whose key is
    a probe setting (steps=10, max_k=8, bisect=true) sets the probe; others go to the workload."""
    from smollab.config import read_yaml

    tree = read_yaml(workload)
    if "command" in tree:
        spec_tree = dict(tree)
    else:
        command = "grpo" if "grpo" in tree or "reward" in tree else "pretrain"
        spec_tree = {"command": command, "base": workload}
    if isinstance(spec_tree.get("overrides"), dict):
        spec_tree["overrides"] = _coerce(_flatten(spec_tree["overrides"]))
    work: list[str] = []
    from smollab.config import parse_override

    for item in overrides:
        key, value = parse_override(item)
        if key.startswith("overrides."):
            spec_tree.setdefault("overrides", {})[key.removeprefix("overrides.")] = _coerce(value)
        elif key in ProbeSpec.model_fields or "." not in key:
            spec_tree[key] = _coerce(value)  # an unknown plain key is reported as a probe key
        else:
            work.append(item)
    for key in spec_tree:
        if key not in ProbeSpec.model_fields:
            import difflib

            close = difflib.get_close_matches(key, list(ProbeSpec.model_fields), n=1)
            raise UserError(
                f"unknown probe key {key}" + (f" (did you mean {close[0]}?)" if close else "")
            )
    try:
        spec = ProbeSpec.model_validate(spec_tree)
    except ValidationError as err:
        e = err.errors()[0]
        loc = ".".join(str(p) for p in e["loc"])
        raise UserError(f"probe key {loc}: {e['msg'].removeprefix('Value error, ')}") from None
    if spec.base and not Path(spec.base).is_file():
        raise UserError(f"probe key base: file not found: {spec.base}")
    from smollab.config import SCHEMAS, load_config

    if spec.command not in SCHEMAS or spec.command == "data":
        raise UserError(f"probe key command: {spec.command!r} is not a training command")
    base_overrides = [f"{k}={override_value(v)}" for k, v in spec.overrides.items()] + work
    load_config(spec.command, spec.base, base_overrides)  # validate now, before any launch
    if spec.dir is None:
        spec.dir = str(Path("probes") / Path(workload).stem)
    return spec, base_overrides


def run_probe(spec: ProbeSpec, overrides: list[str], **kw) -> dict[str, Any]:
    return Probe(spec, overrides, **kw).run(Path(spec.dir))


def auto_concurrency(sweep_spec, probe_dir: Path, device_kind: str, out=print,
                     probe_kw: dict | None = None) -> int:  # fmt: skip
    """`concurrency: auto`: the cached probe of this workload on this device, else a quick probe."""
    from smollab.lab.spec import resolve_config

    point = sweep_spec.grid_points()[0] if sweep_spec.sampler == "grid" else {}
    cfg = resolve_config(sweep_spec, point, sweep_spec.seeds[0])
    threads = sweep_spec.threads or ch.cpu_count()
    device = (probe_kw or {}).get("device") or device_info(device_kind, threads)
    signature = workload_signature(sweep_spec.command, cfg)
    hit = cache_lookup(device, signature)
    if hit and hit.get("best_throughput"):
        k = int(hit["best_throughput"]["k"])
        out(f"concurrency auto: {k} (best throughput of the probe of {hit.get('created')} on "
            f"{device_key(device)}; {cache_path(device, signature)})")  # fmt: skip
        return k
    out("concurrency auto: no probe of this workload on this device yet; running a quick probe "
        "first (warm-up 3 steps, 10 measured, k up to 8)")  # fmt: skip
    overrides = [f"{k}={override_value(v)}" for k, v in sweep_spec.overrides.items()]
    overrides += [f"{k}={override_value(v)}" for k, v in point.items()]
    spec = ProbeSpec(command=sweep_spec.command, base=sweep_spec.base, warmup=3, steps=10, max_k=8,
                     threads=sweep_spec.threads, mps=sweep_spec.mps or "auto", dir=str(probe_dir))  # fmt: skip
    result = Probe(spec, overrides, out=out, **{k: v for k, v in (probe_kw or {}).items()}).run(
        probe_dir
    )
    best = result.get("best_throughput")
    if not best:
        out(
            f"concurrency auto: the probe found no working k ({result.get('stop_reason')}); using 1"
        )
        return 1
    out(f"concurrency auto: {best['k']} from the probe just run")
    return int(best["k"])
