"""Device, precision, autocast, TF32, compile, threads and the AdamW implementation.

`setup_runtime` turns the `perf` section into concrete choices and records, for one log line,
what it chose and what it skipped and why: a knob that cannot apply degrades, never crashes.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
from dataclasses import dataclass, field

import torch

from smollab.config import PerfConfig
from smollab.errors import UserError

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Runtime:
    device: torch.device
    precision: str
    autocast_dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None
    compile: bool
    compile_mode: str
    optimizer_impl: str
    chosen: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def describe(self) -> str:
        line = "runtime: " + ", ".join(self.chosen)
        if self.skipped:
            line += "; skipped: " + "; ".join(self.skipped)
        return line


def pick_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("perf.device=cuda: no CUDA device is available (use perf.device=auto)")
    if name == "mps" and not torch.backends.mps.is_available():
        raise UserError("perf.device=mps: MPS is not available here (use perf.device=auto)")
    return torch.device(name)


def setup_runtime(perf: PerfConfig) -> Runtime:
    device = pick_device(perf.device)
    chosen = [f"device {device.type}"]
    skipped: list[str] = []

    if perf.threads:
        torch.set_num_threads(perf.threads)
    chosen.append(f"{torch.get_num_threads()} threads")
    if perf.retain_freed_memory and device.type == "cpu":
        if retain_freed_memory():
            chosen.append("malloc keeps freed memory")
        else:
            skipped.append("retain_freed_memory (needs Linux glibc)")

    precision = perf.precision
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise UserError("perf.precision=bf16: this GPU has no bf16 support (use fp16 or fp32)")
    if device.type == "cpu" and precision != "fp32" and not cpu_has_native_matmul(precision):
        skipped.append(f"{precision} (this CPU has no native {precision} matmul, and PyTorch's "
                       "fallback is ~50x slower than fp32: running fp32)")  # fmt: skip
        precision = "fp32"
    autocast_dtype = _DTYPES.get(precision)
    scaler = None
    if precision == "fp16":
        scaler = torch.amp.GradScaler(device.type) if device.type in ("cuda", "cpu") else None
    chosen.append(f"precision {precision}" + (" autocast" if autocast_dtype else ""))

    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = perf.tf32
        torch.backends.cudnn.allow_tf32 = perf.tf32
        chosen.append(f"tf32 {'on' if perf.tf32 else 'off'}")
    elif perf.tf32:
        skipped.append(f"tf32 (CUDA only; {device.type} has no TF32)")

    use_compile = getattr(perf, "compile", False)  # only a loop that compiles has the key
    compile_mode = getattr(perf, "compile_mode", "default")
    if use_compile and device.type == "mps":
        skipped.append("compile (inductor does not target MPS well; running eager)")
        use_compile = False
    if use_compile:
        chosen.append(f"compile {compile_mode}")

    impl = perf.optimizer_impl
    if impl == "auto":
        impl = "fused" if device.type in ("cuda", "cpu") else "foreach"
    if impl == "fused" and device.type == "mps":
        skipped.append("fused AdamW (not on MPS; using foreach)")
        impl = "foreach"
    chosen.append(f"AdamW {impl}")

    if perf.grad_checkpointing:
        chosen.append("gradient checkpointing")

    return Runtime(
        device=device, precision=precision, autocast_dtype=autocast_dtype, scaler=scaler,
        compile=use_compile, compile_mode=compile_mode, optimizer_impl=impl,
        chosen=chosen, skipped=skipped,
    )  # fmt: skip


def cpu_has_native_matmul(precision: str) -> bool:
    """Whether oneDNN runs bf16 / fp16 matmuls natively here (AVX512-BF16, AVX512-FP16 or AMX).

    Without it PyTorch falls back to a scalar kernel: on an AVX2-only EPYC a bf16
    [2336, 341] @ [341, 128] matmul took 106 ms against 1.9 ms in fp32, and a GRPO policy step
    2.4 s against 0.22 s. Unknown (an older PyTorch without the check): assume native.
    """
    check = getattr(torch.ops.mkldnn, f"_is_mkldnn_{precision}_supported", None)
    try:
        return bool(check()) if check is not None else True
    except RuntimeError:
        return True


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def retain_freed_memory() -> bool:
    """Make glibc malloc keep freed memory for reuse instead of returning it to the kernel.

    Why: by default a freed tensor above glibc's mmap threshold (128 KB, adapting up to 32 MB)
    goes back to the kernel, and the next step's tensor of the same size page-faults its memory
    in again: thousands of faults a GRPO step on the dev VM (~2 us each), and the head's
    log-prob forward and backward measured about 20% slower for it. Big allocations now come
    from the heap and the heap is never trimmed, so the process keeps its peak footprint.
    This is the effect PyTorch's CPU tuning guide gets from jemalloc or tcmalloc, without a
    preload. Returns False where there is no glibc (macOS, musl, Windows).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(_M_MMAP_THRESHOLD, 1 << 30) or mallopt(_M_MMAP_THRESHOLD, 32 << 20)):
        return False  # newer glibc accepts 1 GiB; older ones cap the threshold at 32 MiB
    return bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def make_adamw(param_groups, rt: Runtime, lr: float, betas, eps: float) -> torch.optim.AdamW:
    kwargs = {"fused": True} if rt.optimizer_impl == "fused" else {}
    if rt.optimizer_impl == "foreach":
        kwargs = {"foreach": True}
    elif rt.optimizer_impl == "plain":
        kwargs = {"foreach": False}
    return torch.optim.AdamW(param_groups, lr=lr, betas=betas, eps=eps, **kwargs)


def maybe_compile(module, rt: Runtime):
    if not rt.compile:
        return module
    return torch.compile(module, mode=None if rt.compile_mode == "default" else rt.compile_mode)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
    elif device.type == "mps":
        torch.mps.synchronize()


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory, or the process's peak RSS on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    if device.type == "mps":
        return torch.mps.driver_allocated_memory() / 2**20
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


def release_cache(device: torch.device) -> None:
    """MPS and CUDA keep freed blocks; small models on unified memory benefit from a release."""
    if device.type == "mps":
        torch.mps.empty_cache()
    elif device.type == "cuda":
        torch.cuda.empty_cache()
