"""Model FLOPs utilization: FLOPs per token, and the device's peak to divide by.

GPU peaks come from the vendors' datasheets (dense, no sparsity), one column per precision the
matmuls actually run in: bf16 or fp16 on tensor cores under autocast, TF32 on tensor cores for
fp32 when TF32 is on, plain fp32 otherwise. A GPU or variant without a confirmed figure gives
None: no MFU rather than a wrong one.

A CPU has no table worth trusting, so its peak is measured (the best of several large matmuls)
and cached per CPU model name, machine core count, thread count and dtype. A measurement taken
while other work competes reads low, so a lab child (a sweep trial, a probe or bench run, all
marked by `LAB_CHILD_ENV`) never measures: it reads the peak its parent measured before
launching anything, or reports no MFU. The cache keeps the highest value ever measured for a
key, since load only ever slows a matmul down.

torch is imported only where a tensor is made, so the lab parent can read the cache, and
`children` can name `LAB_CHILD_ENV`, without paying for `import torch`. The loops divide by
`peak_flops`; the lab measures before it launches children (`ensure_cpu_peak`, `cpu_run_dtype`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from smollab.device.cache_dir import cache_root
from smollab.rundir.atomic import atomic_write_json

if TYPE_CHECKING:
    import torch

LAB_CHILD_ENV = "SMOLLAB_LAB_CHILD"  # set by `smollab.lab.children.launch` in every child


@dataclass(frozen=True)
class GpuPeak:
    """Dense TFLOP/s. fp16/bf16: tensor cores with FP32 accumulation (what PyTorch's matmuls
    use); None where the GPU has no such path (bf16 on Volta and Turing). tf32: None on GPUs
    without TF32 (Volta, Turing), whose fp32 matmuls run at the fp32 rate whatever the flag."""

    fp16: float | None
    bf16: float | None
    tf32: float | None
    fp32: float


# First match wins (case-insensitive, on torch.cuda.get_device_name). An entry of None is a
# known variant without a confirmed figure: it must not fall through to its sibling's row.
# Sources, the vendor datasheets and whitepapers (sparsity figures halved):
#   H100 SXM / PCIe datasheet: FP32 67 / 51, TF32 989* / 756*, BF16 and FP16 1,979* / 1,513*.
#   H200 SXM datasheet: as H100 SXM (same GH100 compute; FP32 67, TF32 989*, BF16 1,979*).
#   A100 datasheet (SXM and PCIe, 40 and 80 GB): FP32 19.5, TF32 156, BF16 and FP16 312.
#   L40S / L40 datasheet: FP32 91.6 / 90.5, TF32 183 / 90.5, BF16 and FP16 362.05 / 181.05.
#   L4 datasheet: FP32 30.3, TF32 120*, BF16 and FP16 242*.
#   A10 datasheet: FP32 31.2, TF32 62.5, BF16 and FP16 125.
#   Ada whitepaper, RTX 4090: FP32 82.6, TF32 82.6, FP16 and BF16 with FP32 accumulate 165.2.
#   GA102 whitepaper, RTX 3090: FP32 35.6, TF32 35.6, FP16 and BF16 with FP32 accumulate 71.
#   V100 datasheet: SXM2 FP32 15.7, tensor (FP16) 125; PCIe FP32 14, tensor 112.
#   T4 datasheet: FP32 8.1, mixed precision (FP16/FP32) 65.
# Left out (None), for want of a confirmed figure or because the name hides the share in use:
# MIG slices, laptop parts, H100 NVL, H200 NVL, A10G, RTX 4090 D, RTX 3090 Ti, V100S and
# other V100 forms.
GPU_PEAKS: list[tuple[str, GpuPeak | None]] = [
    (r"\bMIG\b|\bLaptop\b|\bMobile\b|\bMax-Q\b", None),
    (r"\bH200 NVL\b", None),
    (r"\bH200\b", GpuPeak(989.5, 989.5, 494.5, 67.0)),
    (r"\bH100 NVL\b", None),
    (r"\bH100\b.*\bPCIe\b", GpuPeak(756.5, 756.5, 378.0, 51.0)),
    (r"\bH100\b", GpuPeak(989.5, 989.5, 494.5, 67.0)),
    (r"\bA100\b", GpuPeak(312.0, 312.0, 156.0, 19.5)),
    (r"\bL40S\b", GpuPeak(362.05, 362.05, 183.0, 91.6)),
    (r"\bL40\b", GpuPeak(181.05, 181.05, 90.5, 90.5)),
    (r"\bL4\b", GpuPeak(121.0, 121.0, 60.0, 30.3)),
    (r"\bA10G\b", None),
    (r"\bA10\b", GpuPeak(125.0, 125.0, 62.5, 31.2)),
    (r"\b4090 D\b", None),
    (r"\bRTX 4090\b", GpuPeak(165.2, 165.2, 82.6, 82.6)),
    (r"\b3090 Ti\b", None),
    (r"\bRTX 3090\b", GpuPeak(71.0, 71.0, 35.6, 35.6)),
    (r"\bV100S\b", None),
    (r"\bV100\b.*\bSXM2\b", GpuPeak(125.0, None, None, 15.7)),
    (r"\bV100\b.*\bPCIe\b", GpuPeak(112.0, None, None, 14.0)),
    (r"\bV100\b", None),
    (r"\bT4\b", GpuPeak(65.0, None, None, 8.1)),
]

_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def flops_per_token(config, seq_len: int) -> float:
    """6 x (matmul parameters incl. the head) + attention's 12 x layers x width x context."""
    d = getattr(config, "hidden_size", None) or config.n_embd
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    if hasattr(config, "intermediate_size"):
        kv = config.num_key_value_heads * (d // config.num_attention_heads)
        per_layer = d * d * 2 + 2 * d * kv + 3 * d * config.intermediate_size
    else:
        per_layer = 12 * d * d
    matmul_params = layers * per_layer + d * config.vocab_size
    return 6.0 * matmul_params + 12.0 * layers * d * seq_len


# ---- GPUs ------------------------------------------------------------------------------------


def gpu_peak_row(name: str) -> GpuPeak | None:
    for pattern, row in GPU_PEAKS:
        if re.search(pattern, name, re.IGNORECASE):
            return row
    return None


def gpu_peak_flops(name: str, dtype: str, tf32: bool) -> float | None:
    """FLOP/s of GPU `name` for matmuls in `dtype` (float32, bfloat16, float16; `tf32`: whether
    fp32 matmuls may use TF32); None when unknown."""
    row = gpu_peak_row(name)
    if row is None:
        return None
    tflops = {"bfloat16": row.bf16, "float16": row.fp16}.get(dtype, row.fp32)
    if dtype == "float32" and tf32 and row.tf32 is not None:
        tflops = row.tf32
    return None if tflops is None else tflops * 1e12


def tf32_enabled() -> bool:
    """Whether CUDA fp32 matmuls may run in TF32, read through torch's `fp32_precision` settings
    (the ones `runtime.set_tf32` writes; the legacy getters raise once those are set): the CUDA
    matmul setting, else where it is "none" its parents', CUDA's then the generic one. A legacy
    `set_float32_matmul_precision("high")` shows here too (torch maps it onto these)."""
    import torch

    b = torch.backends
    for precision in (b.cuda.matmul.fp32_precision, b.cudnn.fp32_precision, b.fp32_precision):
        if precision != "none":
            return precision == "tf32"
    return False


# ---- CPUs ------------------------------------------------------------------------------------


def model_from_cpuinfo(text: str) -> str | None:
    """The model in /proc/cpuinfo: `model name` (x86), else ARM's implementer and part codes."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if fields.get("model name"):
        return fields["model name"]
    if fields.get("CPU part"):  # ARM Linux names no model: implementer and part identify it
        return f"ARM implementer {fields.get('CPU implementer', '?')} part {fields['CPU part']}"
    return None


@functools.lru_cache(maxsize=1)
def cpu_model_name() -> str:
    """The CPU's model name: /proc/cpuinfo on Linux, sysctl on macOS, else `platform`'s word
    (often just "x86_64", which is why it is the last resort)."""
    with contextlib.suppress(OSError):
        if name := model_from_cpuinfo(Path("/proc/cpuinfo").read_text()):
            return name
    if platform.system() == "Darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            r = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
            )
            if r.returncode == 0 and r.stdout.strip():
                return r.stdout.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_peak_key(dtype: str, threads: int) -> str:
    """The cache key: model name, machine core count, the run's threads and the matmul dtype."""
    return f"{cpu_model_name()}|{os.cpu_count() or 1} cores|{threads} threads|{dtype}"


def cache_path() -> Path:
    return cache_root() / "cpu_peak.json"


def _read_cache(path: Path) -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    # Entries of the old format (a bare number under a key of processor name and threads) are
    # dropped: their key could not tell two CPUs apart.
    return {k: v for k, v in data.items() if isinstance(v, dict) and "flops" in v}


def cpu_peak_entry(dtype: str, threads: int) -> dict[str, Any] | None:
    """The cached record: flops, cpu, cores, threads, dtype, when, and the load it was taken at."""
    return _read_cache(cache_path()).get(cpu_peak_key(dtype, threads))


def cached_cpu_peak(dtype: str, threads: int) -> float | None:
    entry = cpu_peak_entry(dtype, threads)
    return float(entry["flops"]) if entry else None


def machine_load() -> float | None:
    """The 1-minute load average (None where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def busy_for(threads: int, load: float | None = None) -> bool:
    """Whether other work competes with `threads` threads: more load than the cores they leave."""
    load = machine_load() if load is None else load
    return load is not None and load > (os.cpu_count() or 1) - threads + 0.5


def _needs_measuring(entry: dict[str, Any] | None, threads: int) -> bool:
    """Missing, or taken on a busy machine while this one is quiet now (then measured again; the
    cache keeps the higher value)."""
    return entry is None or (bool(entry.get("busy")) and not busy_for(threads))


def cpu_peak_missing(dtype: str, threads: int) -> bool:
    """Whether (`dtype`, `threads`) must be measured before a lab child may read it."""
    return _needs_measuring(cpu_peak_entry(dtype, threads), threads)


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive flock beside the cache, so that two writers never drop each other's keys."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as f:
        try:
            import fcntl

            fcntl.flock(f, fcntl.LOCK_EX)
        except (ImportError, OSError):  # no flock (Windows): the write is still atomic
            pass
        yield


def store_cpu_peak(dtype: str, threads: int, flops: float, load: float | None = None) -> float:
    """Record a measurement taken at 1-minute `load` (None: unknown); returns the value kept.

    Per key the cache keeps the highest value ever measured: other work only ever slows a matmul
    down, so a lower reading says the machine was busy, not that the CPU got slower. A value
    measured on a busy machine is marked so, and measured again once the machine is quiet."""
    path, key = cache_path(), cpu_peak_key(dtype, threads)
    busy = load is not None and busy_for(threads, load)
    with _locked(path):
        cache = _read_cache(path)
        old = cache.get(key)
        if old is None or flops > float(old["flops"]):
            cache[key] = {
                "flops": flops,
                "cpu": cpu_model_name(),
                "cores": os.cpu_count() or 1,
                "threads": threads,
                "dtype": dtype,
                "load": load,
                "busy": busy,
                "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
            }
        elif old.get("busy") and not busy:
            old["busy"] = False  # a quiet measurement found no more: the value stands
        else:
            return float(old["flops"])
        atomic_write_json(path, cache)
        return float(cache[key]["flops"])


def measure_cpu_peak(
    dtype: str = "float32",
    threads: int | None = None,
    reps: int = 8,
    budget_s: float = 3.0,
    min_rep_s: float = 0.03,
) -> float:
    """FLOP/s of the fastest of several square matmuls on `threads` threads (default: torch's).

    The size doubles from 512 until one matmul takes `min_rep_s` (capped at 4096), so a big CPU
    is not measured on overhead and a small one not for minutes; then up to `reps` timings within
    `budget_s` (at least 3). Other work only ever adds time, so the fastest is the estimate.
    """
    import torch

    prev = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        n, elapsed = 512, 0.0
        while True:
            a = torch.randn(n, n, dtype=getattr(torch, dtype), device="cpu")
            b = torch.randn(n, n, dtype=getattr(torch, dtype), device="cpu")
            a @ b  # warm-up: thread pool, kernel selection
            t0 = time.perf_counter()
            a @ b
            elapsed = time.perf_counter() - t0
            if elapsed >= min_rep_s or n >= 4096:
                break
            n *= 2
        best, done, deadline = elapsed, 1, time.perf_counter() + budget_s
        while done < reps and (done < 3 or time.perf_counter() < deadline):
            t0 = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t0)
            done += 1
        return 2 * n**3 / best
    finally:
        torch.set_num_threads(prev)


def ensure_cpu_peak(
    dtype: str, threads: int, refresh: bool = False, log: Callable[[str], None] | None = None
) -> float:
    """The cached peak for (`dtype`, `threads`), measured first if missing, if taken on a busy
    machine that is quiet now, or if `refresh`. For a lab parent before it launches children."""
    entry = cpu_peak_entry(dtype, threads)
    if entry and not refresh and not _needs_measuring(entry, threads):
        return float(entry["flops"])
    load = machine_load()
    measured = measure_cpu_peak(dtype, threads)
    kept = store_cpu_peak(dtype, threads, measured, load)
    if log:
        log(
            f"CPU matmul peak, {threads} thread(s) {dtype}: {measured / 1e9:,.1f} GFLOP/s"
            + (f" (the cache keeps {kept / 1e9:,.1f}, measured earlier)" if kept > measured else "")
            + (
                f"; the machine looked busy (1-minute load average {load:.1f} on {os.cpu_count()} "
                f"cores): measured again when it is quiet"
                if load is not None and busy_for(threads, load)
                else ""
            )
        )
    return kept


def in_lab_child() -> bool:
    return bool(os.environ.get(LAB_CHILD_ENV))


def cpu_dtype_name(precision: str) -> str:
    """The matmul dtype of a run at `perf.precision` (fp32, bf16, fp16) on this CPU."""
    return _DTYPE_NAMES[precision]


def cpu_run_dtype(precision: str) -> str:
    """The matmul dtype a CPU run asking for `perf.precision` really uses: `setup_runtime`'s own
    rule (fp32 where this CPU has no native bf16 or fp16 matmul), so a peak measured for it is
    the one the run's MFU reads."""
    import torch

    from smollab.device.runtime import precision_unsupported

    unsupported = precision_unsupported(torch.device("cpu"), precision)
    return cpu_dtype_name("fp32" if unsupported else precision)


# ---- the loop's entry point ------------------------------------------------------------------


def peak_flops(
    device: torch.device, autocast_dtype: torch.dtype | None, may_measure: bool = True
) -> float | None:
    """FLOP/s peak of this device for the precision in use; None when unknown.

    CUDA: the datasheet table. CPU: the cache; measured here only outside the lab and when
    `may_measure` (a lab child or a DDP rank competes with its siblings, so it reads what was
    measured before or reports None). Apple MPS and others: None (no figure we trust)."""
    import torch

    dtype = str(autocast_dtype or torch.float32).removeprefix("torch.")
    if device.type == "cuda":
        return gpu_peak_flops(torch.cuda.get_device_name(device), dtype, tf32_enabled())
    if device.type != "cpu":
        return None
    threads = torch.get_num_threads()
    entry = cpu_peak_entry(dtype, threads)
    if in_lab_child() or not may_measure or not _needs_measuring(entry, threads):
        return float(entry["flops"]) if entry else None
    return ensure_cpu_peak(dtype, threads)
