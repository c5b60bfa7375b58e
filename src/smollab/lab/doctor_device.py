"""What `smollab doctor` learns about the device itself: its name and memory, which precisions
run natively (tried for real with a small matmul), whether the CUDA MPS daemon can be used, the
matmul peak it reaches, and which decode step the sampler runs there.

It runs as a child of the doctor (`main`): a few small ops and one large matmul per precision,
each wrapped so that an error becomes a `failed` line instead of ending the report.
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from smollab.device.mfu import cpu_model_name

Item = dict[str, Any]  # {"item": name, "status": ok|failed|native|emulated|no|yes|n/a, "detail"}

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Slower than fp32 by this factor at n=512 on a CPU: PyTorch's scalar fallback, not a native kernel.
EMULATED_SLOWDOWN = 4.0


def item(name: str, status: str, detail: str, **extra: Any) -> Item:
    return {"item": name, "status": status, "detail": detail, **extra}


def guarded(name: str, fn: Callable[[], Item]) -> Item:
    """`fn()`, or a failed item naming the error: one broken probe never ends the report."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - any error is the finding
        return item(name, "failed", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")


def resolve(want: str) -> torch.device:
    """`auto` is CUDA, then MPS, then the CPU; an explicit device must exist."""
    from smollab.errors import UserError

    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if want == "auto":
        return torch.device("cuda" if cuda else "mps" if mps else "cpu")
    if want == "cuda" and not cuda:
        raise UserError("--device cuda: no CUDA device is visible to PyTorch (try --device auto)")
    if want == "mps" and not mps:
        raise UserError("--device mps: MPS is not available here (try --device auto)")
    return torch.device(want)


# ---- the machine ------------------------------------------------------------------------------


def host_memory_gb() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def describe(device: torch.device) -> tuple[dict[str, Any], list[Item]]:
    """The facts (for the JSON report) and their lines in the table."""
    from smollab.lab.children import cpu_count

    cores_total, cores = os.cpu_count() or 1, cpu_count()
    facts: dict[str, Any] = {
        "kind": device.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu": cpu_model_name(),
        "cpu_cores": cores,
        "cpu_cores_total": cores_total,
        "torch_threads": torch.get_num_threads(),
        "host_memory_gb": host_memory_gb(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    mem = facts["host_memory_gb"]
    lines = [
        item(
            "cpu",
            "ok",
            f"{facts['cpu']}, {cores} cores usable of {cores_total}, "
            f"torch {facts['torch_threads']} threads" + (f", {mem:.0f} GiB RAM" if mem else ""),
        )
    ]
    versions = f"torch {torch.__version__}, python {facts['python']}"
    if device.type == "cuda":
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        facts["gpus"] = [
            {
                "name": p.name,
                "memory_gb": p.total_memory / 2**30,
                "capability": f"{p.major}.{p.minor}",
            }
            for p in props
        ]
        facts["count"], facts["name"] = len(props), props[0].name
        facts["cudnn"] = torch.backends.cudnn.version()
        facts["driver"] = _nvidia_driver()
        names = sorted({p.name for p in props})
        lines.append(
            item(
                "device",
                "ok",
                f"cuda: {len(props)} x {', '.join(names)}, "
                f"{props[0].total_memory / 2**30:.1f} GiB each, compute capability "
                f"{props[0].major}.{props[0].minor}",
            )
        )
        versions += f", CUDA {torch.version.cuda}, cuDNN {facts['cudnn']}"
        versions += f", driver {facts['driver']}" if facts["driver"] else ""
    elif device.type == "mps":
        facts["count"], facts["name"] = 1, f"Apple GPU ({facts['cpu']})"
        rec = getattr(torch.mps, "recommended_max_memory", None)
        facts["memory_gb"] = rec() / 2**30 if rec else None
        lines.append(
            item(
                "device",
                "ok",
                f"mps: {facts['name']}, "
                + (
                    f"{facts['memory_gb']:.1f} GiB usable (unified memory)"
                    if facts["memory_gb"]
                    else "unified memory"
                ),
            )
        )
    else:
        facts["count"], facts["name"] = 1, facts["cpu"]
        lines.append(item("device", "ok", f"cpu: {facts['cpu']}"))
    lines.append(item("versions", "ok", versions))
    return facts, lines


def _nvidia_driver() -> str | None:
    from smollab.lab.mps import run_tool

    r = run_tool(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None


# ---- precisions -------------------------------------------------------------------------------


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """Relative error against a float64 reference, compared on the CPU (MPS has no float64)."""
    return float((got.cpu().double() - want).norm() / want.norm())


def _timed_matmul(device: torch.device, n: int, precision: str, reps: int = 5) -> float:
    """Best seconds of an n x n matmul under the precision's autocast (fp32: none); the best of
    several, since another process's burst on a shared CPU inflates any single one."""
    from smollab.device.runtime import synchronize

    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    best = float("inf")
    for _ in range(reps + 1):  # the first one warms up
        t0 = time.perf_counter()
        with _autocast(device, precision):
            a @ b
        synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _autocast(device: torch.device, precision: str):
    import contextlib

    dtype = _DTYPE.get(precision)
    return torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()


def check_precision(device: torch.device, precision: str) -> Item:
    """Run a small matmul the way training does (fp32, or autocast to bf16/fp16; TF32 by the CUDA
    flag) and judge it by its error against float64: TF32 is on only if the error shows it."""
    name = f"precision {precision}"
    g = torch.Generator(device="cpu").manual_seed(0)
    a64, b64 = (
        torch.randn(256, 256, generator=g, dtype=torch.float64, device="cpu") for _ in range(2)
    )
    want = a64 @ b64
    a, b = a64.float().to(device), b64.float().to(device)
    if precision == "tf32":
        if device.type != "cuda":
            why = "MPS has no TF32" if device.type == "mps" else "TF32 is a CUDA tensor-core mode"
            return item(name, "n/a", why)
        from smollab.device.runtime import tf32_matmuls

        with tf32_matmuls(False):
            err_fp32 = _rel_err(a @ b, want)
        with tf32_matmuls(True):
            err = _rel_err(a @ b, want)
        if err > 10 * max(err_fp32, 1e-7):  # TF32 keeps 10 mantissa bits: ~1e-4 vs fp32's ~1e-7
            return item(
                name,
                "native",
                f"fp32 matmuls on tensor cores (error {err:.1e} vs {err_fp32:.1e} in full fp32)",
                error=err,
            )
        return item(
            name,
            "no",
            f"the flag changes nothing here (error {err:.1e}): no TF32 "
            "tensor cores (compute capability below 8.0)",
        )
    try:
        with _autocast(device, precision):
            c = a @ b
    except RuntimeError as e:  # e.g. bf16 on an MPS of an older macOS
        if precision == "fp32":
            raise
        return item(name, "no", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}")
    want_dtype = _DTYPE.get(precision, torch.float32)
    if c.dtype != want_dtype:
        return item(name, "no", f"autocast produced {c.dtype}, not {want_dtype}")
    err = _rel_err(c, want)
    limit = 1e-4 if precision == "fp32" else 2e-2  # bf16 keeps 8 mantissa bits, fp16 11
    if not err < limit:
        return item(name, "failed", f"matmul error {err:.1e} above {limit:.0e}", error=err)
    if precision == "fp32":
        return item(name, "native", f"matmul error {err:.1e}", error=err)
    cuda_bf16 = device.type == "cuda" and precision == "bf16"
    if cuda_bf16 and not torch.cuda.is_bf16_supported(including_emulation=False):
        return item(
            name,
            "emulated",
            "runs, but the GPU has no bf16 hardware (before Ampere): use fp16 with a GradScaler",
        )
    if device.type == "cpu":
        from smollab.device.runtime import cpu_has_native_matmul

        ratio = _timed_matmul(device, 512, precision) / _timed_matmul(device, 512, "fp32")
        if not cpu_has_native_matmul(precision) or ratio > EMULATED_SLOWDOWN:
            return item(
                name,
                "emulated",
                f"{ratio:.1f}x the time of fp32 (no AVX512/AMX "
                f"{precision} kernels): smollab runs fp32 instead",
                slowdown=ratio,
            )
        return item(
            name,
            "native",
            f"{ratio:.2f}x the time of fp32 at n=512, error {err:.1e}",
            slowdown=ratio,
        )
    note = ", training uses a GradScaler" if precision == "fp16" else ""
    return item(name, "native", f"autocast matmul error {err:.1e}{note}", error=err)


# ---- the CUDA MPS daemon ----------------------------------------------------------------------


def check_mps_daemon(device: torch.device, mps=None) -> Item:
    """Usable means: the control tool exists and a daemon runs or starts (and we stop what we
    started). Whether runs really attach as clients shows in the probe's line."""
    name = "MPS daemon"
    if device.type != "cuda":
        return item(name, "n/a", "NVIDIA CUDA only (concurrent runs share this device without it)")
    from smollab.lab.mps import CONTROL, MPS

    m = mps or MPS()
    if not m.available():
        return item(name, "no", f"{CONTROL} not found: concurrent runs will time-slice the GPU")
    if m.is_running():
        return item(
            name, "yes", "a control daemon is already running: concurrent runs share the GPU"
        )
    if not m.start():
        return item(
            name,
            "no",
            "the control daemon would not start (GPU in a prohibited or "
            "exclusive compute mode, or no permission)",
        )
    m.stop()
    deadline = time.time() + 5  # gone before this process opens its CUDA context
    while m.is_running() and time.time() < deadline:
        time.sleep(0.2)
    return item(
        name,
        "yes",
        "started and stopped the control daemon: `smollab probe` and "
        "sweeps can share the GPU between runs",
    )


# ---- the matmul peak --------------------------------------------------------------------------


def gpu_matmul_peak(device: torch.device, precision: str, n: int, reps: int = 10) -> float:
    """FLOP/s of the best of `reps` n x n matmuls in the precision (bf16/fp16 as tensors of that
    dtype: the tensor-core rate that autocast's matmuls run at; fp32 and tf32 with TF32 off and
    on for the measurement alone)."""
    from smollab.device.runtime import release_cache, synchronize, tf32_matmuls

    dtype = _DTYPE.get(precision, torch.float32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    cuda = device.type == "cuda"
    try:
        with tf32_matmuls(precision == "tf32") if cuda else contextlib.nullcontext():
            a @ b
            synchronize(device)
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                a @ b
                synchronize(device)
                best = min(best, time.perf_counter() - t0)
    finally:
        del a, b
        release_cache(device)
    return 2 * n**3 / best


def check_peak(device: torch.device, precision: str) -> Item:
    name = f"peak {precision}"
    if device.type == "cpu":
        from smollab.device.mfu import machine_load, measure_cpu_peak, store_cpu_peak

        # The doctor's device stage runs alone: a good time to measure the peak MFU divides by.
        dtype = str(_DTYPE.get(precision, torch.float32)).removeprefix("torch.")
        threads = torch.get_num_threads()
        flops = measure_cpu_peak(dtype, threads)
        kept = store_cpu_peak(dtype, threads, flops, machine_load())
        detail = f"{flops / 1e9:,.1f} GFLOP/s (best square matmul, {threads} threads)"
        if kept > flops:
            detail += f"; MFU divides by {kept / 1e9:,.1f}, measured earlier"
        return item(name, "ok", detail, flops=flops, cached_flops=kept)
    n = 8192 if device.type == "cuda" else 4096
    flops = gpu_matmul_peak(device, precision, n)
    detail = f"{flops / 1e12:,.1f} TFLOP/s (best {n}^3 matmul)"
    table = _table_peak(device, precision)
    if table:
        detail += (
            f"; {100 * flops / table:.0f}% of the {table / 1e12:,.0f} TFLOP/s in smollab's table"
        )
    return item(name, "ok", detail, flops=flops, table_flops=table)


def _table_peak(device: torch.device, precision: str) -> float | None:
    """What MFU divides by for this precision (device.mfu.peak_flops), CUDA only."""
    if device.type != "cuda":
        return None
    from smollab.device.mfu import peak_flops
    from smollab.device.runtime import tf32_matmuls

    with tf32_matmuls(precision == "tf32"):
        return peak_flops(device, _DTYPE.get(precision))


def check_decode(device: torch.device, rows: int = 4, tokens: int = 16) -> Item:
    """The decode step the sampler's `auto` takes on this device and why (`engine.static_decode`,
    the reason GRPO's run log prints), tried for real: a micro Llama draws `tokens` tokens for
    `rows` rows there with it, and they must be the eager step's tokens for the same seed."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from smollab.device.runtime import synchronize
    from smollab.engine.sampler import Sampler

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).to(device).eval()
    prompts = [[1, 2, 3, 4]] * rows
    kw = dict(seed=0, stop_at_eos=False)
    eager = Sampler(model, pad_token_id=0, decode="eager").generate(prompts, tokens, **kw)
    sampler = Sampler(model, pad_token_id=0, decode="auto")
    sampler.generate(prompts, tokens, **kw)  # warm: caches, compiles
    synchronize(device)
    t = time.perf_counter()
    auto = sampler.generate(prompts, tokens, **kw)
    synchronize(device)
    ms = (time.perf_counter() - t) * 1e3
    chosen = f"auto decodes with the {sampler.decode} step ({sampler.decode_reason})"
    if not torch.equal(auto.completion_ids, eager.completion_ids):
        return item("decode", "failed", f"{chosen}, which drew other tokens than the eager step")
    detail = f"{chosen}; {rows} x {tokens} tokens of a micro Llama in {ms:.1f} ms"
    return item("decode", "ok", detail, decode=sampler.decode)


def device_report(device: torch.device, mps=None) -> tuple[dict[str, Any], list[Item]]:
    """Facts, MPS daemon, precision, peak and decode lines; the peak is measured for each
    precision that runs natively (fp32 always). The daemon comes first, before this process
    opens a CUDA context that would attach to it."""
    mps_line = guarded("MPS daemon", lambda: check_mps_daemon(device, mps))
    facts, lines = describe(device)
    lines.append(mps_line)
    precisions = [
        guarded(f"precision {p}", lambda p=p: check_precision(device, p)) for p in PRECISIONS
    ]
    lines += precisions
    native = [p for p, it in zip(PRECISIONS, precisions, strict=True) if it["status"] == "native"]
    for p in ["fp32", *[p for p in native if p != "fp32"]]:
        lines.append(guarded(f"peak {p}", lambda p=p: check_peak(device, p)))
    lines.append(guarded("decode", lambda: check_decode(device)))
    return facts, lines


def main(argv: list[str]) -> int:
    """`python -m smollab.lab.doctor_device DEVICE OUT.json`: the doctor runs this as a child, so
    that a driver hang has a time limit and the doctor itself never holds a device context while
    its micro runs (and the probe) measure the device."""
    from smollab.errors import UserError
    from smollab.rundir.atomic import atomic_write_json

    want, out = argv
    try:
        dev = resolve(want)
    except UserError as e:
        atomic_write_json(Path(out), {"error": str(e)})
        return 2
    facts, lines = device_report(dev)
    atomic_write_json(Path(out), {"device": facts, "items": lines})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
