import subprocess
import sys

import pytest

from smollab import device
from smollab.config import PerfConfig
from smollab.device import setup_runtime

# A "training step" that holds 128 MB of 4 MB temporaries, then frees them. By default glibc
# trims the heap top above 64 MB after each step, so every step faults ~30,000 pages in again.
_STEP_FAULTS = """
import resource, sys, torch
from smollab.device import retain_freed_memory
assert retain_freed_memory()
def step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    kept = [torch.ones(1 << 20) for _ in range(32)]
    del kept
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(max([step() for _ in range(20)][10:]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc only")
def test_retained_memory_is_not_faulted_in_again():
    out = subprocess.run([sys.executable, "-c", _STEP_FAULTS], capture_output=True, text=True,
                         check=True)  # fmt: skip
    assert int(out.stdout.split()[-1]) < 100  # 32,768 pages a step if the heap were trimmed


def test_setup_runtime_reports_the_malloc_choice():
    rt = setup_runtime(PerfConfig(device="cpu", retain_freed_memory=False))
    assert "malloc" not in rt.describe()
    if sys.platform.startswith("linux"):
        rt = setup_runtime(PerfConfig(device="cpu"))
        assert "malloc keeps freed memory" in rt.describe()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_cpu_without_native_half_matmuls_runs_fp32_and_says_so(monkeypatch, precision):
    monkeypatch.setattr(device, "cpu_has_native_matmul", lambda p: False)
    rt = setup_runtime(PerfConfig(device="cpu", precision=precision))
    assert rt.precision == "fp32" and rt.autocast_dtype is None and rt.scaler is None
    assert any(s.startswith(f"{precision} (this CPU has no native") for s in rt.skipped)
    monkeypatch.setattr(device, "cpu_has_native_matmul", lambda p: True)
    rt = setup_runtime(PerfConfig(device="cpu", precision=precision))
    assert rt.precision == precision and rt.autocast_dtype is not None
    assert (rt.scaler is not None) == (precision == "fp16")
