"""Model FLOPs utilization: FLOPs per token, and the device's peak to divide by.

GPU peaks come from vendor tables (dense, no sparsity). A CPU has no table worth trusting, so
its peak is measured once with a large matmul and cached per CPU model, thread count and dtype.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch

# Dense TFLOP/s by GPU name fragment: (bf16/fp16 tensor, fp32 or TF32 when enabled).
GPU_PEAK_TFLOPS = {
    "H200": (989.0, 494.0), "H100": (989.0, 494.0), "A100": (312.0, 156.0),
    "L40S": (362.0, 183.0), "L4": (121.0, 60.0), "A10": (125.0, 62.5),
    "4090": (165.0, 82.6), "3090": (71.0, 35.6), "V100": (125.0, 15.7), "T4": (65.0, 8.1),
}  # fmt: skip


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


def _cache_path() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "smollab"
    return root / "cpu_peak.json"


def measure_cpu_peak(dtype: torch.dtype = torch.float32, n: int = 2048, reps: int = 8) -> float:
    """Best single large-matmul rate: the fastest rep approximates the peak on a busy machine."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def peak_flops(device: torch.device, autocast_dtype: torch.dtype | None) -> float | None:
    """FLOP/s peak of this device for the precision in use; None when unknown."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for frag, (half, single) in GPU_PEAK_TFLOPS.items():
            if frag in name:
                tf32 = torch.backends.cuda.matmul.allow_tf32
                return 1e12 * (
                    half if autocast_dtype is not None else single if tf32 else single / 2
                )
        return None
    if device.type != "cpu":
        return None
    dtype = autocast_dtype or torch.float32
    key = f"{platform.processor() or platform.machine()}|{torch.get_num_threads()}|{dtype}"
    path = _cache_path()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key not in cache:
        cache[key] = measure_cpu_peak(dtype)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(cache))
            os.replace(tmp, path)
        except OSError:
            pass
    return cache[key]
