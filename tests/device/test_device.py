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


@pytest.fixture
def on(monkeypatch):
    """on("mps") / on("cuda"): setup_runtime picks that device; global flags it sets are restored."""
    import torch

    matmul = torch.get_float32_matmul_precision()
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    def pick(kind: str):
        monkeypatch.setattr(device, "pick_device", lambda name: torch.device(kind))

    yield pick
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def test_mps_has_no_tf32_and_compiles_with_aot_eager(on, monkeypatch):
    import torch

    from smollab.config import CompiledPerfConfig

    on("mps")
    torch.set_float32_matmul_precision("high")
    rt = setup_runtime(CompiledPerfConfig(tf32=True, compile=True, compile_mode="max-autotune"))
    assert torch.get_float32_matmul_precision() == "highest"
    assert "tf32 (CUDA only; mps has no TF32: fp32 stays fp32)" in rt.skipped
    assert rt.compile and rt.compile_backend == "aot_eager"
    assert "compile aot_eager (inductor does not target MPS well)" in rt.chosen
    assert any(s.startswith("compile_mode max-autotune") for s in rt.skipped)
    assert rt.optimizer_impl == "foreach"
    calls = []
    monkeypatch.setattr(torch, "compile", lambda m, **kw: calls.append(kw) or m)
    device.maybe_compile(torch.nn.Linear(2, 2), rt)
    assert calls == [{"backend": "aot_eager"}]


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
    assert torch.backends.cuda.matmul.allow_tf32 is False and "tf32 off" in rt.chosen
    native["bf16"] = True
    rt = setup_runtime(PerfConfig(precision="bf16", tf32=True))
    assert rt.autocast_dtype is torch.bfloat16 and rt.scaler is None
    assert "bf16 autocast (native on this GPU" in rt.describe()
    assert torch.backends.cuda.matmul.allow_tf32 is True
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
    driver = iter([3 * 2**20, 2**20])
    monkeypatch.setattr(torch.mps, "driver_allocated_memory", lambda: next(driver))
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
