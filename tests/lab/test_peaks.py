"""A CPU pretraining sweep measures the CPU peaks its trials' MFU needs before it launches any
trial (the trials never measure: they compete with each other)."""

from __future__ import annotations

import pytest

from smollab.device import mfu
from smollab.lab import children
from smollab.lab.peaks import prepare_sweep_peaks, sweep_thread_counts
from smollab.lab.sweep.scheduler import run_sweep
from smollab.lab.sweep.spec_load import load_spec
from tests.lab.sweep.test_sweep import fake_spec


@pytest.fixture
def measured(tmp_path, monkeypatch):
    """Measurements recorded instead of made, into an empty cache."""
    monkeypatch.setenv("SMOLLAB_CACHE_DIR", str(tmp_path / "cache"))
    calls: list[tuple] = []

    def measure(dtype, threads=None, **kw):
        calls.append(("measure", dtype, threads))
        return 1e11

    monkeypatch.setattr(mfu, "measure_cpu_peak", measure)
    monkeypatch.setattr(mfu, "machine_load", lambda: 0.0)
    return calls


def test_the_sweep_measures_every_trial_share_before_the_first_launch(
    fake_child, micro_data, tmp_path, monkeypatch, measured
):
    real_launch = children.launch

    def launch(name, argv, run_dir, **kw):
        measured.append(("launch", name, kw.get("threads")))
        return real_launch(name, argv, run_dir, **kw)

    monkeypatch.setattr(children, "launch", launch)
    said: list[str] = []
    spec = fake_spec(tmp_path, micro_data, space={"optim.lr": [0.1, 0.2]}, threads=4)
    run_sweep(load_spec(spec), out=said.append)
    kinds = [e[0] for e in measured]
    # 4 threads over 2 trials at a time, or all 4 for a trial alone (the last one, often)
    assert measured[:2] == [("measure", "float32", 2), ("measure", "float32", 4)]
    assert kinds.count("measure") == 2 and kinds.count("launch") == 2
    assert all(mfu.cached_cpu_peak("float32", e[2]) for e in measured if e[0] == "launch")
    assert any("MFU: measuring the CPU matmul peak for 2 setting(s) before any" in s for s in said)


def test_the_shares_and_precisions_measured(micro_data, tmp_path, monkeypatch, measured):
    import smollab.device.runtime

    spec = load_spec(fake_spec(tmp_path, micro_data, space={"perf.threads": [1, 3]}))
    assert sweep_thread_counts(spec, 2, 8) == {1, 3}
    spec = load_spec(fake_spec(tmp_path, micro_data, threads=5))
    assert sweep_thread_counts(spec, 2, 5) == {5, 3, 2}
    assert sweep_thread_counts(spec, 4, 2) == {2, 1}  # oversubscribed: one thread each
    out: list[str] = []
    assert prepare_sweep_peaks(spec, "cuda", 2, 5, out.append) == []  # a GPU has its table
    monkeypatch.setattr(smollab.device.runtime, "cpu_has_native_matmul", lambda precision: False)
    bf16 = load_spec(fake_spec(tmp_path, micro_data, overrides={"perf.precision": "bf16"}))
    assert prepare_sweep_peaks(bf16, "cpu", 1, 2, out.append) == [("float32", 2)]  # runs fp32
    monkeypatch.setattr(smollab.device.runtime, "cpu_has_native_matmul", lambda precision: True)
    assert prepare_sweep_peaks(bf16, "cpu", 1, 2, out.append) == [("bfloat16", 2)]
    assert prepare_sweep_peaks(bf16, "cpu", 1, 2, out.append) == []  # cached now
