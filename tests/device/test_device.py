import subprocess
import sys
import warnings

import pytest

import smollab.device.runtime as device
from smollab.config import PerfConfig
from smollab.device.runtime import setup_runtime

# A "training step" that holds 128 MB of 4 MB temporaries, then frees them. By default glibc
# trims the heap top above 64 MB after each step, so every step faults ~30,000 pages in again.
_STEP_FAULTS = """
import resource, sys, torch
from smollab.device.runtime import retain_freed_memory
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
    out = subprocess.run(
        [sys.executable, "-c", _STEP_FAULTS], capture_output=True, text=True, check=True
    )
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


# ---- the device rules, decided for CUDA and MPS on this CPU machine --------------------------


PRECISIONS = ("cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul", "")


def _setting(path: str):
    import torch

    owner = torch.backends
    for part in [p for p in path.split(".") if p]:
        owner = getattr(owner, part)
    return owner


@pytest.fixture
def fp32_precisions():
    """torch's fp32_precision settings as they were before the test (they are global)."""
    saved = {p: _setting(p).fp32_precision for p in PRECISIONS}
    yield saved
    for p, value in saved.items():
        _setting(p).fp32_precision = value


@pytest.fixture
def on(monkeypatch, fp32_precisions):
    """on("mps") / on("cuda"): setup_runtime picks that device; global flags it sets are restored."""
    import torch

    def pick(kind: str):
        monkeypatch.setattr(device, "pick_device", lambda name: torch.device(kind))

    yield pick


def test_mps_has_no_tf32_fused_adamw_and_compiles_with_aot_eager(on, monkeypatch, fp32_precisions):
    import torch

    from smollab.config import CompiledPerfConfig

    on("mps")
    rt = setup_runtime(CompiledPerfConfig(tf32=True, compile=True, compile_mode="max-autotune"))
    assert {p: _setting(p).fp32_precision for p in PRECISIONS} == fp32_precisions  # untouched
    assert "tf32 (CUDA only; mps has no TF32: fp32 stays fp32)" in rt.skipped
    assert rt.compile and rt.compile_backend == "aot_eager"
    assert "compile aot_eager (torch 2.13 calls inductor's Metal backend a prototype)" in rt.chosen
    assert any(s.startswith("compile_mode max-autotune") for s in rt.skipped)
    assert rt.optimizer_impl == "fused"  # torch 2.13 has a fused AdamW kernel for MPS
    assert not any("AdamW" in s for s in rt.skipped)
    calls = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: calls.append(kw) or m)
    device.maybe_compile(torch.nn.Linear(2, 2), rt)
    assert calls == [{"backend": "aot_eager"}]


def test_mps_cache_is_handed_back_only_under_memory_pressure(monkeypatch):
    """Metal allocations below MPS_PRESSURE of the recommended working set keep the cache (the
    next rollout reuses it); above, it goes."""
    import torch

    gib = 2**30
    held = {"driver": 2 * gib}
    emptied: list[int] = []
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 16 * gib)
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: held["driver"])
    monkeypatch.setattr(torch.mps, "empty_cache", lambda: emptied.append(held["driver"]))
    mps = torch.device("mps")
    assert device.release_cache(mps) is False and emptied == []
    held["driver"] = int(device.MPS_PRESSURE * 16 * gib) + 1
    assert device.release_cache(mps) is True and emptied == [held["driver"]]
    assert device.release_cache(torch.device("cpu")) is False and len(emptied) == 1


def test_mfu_reads_tf32_set_through_the_fp32_precision_api(fp32_precisions):
    """torch 2.13 raises when a TF32 state set through `fp32_precision` is read through the legacy
    `allow_tf32`; smollab reads and writes the new settings only."""
    import torch

    from smollab.device.mfu import tf32_enabled

    torch.backends.cuda.matmul.fp32_precision = "tf32"
    assert tf32_enabled() is True
    device.set_tf32(False)
    assert tf32_enabled() is False
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    torch.backends.cuda.matmul.fp32_precision = "none"  # unset: the generic setting decides
    torch.backends.fp32_precision = "tf32"
    assert tf32_enabled() is True
    with device.tf32_matmuls(False):
        assert tf32_enabled() is False
    assert tf32_enabled() is True  # restored


