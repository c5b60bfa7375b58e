"""MFU peaks: the GPU table by name, precision and TF32; the CPU cache (keyed by model name, cores,
threads and dtype, keeping the highest measurement); and no measurement in a lab child."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from smollab.device import mfu
from smollab.rundir.runs import CHILD_LOG

H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize(
    "name, dtype, tf32, tflops",
    [
        (H100, "float32", False, 67.0),  # was 494/2: four times the real fp32 rate
        (H100, "float32", True, 494.5),
        (H100, "bfloat16", False, 989.5),
        (H100, "float16", True, 989.5),
        ("NVIDIA H100 PCIe", "float32", False, 51.0),
        ("NVIDIA H100 PCIe", "float32", True, 378.0),
        ("NVIDIA H100 PCIe", "bfloat16", False, 756.5),
        ("NVIDIA H200", "float32", False, 67.0),
        ("NVIDIA H200", "bfloat16", False, 989.5),
        ("NVIDIA A100-SXM4-80GB", "float32", True, 156.0),
        ("NVIDIA A100 80GB PCIe", "float32", False, 19.5),
        ("NVIDIA L40S", "bfloat16", False, 362.05),
        ("NVIDIA L40S", "float32", False, 91.6),
        ("NVIDIA L40", "float32", True, 90.5),  # not L40S, not L4
        ("NVIDIA L4", "float32", True, 60.0),
        ("NVIDIA L4", "float32", False, 30.3),
        ("NVIDIA A10", "bfloat16", False, 125.0),
        ("NVIDIA A10", "float32", True, 62.5),
        ("NVIDIA GeForce RTX 4090", "bfloat16", False, 165.2),
        ("NVIDIA GeForce RTX 4090", "float32", False, 82.6),
        ("NVIDIA GeForce RTX 3090", "float16", False, 71.0),
        ("NVIDIA GeForce RTX 3090", "float32", True, 35.6),
        ("Tesla V100-SXM2-16GB", "float16", False, 125.0),
        (
            "Tesla V100-SXM2-16GB",
            "float32",
            True,
            15.7,
        ),  # no TF32 on Volta: the flag changes nothing
        ("Tesla V100-PCIE-32GB", "float16", False, 112.0),
        ("Tesla T4", "float16", False, 65.0),
        ("Tesla T4", "float32", True, 8.1),
    ],
)
def test_gpu_peak_by_name_precision_and_tf32(name, dtype, tf32, tflops):
    assert mfu.gpu_peak_flops(name, dtype, tf32) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize(
    "name, dtype",
    [
        ("NVIDIA H200 NVL", "float32"),  # no confirmed figure: must not fall through to H200 SXM
        ("NVIDIA H100 NVL", "bfloat16"),
        ("NVIDIA A10G", "bfloat16"),  # not an A10
        ("NVIDIA GeForce RTX 4090 D", "bfloat16"),
        ("NVIDIA GeForce RTX 3090 Ti", "float32"),
        ("NVIDIA GeForce RTX 4090 Laptop GPU", "bfloat16"),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "bfloat16"),  # a slice of the GPU
        ("Tesla V100S-PCIE-32GB", "float16"),
        ("Tesla V100-SXM2-16GB", "bfloat16"),  # no bf16 tensor cores on Volta
        ("Tesla T4", "bfloat16"),
        ("NVIDIA B200", "bfloat16"),  # not in the table
    ],
)
def test_unknown_gpus_and_precisions_give_none(name, dtype):
    assert mfu.gpu_peak_flops(name, dtype, tf32=True) is None


@pytest.fixture
def tf32_restored():
    b = torch.backends
    saved = (b.cuda.matmul.fp32_precision, b.cudnn.fp32_precision, b.fp32_precision)
    yield
    b.cuda.matmul.fp32_precision, b.cudnn.fp32_precision, b.fp32_precision = saved


def test_peak_flops_takes_the_column_from_autocast_and_the_tf32_setting(monkeypatch, tf32_restored):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: H100)
    cuda = torch.device("cuda")
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    assert mfu.peak_flops(cuda, None) == pytest.approx(67e12)
    assert mfu.peak_flops(cuda, torch.bfloat16) == pytest.approx(989.5e12)
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    assert mfu.peak_flops(cuda, None) == pytest.approx(494.5e12)
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    torch.set_float32_matmul_precision("high")  # the legacy switch, as a user's script sets it
    assert mfu.peak_flops(cuda, None) == pytest.approx(494.5e12)
    torch.set_float32_matmul_precision("highest")
    assert mfu.peak_flops(torch.device("mps"), None) is None


def test_model_name_from_cpuinfo():
    x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6338\n"
    assert mfu.model_from_cpuinfo(x86) == "Intel(R) Xeon(R) Gold 6338"
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n"
    assert mfu.model_from_cpuinfo(arm) == "ARM implementer 0x41 part 0xd0c"
    assert mfu.model_from_cpuinfo("processor\t: 0\n") is None


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SMOLLAB_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(mfu.LAB_CHILD_ENV, raising=False)
    monkeypatch.setattr(mfu, "cpu_model_name", lambda: "Intel Xeon A")
    monkeypatch.setattr(mfu, "machine_load", lambda: 0.0)  # a quiet machine unless a test says
    return tmp_path / "cpu_peak.json"


def test_two_cpu_models_never_share_a_cached_peak(cache, monkeypatch):
    cache.write_text(json.dumps({"x86_64|2|torch.float32": 5e9}))  # the old key: any x86 CPU
    assert mfu.store_cpu_peak("float32", 4, 1e11) == 1e11
    monkeypatch.setattr(mfu, "cpu_model_name", lambda: "AMD EPYC B")
    assert mfu.cached_cpu_peak("float32", 4) is None
    mfu.store_cpu_peak("float32", 4, 3e11)
    assert mfu.cached_cpu_peak("float32", 4) == 3e11
    assert mfu.cached_cpu_peak("float32", 2) is None  # threads are part of the key
    assert mfu.cached_cpu_peak("bfloat16", 4) is None  # and the dtype
    monkeypatch.setattr(mfu, "cpu_model_name", lambda: "Intel Xeon A")
    assert mfu.cached_cpu_peak("float32", 4) == 1e11
    saved = json.loads(cache.read_text())
    assert len(saved) == 2 and all(" cores|4 threads|float32" in k for k in saved)  # old entry gone
    assert {v["cpu"] for v in saved.values()} == {"Intel Xeon A", "AMD EPYC B"}


def test_the_cache_keeps_the_highest_measurement(cache):
    assert mfu.store_cpu_peak("float32", 2, 1e11) == 1e11
    assert mfu.store_cpu_peak("float32", 2, 4e10) == 1e11  # measured under load: not kept
    assert mfu.cached_cpu_peak("float32", 2) == 1e11
    assert mfu.store_cpu_peak("float32", 2, 2e11) == 2e11


def test_a_peak_measured_on_a_busy_machine_is_measured_again_when_quiet(cache, monkeypatch):
    values = iter([4e10, 1e11, 9e10])
    monkeypatch.setattr(mfu, "measure_cpu_peak", lambda dtype, threads=None, **kw: next(values))
    cores = __import__("os").cpu_count()
    monkeypatch.setattr(mfu, "machine_load", lambda: cores + 2.0)  # two other busy processes
    said: list[str] = []
    assert mfu.ensure_cpu_peak("float32", 1, log=said.append) == 4e10
    assert "the machine looked busy" in said[-1] and mfu.cpu_peak_entry("float32", 1)["busy"]
    assert mfu.ensure_cpu_peak("float32", 1) == 4e10  # still busy: not measured again
    monkeypatch.setattr(mfu, "machine_load", lambda: 0.0)
    assert mfu.ensure_cpu_peak("float32", 1) == 1e11  # quiet now: measured again, higher kept
    assert not mfu.cpu_peak_entry("float32", 1)["busy"]
    assert mfu.ensure_cpu_peak("float32", 1) == 1e11  # a quiet value stands: no third measurement
    assert next(values) == 9e10


def test_a_lab_child_never_measures(cache, monkeypatch):
    calls = []

    def measure(dtype, threads=None, **kw):
        calls.append((dtype, threads))
        return 1e11

    monkeypatch.setattr(mfu, "measure_cpu_peak", measure)
    cpu, threads = torch.device("cpu"), torch.get_num_threads()
    monkeypatch.setenv(mfu.LAB_CHILD_ENV, "1")
    assert mfu.peak_flops(cpu, None) is None and calls == []  # no cache: no MFU, no measurement
    monkeypatch.delenv(mfu.LAB_CHILD_ENV)
    assert mfu.peak_flops(cpu, None) == 1e11 and calls == [("float32", threads)]  # standalone
    monkeypatch.setenv(mfu.LAB_CHILD_ENV, "1")
    assert mfu.peak_flops(cpu, None) == 1e11 and len(calls) == 1  # a child reads the cache


def test_ensure_measures_once_and_refresh_keeps_the_max(cache, monkeypatch):
    values = iter([1e11, 5e10])
    monkeypatch.setattr(mfu, "measure_cpu_peak", lambda dtype, threads=None, **kw: next(values))
    said: list[str] = []
    assert mfu.ensure_cpu_peak("float32", 3, log=said.append) == 1e11
    assert mfu.ensure_cpu_peak("float32", 3, log=said.append) == 1e11 and len(said) == 1
    assert mfu.ensure_cpu_peak("float32", 3, refresh=True, log=said.append) == 1e11
    assert "cache keeps 100.0" in said[-1]


def test_measure_cpu_peak_restores_the_thread_count():
    before = torch.get_num_threads()
    flops = mfu.measure_cpu_peak("float32", threads=1, reps=3, budget_s=0.1, min_rep_s=0.0)
    assert flops > 0 and torch.get_num_threads() == before


def test_a_child_launched_by_the_lab_reports_no_peak_without_a_cache(tmp_path, monkeypatch):
    """End to end through `children.launch`: the child is marked and does not measure."""
    from smollab.lab import children as ch

    monkeypatch.setenv("SMOLLAB_CACHE_DIR", str(tmp_path / "cache"))
    code = (
        "import torch; from smollab.device.mfu import peak_flops; "
        "print('peak', peak_flops(torch.device('cpu'), None))"
    )
    child = ch.launch("peak", [sys.executable, "-c", code], tmp_path / "run", threads=1)
    assert child.wait(120) == 0
    assert "peak None" in (tmp_path / "run" / CHILD_LOG).read_text()
    assert not (tmp_path / "cache" / "cpu_peak.json").exists()
