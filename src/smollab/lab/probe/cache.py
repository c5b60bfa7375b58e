"""The probe's cache: results keyed by device and workload signature (model, LoRA rank, batch,
sequence or completion length, precision and, on CUDA, whether the runs share the GPU through the
MPS daemon), which is what `concurrency: auto` in a sweep reads."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from smollab.rundir.atomic import atomic_write_json


def device_info(kind: str, threads: int, runner=None) -> dict[str, Any]:
    """Name and memory of the device the workload runs on (nvidia-smi for CUDA: mockable)."""
    if kind == "cuda":
        from smollab.lab.mps import run_tool

        r = (runner or run_tool)(
            [
                "nvidia-smi",
                "--query-gpu=name,memory.total,memory.used",
                "--format=csv,noheader,nounits",
            ]
        )
        line = r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else ""
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            return {
                "kind": "cuda",
                "name": parts[0],
                "memory_mb": float(parts[1]) - float(parts[2]),
                "threads": threads,
            }
        return {"kind": "cuda", "name": "cuda", "memory_mb": None, "threads": threads}
    from smollab.device.mfu import cpu_model_name

    name = cpu_model_name()
    mem = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                mem = int(line.split()[1]) / 1024
    except OSError:
        pass
    return {"kind": kind, "name": name, "memory_mb": mem, "threads": threads}


def device_kind(want: str) -> str:
    """`perf.device`, or when it is auto the device torch finds (cuda, then mps, else cpu)."""
    if want != "auto":
        return want
    import torch

    if torch.cuda.is_available():
        return "cuda"
    return "mps" if torch.backends.mps.is_available() else "cpu"


def device_key(info: dict[str, Any]) -> str:
    if info["kind"] == "cuda":
        return f"cuda:{info['name']}"
    return f"{info['kind']}:{info['name']}:{info['threads']}threads"


def mps_daemon_setting(kind: str, mps: bool | str) -> bool | None:
    """Whether runs on `kind` share the GPU through NVIDIA's MPS daemon (`mps`: true, false or
    auto, which means on); None off CUDA, where there is no such daemon."""
    return None if kind != "cuda" else mps is not False


def workload_signature(command: str, cfg, mps_daemon: bool | None = None) -> dict[str, Any]:
    """What decides how many copies fit: model, LoRA rank, batch, lengths, precision, and on
    CUDA the MPS daemon (with it, kernels of the k runs overlap; without, they time-slice)."""
    sig = {
        "command": command,
        "model": cfg.model.path or cfg.model.preset,
        "lora_r": lora.r if (lora := getattr(cfg.model, "lora", None)) and lora.enabled else 0,
        "batch_size": cfg.train.batch_size,
        "precision": cfg.perf.precision,
        "compile": getattr(cfg.perf, "compile", False),  # GRPO's perf has no compile key
        "grad_checkpointing": cfg.perf.grad_checkpointing,
    }
    if command == "grpo":
        sig.update(
            max_completion_length=cfg.grpo.max_completion_length,
            num_generations=cfg.grpo.num_generations,
            beta=cfg.grpo.beta > 0,
        )
    else:
        sig.update(seq_len=cfg.train.seq_len, grad_accum=cfg.train.grad_accum)
    if mps_daemon is not None:  # CUDA only: CPU signatures (so their cache keys) stay as they were
        sig["mps_daemon"] = mps_daemon
    return sig


def cache_dir() -> Path:
    from smollab.device.cache_dir import cache_root

    return cache_root() / "probe"


def cache_path(device: dict[str, Any], signature: dict[str, Any]) -> Path:
    blob = json.dumps({"device": device_key(device), "workload": signature}, sort_keys=True)
    return cache_dir() / f"{hashlib.sha1(blob.encode()).hexdigest()[:16]}.json"


def cache_lookup(device: dict[str, Any], signature: dict[str, Any]) -> dict[str, Any] | None:
    p = cache_path(device, signature)
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def cache_store(result: dict[str, Any], signature: dict[str, Any] | None = None) -> Path:
    p = cache_path(result["device"], signature or result["workload"])
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(p, result)
    return p


def lanes_signature(signature: dict[str, Any]) -> dict[str, Any]:
    """The cache key of a probe's lane counts (what `lanes: auto` reads): the workload marked as
    lanes, kept apart from the process counts so that a later probe without lanes does not
    erase them; without the MPS setting, since the lanes are one process."""
    return {**{k: v for k, v in signature.items() if k != "mps_daemon"}, "probe": "lanes"}
