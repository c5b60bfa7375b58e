"""The marks every GPU test carries: `gpu` (select with `pytest -m gpu`), and a skip with a
one-line reason where PyTorch sees no such device, so the default run collects and skips them in
milliseconds (no fixture is set up for a skipped test). `ON_ACCELERATORS` runs a test once per
accelerator kind, CUDA and Apple's MPS, each skipped where it is absent."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import pytest
import torch

CUDA = torch.cuda.is_available()
MPS = torch.backends.mps.is_available()
REASON = "needs a CUDA GPU: torch.cuda.is_available() is False on this machine"
MPS_REASON = "needs Apple's MPS: torch.backends.mps.is_available() is False on this machine"
GPU = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason=REASON)]
ON_ACCELERATORS = [
    pytest.mark.gpu,
    pytest.mark.parametrize(
        "device",
        [
            pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason=REASON)),
            pytest.param("mps", marks=pytest.mark.skipif(not MPS, reason=MPS_REASON)),
        ],
    ),
]


def bf16_ok() -> bool:
    """Native bf16 (Ampere and newer); runs in bf16 are skipped on older GPUs."""
    return CUDA and torch.cuda.is_bf16_supported(including_emulation=False)


def compile_toolchain_missing() -> str | None:
    """Why torch.compile cannot build its kernels here, or None: inductor compiles C++ (and
    Triton its launchers) with a C compiler against the Python headers."""
    if not any(shutil.which(cc) for cc in ("cc", "gcc", "clang")):
        return "torch.compile needs a C compiler (cc, gcc or clang) on PATH"
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        return f"torch.compile needs the Python headers ({headers} is missing)"
    return None


def chosen(log_lines: list[str]) -> str:
    """What the run's `runtime:` log line says it chose (its `skipped:` part left out)."""
    line = next(ln for ln in log_lines if "runtime:" in ln)
    return line.split("runtime:", 1)[1].split("; skipped:")[0]
