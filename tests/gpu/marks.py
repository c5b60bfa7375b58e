"""The marks every GPU test carries: `gpu` (select with `pytest -m gpu`), and a skip with a
one-line reason where PyTorch sees no CUDA device, so the default run collects and skips them in
milliseconds (no fixture is set up for a skipped test)."""

from __future__ import annotations

import pytest
import torch

CUDA = torch.cuda.is_available()
REASON = "needs a CUDA GPU: torch.cuda.is_available() is False on this machine"
GPU = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason=REASON)]


def bf16_ok() -> bool:
    """Native bf16 (Ampere and newer); runs in bf16 are skipped on older GPUs."""
    return CUDA and torch.cuda.is_bf16_supported(including_emulation=False)


def chosen(log_lines: list[str]) -> str:
    """What the run's `runtime:` log line says it chose (its `skipped:` part left out)."""
    line = next(ln for ln in log_lines if "runtime:" in ln)
    return line.split("runtime:", 1)[1].split("; skipped:")[0]