@pytest.mark.parametrize(
    ("precision", "version", "macos14", "expect"),
    [
        ("bf16", "2.13.0", True, None),
        ("bf16", "2.13.0", False, "bf16 on MPS needs macOS 14 or newer"),
        ("bf16", "2.5.1", True, "bf16 autocast on MPS needs torch >= 2.6"),
        ("fp16", "2.13.0", False, None),
        ("fp16", "2.7.1", True, "a GradScaler for MPS needs torch >= 2.8"),
    ],
)
def test_mps_precisions_need_their_torch_and_macos(
    on, monkeypatch, precision, version, macos14, expect
):
    import torch

    on("mps")
    monkeypatch.setattr(torch, "__version__", version)
    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: macos14)
    rt = setup_runtime(PerfConfig(precision=precision, tf32=False))
    if expect is None:
        assert rt.precision == precision and rt.autocast_dtype is not None
        assert (rt.scaler is not None) == (precision == "fp16")
        assert rt.describe().count(f"precision {precision} autocast") == 1
    else:
        assert rt.precision == "fp32" and rt.autocast_dtype is None and rt.scaler is None
        assert any(
            s.startswith(f"{precision} ({expect}") and "running fp32" in s for s in rt.skipped
        )


def test_cuda_bf16_only_when_native_fp16_with_a_scaler_and_tf32_as_asked(on, monkeypatch):
    import torch

    on("cuda")
    native = {"bf16": False}
    monkeypatch.setattr(
        torch.cuda,
        "is_bf16_supported",
        lambda including_emulation=True: native["bf16"] or including_emulation,
    )
    rt = setup_runtime(PerfConfig(precision="bf16", tf32=False))
    assert rt.precision == "fp32" and "this GPU has no native bf16" in rt.describe()
    assert torch.backends.cuda.matmul.fp32_precision == "ieee" and "tf32 off" in rt.chosen
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"
    native["bf16"] = True
    rt = setup_runtime(PerfConfig(precision="bf16", tf32=True))
    assert rt.autocast_dtype is torch.bfloat16 and rt.scaler is None
    assert "bf16 autocast (native on this GPU" in rt.describe()
    assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.cudnn.conv.fp32_precision == "tf32"
    with warnings.catch_warnings():  # without a GPU the scaler warns that it is disabled
        warnings.simplefilter("ignore")
        rt = setup_runtime(PerfConfig(precision="fp16"))
    assert rt.autocast_dtype is torch.float16 and rt.scaler is not None
    assert rt.optimizer_impl == "fused"


def test_cpu_says_when_it_runs_bf16(monkeypatch):
    monkeypatch.setattr(device, "cpu_has_native_matmul", lambda p: True)
    rt = setup_runtime(PerfConfig(device="cpu", precision="bf16"))
    assert "precision bf16 autocast (native on this CPU" in rt.describe()


def test_synchronize_peak_memory_and_cache_per_device_kind(monkeypatch):
    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: calls.append(("cuda sync", d)))
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append(("mps sync", None)))
    monkeypatch.setattr(
        torch.cuda, "max_memory_allocated", lambda d=None: calls.append(("cuda peak", d)) or 2**21
    )
    driver = iter([3 * 2**20, 3 * 2**20, 2**20])  # release_cache's look, then two peaks
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: next(driver))
    monkeypatch.setattr(torch.mps, "recommended_max_memory", lambda: 2**20)  # under pressure
    monkeypatch.setattr(torch.mps, "empty_cache", lambda: calls.append(("mps empty", None)))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("cuda empty", None)))
    monkeypatch.setattr(device, "_mps_peak_bytes", 0)
    cuda1, mps, cpu = torch.device("cuda", 1), torch.device("mps"), torch.device("cpu")
    for d in (cuda1, mps, cpu):
        device.synchronize(d)
        device.release_cache(d)
    with pytest.raises(ValueError, match="unsupported device"):
        device.synchronize(torch.device("meta"))
    assert device.peak_memory_mb(cuda1) == 2.0
    assert device.peak_memory_mb(mps) == 3.0 and device.peak_memory_mb(mps) == 3.0  # the peak seen
    assert device.peak_memory_mb(cpu) > 0  # the process's peak RSS
    assert calls == [
        ("cuda sync", cuda1),
        ("mps sync", None),
        ("mps empty", None),
        ("cuda peak", cuda1),
    ]


def test_to_device_copies_plainly_off_cuda():
    import torch

    t = torch.arange(4, device="cpu")
    assert device.to_device(t, torch.device("cpu")) is t
    assert not t.is_pinned()
