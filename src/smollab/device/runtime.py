"""Device, precision, autocast, TF32, compile, threads, the AdamW implementation, and the
per-device primitives the loops share (host-to-device copies, synchronize, peak memory, cache).

`setup_runtime` turns the `perf` section into concrete choices and records, for one log line,
what it chose and why, and what it skipped and why: a knob that cannot apply on this device
degrades (to fp32, to foreach AdamW), never crashes. The device rules:
- CUDA: bf16 only on GPUs with native bf16 (Ampere and newer); fp16 with a GradScaler; TF32 as
  `perf.tf32` says, through torch's `fp32_precision` settings alone (`set_tf32`); pinned,
  asynchronous host-to-device copies.
- MPS: no TF32 (torch 2.13's fp32 precision settings have no MPS backend: nothing to set); bf16
  autocast from torch 2.6 on macOS 14+; fp16 only with a GradScaler, which MPS has from torch
  2.8; `torch.compile` with the `aot_eager` backend (torch 2.13's inductor calls its Metal
  backend an early prototype); fused AdamW as on CUDA and the CPU (torch 2.13 lists MPS among
  the fused kernels' devices); the allocator's cache handed back after rollouts and evaluations
  only under memory pressure (`release_cache`).
- CPU: bf16 / fp16 only with native matmuls (AMX, AVX512-BF16/FP16), else fp32.
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
# The first torch releases with bf16 autocast on MPS, and with a GradScaler for MPS (fp16).
MPS_BF16_TORCH, MPS_GRAD_SCALER_TORCH = "2.6", "2.8"


@dataclass
class Runtime:
    device: torch.device
    precision: str
    autocast_dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None
    compile: bool
    compile_mode: str
    optimizer_impl: str
    compile_backend: str = "inductor"
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


def _torch_at_least(version: str) -> bool:
    return torch.torch_version.TorchVersion(torch.__version__.split("+")[0]) >= version


def precision_unsupported(device: torch.device, precision: str) -> str | None:
    """Why `device` cannot train in `precision` natively (None: it can). fp16 counts as
    supported only where a GradScaler is too: fp16 gradients underflow without loss scaling."""
    if precision == "fp32":
        return None
    if device.type == "cuda":
        if precision == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
            return "this GPU has no native bf16 (Ampere or newer has it)"
        return None
    if device.type == "mps":
        if precision == "bf16" and not _torch_at_least(MPS_BF16_TORCH):
            return (
                f"bf16 autocast on MPS needs torch >= {MPS_BF16_TORCH}, this is {torch.__version__}"
            )
        if precision == "bf16" and not torch.backends.mps.is_macos_or_newer(14, 0):
            return "bf16 on MPS needs macOS 14 or newer"
        if precision == "fp16" and not _torch_at_least(MPS_GRAD_SCALER_TORCH):
            return (
                f"a GradScaler for MPS needs torch >= {MPS_GRAD_SCALER_TORCH}, this is "
                f"{torch.__version__}"
            )
        return None
    if device.type == "cpu" and not cpu_has_native_matmul(precision):
        return (
            f"this CPU has no native {precision} matmul, and PyTorch's fallback is ~50x "
            "slower than fp32"
        )
    return None


def _precision_note(device: torch.device, precision: str) -> str:
    """What the runtime line says about the precision it chose (no commas: one item)."""
    where = {"cuda": "GPU", "mps": "Mac GPU"}.get(device.type, "CPU")
    if precision == "bf16":
        return f"bf16 autocast (native on this {where}: fp32's range needs no GradScaler)"
    if precision == "fp16":
        return "fp16 autocast + GradScaler (loss scaling for fp16's narrow range)"
    return "fp32"


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
    if why := precision_unsupported(device, precision):
        skipped.append(f"{precision} ({why}: running fp32)")
        precision = "fp32"
    autocast_dtype = _DTYPES.get(precision)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    chosen.append(f"precision {_precision_note(device, precision)}")

    if device.type == "cuda":
        set_tf32(perf.tf32)
        chosen.append(f"tf32 {'on' if perf.tf32 else 'off'}")
    elif perf.tf32:
        skipped.append(f"tf32 (CUDA only; {device.type} has no TF32: fp32 stays fp32)")

    use_compile = getattr(perf, "compile", False)  # only a loop that compiles has the key
    compile_mode = getattr(perf, "compile_mode", "default")
    backend = "aot_eager" if device.type == "mps" else "inductor"
    if use_compile:
        if backend == "aot_eager":
            chosen.append(
                "compile aot_eager (torch 2.13 calls inductor's Metal backend a prototype)"
            )
            if compile_mode != "default":
                skipped.append(
                    f"compile_mode {compile_mode} (an inductor mode; MPS compiles with aot_eager)"
                )
        else:
            chosen.append(f"compile {compile_mode}")

    impl = perf.optimizer_impl
    if impl == "auto":  # the devices torch 2.13 has fused AdamW kernels for, of those we run on
        impl = "fused" if device.type in ("cuda", "cpu", "mps") else "foreach"
    chosen.append(f"AdamW {impl}")

    if perf.grad_checkpointing:
        chosen.append("gradient checkpointing")
    if device.type == "mps":
        chosen.append(
            f"MPS cache handed back after rollouts and evaluations above "
            f"{MPS_PRESSURE:.0%} of the recommended working set"
        )

    return Runtime(
        device=device,
        precision=precision,
        autocast_dtype=autocast_dtype,
        scaler=scaler,
        compile=use_compile,
        compile_mode=compile_mode,
        optimizer_impl=impl,
        compile_backend=backend,
        chosen=chosen,
        skipped=skipped,
    )


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


def set_tf32(on: bool) -> None:
    """Whether CUDA fp32 matmuls and cuDNN convolutions (and RNNs) may run on TF32 tensor cores,
    through torch's `fp32_precision` settings ("tf32" or "ieee"). Only these: torch 2.13 raises
    when a TF32 state set through them is read through the legacy `allow_tf32` or
    `get_float32_matmul_precision` (a "mix of the legacy and new APIs"), and it warns that the
    legacy ones are deprecated after 2.9. Readers use `device.mfu.tf32_enabled`."""
    mode = "tf32" if on else "ieee"
    torch.backends.cuda.matmul.fp32_precision = mode
    torch.backends.cudnn.conv.fp32_precision = mode
    torch.backends.cudnn.rnn.fp32_precision = mode


@contextlib.contextmanager
def tf32_matmuls(on: bool):
    """CUDA fp32 matmuls with TF32 on or off within the block (the doctor's measurements)."""
    old = torch.backends.cuda.matmul.fp32_precision
    torch.backends.cuda.matmul.fp32_precision = "tf32" if on else "ieee"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.fp32_precision = old


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
    if rt.compile_backend != "inductor":  # modes are inductor's
        return torch.compile(module, backend=rt.compile_backend)
    return torch.compile(module, mode=None if rt.compile_mode == "default" else rt.compile_mode)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device`. CUDA: through pinned memory and asynchronously, so the copy
    overlaps the GPU's work (PyTorch's pinned-memory cache keeps the page-locked buffer until
    the copy is done). MPS: a plain copy (non_blocking host-to-MPS copies have returned wrong
    data in several torch releases, and unified memory gains little from them). CPU: no copy."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (step timings must not stop at a kernel launch)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    elif device.type != "cpu":  # pick_device gives cuda, mps or cpu
        raise ValueError(f"synchronize: unsupported device {device}")


_mps_peak_bytes = 0


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory of this process on `device`, in MiB. CUDA: the most tensors ever held
    (`max_memory_allocated`). MPS: the largest `driver_allocated_memory` seen at a call (the
    Metal allocations, cache included, which is what a second process on the same unified
    memory lacks; torch keeps no peak for MPS, and the cache holds the step's peak blocks until
    `release_cache`). CPU: the process's peak resident set."""
    global _mps_peak_bytes
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if device.type == "mps":
        _mps_peak_bytes = max(_mps_peak_bytes, torch.mps.driver_allocated_memory())
        return _mps_peak_bytes / 2**20
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10


# MPS: the share of Metal's recommended working set (`torch.mps.recommended_max_memory`) above
# which the process's Metal allocations count as memory pressure and the cache is handed back.
MPS_PRESSURE = 0.75


def release_cache(device: torch.device) -> bool:
    """MPS under memory pressure: hand the allocator's cached blocks back; True when it did.
    Called after rollouts and evaluations. Unified memory is the machine's, so what the cache
    holds the OS and other processes lack; but torch's MPS allocator collects its cache only
    past its low watermark, 1.4 x the recommended working set (ATen/mps/MPSAllocator.h), where
    macOS is already compressing memory, while emptying it after every rollout makes the next
    step allocate its Metal buffers again. So the cache goes only once the process's Metal
    allocations (cache included) pass MPS_PRESSURE of the recommended working set. CUDA and CPU
    keep theirs: the next step reuses the same blocks, and handing them back would only cost a
    fresh cudaMalloc per step."""
    if device.type != "mps":
        return False
    if torch.mps.driver_allocated_memory() <= MPS_PRESSURE * torch.mps.recommended_max_memory():
        return False
    torch.mps.empty_cache()
    return True
