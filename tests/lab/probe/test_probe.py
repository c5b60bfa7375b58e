"""The probe with fake workloads: stopping rules, both optima, bisection, MPS, the cache and
`concurrency: auto`; and once through real (fake-child) processes."""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml

from smollab.errors import UserError
from smollab.lab.children import MetricsTail
from smollab.lab.probe.cache import cache_lookup
from smollab.lab.probe.levels import RunMeasure
from smollab.lab.probe.measure import step_times
from smollab.lab.probe.report import report_probe
from smollab.lab.probe.run import Probe, run_probe
from smollab.lab.probe.spec import ProbeSpec, load_probe
from smollab.lab.sweep.concurrency import auto_concurrency
from smollab.lab.sweep.spec_load import load_spec

CPU = {"kind": "cpu", "name": "test-cpu", "memory_mb": 100_000.0, "threads": 8}


def fake_measure(step_s, mem=100.0, fail_at=None, calls=None):
    """A level of k runs, each with step time step_s(k); `fail_at` k fails (out of memory)."""

    def measure(k, threads):
        if calls is not None:
            calls.append((k, threads))
        if fail_at is not None and k >= fail_at:
            return [RunMeasure(None, 0, None, "CUDA out of memory")] * k, None
        return [RunMeasure(step_s(k), 20, mem) for _ in range(k)], k / step_s(k)

    return measure


@pytest.fixture
def workload(micro_data, tmp_path, monkeypatch):
    monkeypatch.setenv("SMOLLAB_CACHE_DIR", str(tmp_path / "cache"))
    overrides = [
        "model.preset=micro",
        f"data.dir={micro_data}",
        "data.num_stories=400",
        "data.vocab_size=256",
        "train.batch_size=8",
        "train.seq_len=64",
        "perf.device=cpu",
    ]
    return overrides


def probe(workload, tmp_path, measure, device=CPU, **spec):
    spec.setdefault("split", False)
    s = ProbeSpec(command="pretrain", dir=str(tmp_path / "probe"), threads=8, **spec)
    said: list[str] = []
    result = Probe(s, workload, out=said.append, measure=measure, device=device).run(
        tmp_path / "probe"
    )
    return result, said


def test_stops_when_aggregate_throughput_falls(workload, tmp_path):
    calls = []
    result, said = probe(
        workload,
        tmp_path,
        fake_measure(lambda k: 0.1 if k <= 4 else 0.1 * k / 4 * 1.5, calls=calls),
    )
    assert [k for k, _ in calls] == [1, 2, 4, 8]
    assert [t for _, t in calls] == [8, 4, 2, 1]  # threads divided among the runs
    assert "aggregate throughput at k=8 is 33% below the best (k=4)" in result["stop_reason"]
    assert result["best_throughput"]["k"] == 4 and result["best_latency"]["k"] == 4
    assert result["best_throughput"]["threads_per_run"] == 2
    assert result["levels"][2]["units_per_s"] == pytest.approx(40 * 8 * 64)  # tokens/s
    saved = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert saved["best_throughput"]["rule"].startswith("the k with the highest aggregate")
    assert (tmp_path / "probe" / "probe.png").stat().st_size > 5000
    assert any("best throughput: k=4 (4 processes x 2 threads)" in s for s in said)
    assert any(
        line.strip().startswith("4") and "best latency, best throughput" in line for line in said
    )


def test_best_latency_and_best_throughput_differ(workload, tmp_path):
    result, _ = probe(
        workload, tmp_path, fake_measure(lambda k: 0.1 * (1 + 0.05 * (k - 1))), max_k=16
    )
    assert result["stop_reason"] == "reached max_k=16"
    assert result["best_latency"]["k"] == 2  # 0.105 s is within 10% of 0.1 s; 4 (0.115) is not
    assert result["best_throughput"]["k"] == 16
    assert result["best_throughput"]["speedup_vs_k1"] == pytest.approx(16 / 1.75)


def test_cpu_thread_splits(workload, tmp_path):
    """Two threads in one run can lose to one (contention); the probe tries k x 1 as well."""
    calls = []

    def step(k, threads):
        return {
            (1, 8): 0.3,
            (1, 1): 0.1,
            (2, 4): 0.2,
            (2, 1): 0.105,
            (4, 2): 0.2,
            (4, 1): 0.15,
        }.get((k, threads), 0.5 * k)

    def measure(k, threads):
        calls.append((k, threads))
        return [RunMeasure(step(k, threads), 20, 100.0) for _ in range(k)], None

    result, said = probe(workload, tmp_path, measure, split=True)
    assert calls == [(1, 8), (1, 1), (2, 4), (2, 1), (4, 2), (4, 1), (8, 1)]
    assert result["best_throughput"]["k"] == 4 and result["best_throughput"]["threads_per_run"] == 1
    assert result["best_latency"]["k"] == 2 and result["best_latency"]["threads_per_run"] == 1
    assert "fastest k=1 run (1 x 1 threads" in result["best_latency"]["rule"]
    assert any("best throughput: k=4 (4 processes x 1 threads)" in s for s in said)


def test_memory_and_failure_stop(workload, tmp_path):
    small = dict(CPU, memory_mb=1000.0)
    result, _ = probe(workload, tmp_path, fake_measure(lambda k: 0.1, mem=200.0), device=small)
    assert [lv["k"] for lv in result["levels"]] == [1, 2, 4]
    assert "k=8 would need about 1,600 MB" in result["stop_reason"]
    result, _ = probe(workload, tmp_path, fake_measure(lambda k: 0.1, fail_at=4))
    assert result["stop_reason"] == "k=4 failed: CUDA out of memory"
    assert result["best_throughput"]["k"] == 2


def test_bisection_between_the_last_two_k(workload, tmp_path):
    calls = []
    step = lambda k: 0.1 if k <= 6 else 0.1 * k / 4 * 1.5  # noqa: E731
    result, _ = probe(workload, tmp_path, fake_measure(step, calls=calls), bisect=True)
    assert [k for k, _ in calls] == [1, 2, 4, 8, 6, 7]
    assert result["best_throughput"]["k"] == 6
    assert "bisection tried k=6, 7" in result["stop_reason"]


class StubMPS:
    """What the probe asks of the MPS daemon, recorded."""

    def __init__(self):
        self.running, self.events = False, []
        self.pipe_dir = "/run/user/0/smollab-mps-0/pipe"

    def available(self):
        return True

    def is_running(self):
        return self.running

    def start(self):
        self.running = True
        self.events.append("start")
        return True

    def stop(self):
        self.running = False
        self.events.append("stop")

    def env(self):
        return {}


def test_cuda_mps_and_client_limit(workload, tmp_path):
    control = StubMPS()
    gpu = {"kind": "cuda", "name": "H100", "memory_mb": 80_000.0, "threads": 8}
    s = ProbeSpec(command="pretrain", dir=str(tmp_path / "probe"), threads=8, max_k=256)
    said: list[str] = []
    result = Probe(
        s, workload, out=said.append, measure=fake_measure(lambda k: 0.01), device=gpu, mps=control
    ).run(tmp_path / "probe")
    assert result["stop_reason"] == "k=64 exceeds the MPS client limit of 48"
    assert control.events == ["start", "stop"]  # started for the probe, stopped after
    assert any("started the control daemon" in s for s in said)


def _cuda_probe(workload, tmp_path, control, mps):
    gpu = {"kind": "cuda", "name": "H100", "memory_mb": 80_000.0, "threads": 8}
    s = ProbeSpec(command="pretrain", dir=str(tmp_path / "probe"), threads=8, max_k=2, mps=mps)
    said: list[str] = []
    result = Probe(
        s, workload, out=said.append, measure=fake_measure(lambda k: 0.1), device=gpu, mps=control
    ).run(tmp_path / "probe")
    return gpu, result, said


def test_a_daemon_running_although_mps_is_false_is_recorded_as_mps(workload, tmp_path):
    """The runs attach to a daemon that runs anyway: their levels are MPS levels, cached under
    the MPS key, never as time-sliced ones."""
    control = StubMPS()
    control.running, control.pipe_dir = True, "/tmp/nvidia-mps"  # CUDA's default
    gpu, result, said = _cuda_probe(workload, tmp_path, control, mps=False)
    assert result["mps_daemon"] == {"requested": False, "used": True}
    assert result["workload"]["mps_daemon"] is True
    assert control.events == []  # not ours: neither started nor stopped
    assert any("WARNING: a control daemon is running" in line for line in said), said
    time_sliced = {**result["workload"], "mps_daemon": False}
    assert cache_lookup(gpu, time_sliced) is None
    assert cache_lookup(gpu, result["workload"])["mps_daemon"]["used"] is True


def test_a_daemon_that_would_not_start_is_recorded_as_time_slicing(workload, tmp_path):
    class Refuses(StubMPS):
        def start(self):
            self.events.append("start")
            return False

    control = Refuses()
    gpu, result, said = _cuda_probe(workload, tmp_path, control, mps=True)
    assert result["mps_daemon"] == {"requested": True, "used": False}
    assert result["workload"]["mps_daemon"] is False  # what the levels measured
    assert all(lv["mps"] is None for lv in result["levels"])
    assert any("could not start the control daemon" in line for line in said)


def test_the_cache_and_concurrency_auto(workload, tmp_path, micro_data):
    result, said = probe(workload, tmp_path, fake_measure(lambda k: 0.1 if k <= 2 else 0.1 * k))
    assert any("cached for `concurrency: auto`" in s for s in said)
    assert cache_lookup(CPU, result["workload"])["best_throughput"]["k"] == 2

    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "command": "pretrain",
                "overrides": dict(o.split("=", 1) for o in workload),
                "space": {"optim.lr": [1e-3, 1e-2]},
                "metric": {"name": "val_loss"},
                "concurrency": "auto",
                "threads": 8,
                "dir": str(tmp_path / "sw"),
            }
        )
    )
    spec = load_spec(spec_file)
    said = []
    k = auto_concurrency(
        spec, tmp_path / "sw" / "probe", "cpu", out=said.append, probe_kw={"device": CPU}
    )
    assert k == 2 and "best throughput of the probe" in said[0]

    # another workload (batch 16): not cached, so a quick probe runs first and says so
    spec = load_spec(spec_file, ["overrides.train.batch_size=16"])
    said = []
    k = auto_concurrency(
        spec,
        tmp_path / "sw2",
        "cpu",
        out=said.append,
        probe_kw={"device": CPU, "measure": fake_measure(lambda k: 0.1 if k <= 4 else k)},
    )
    assert k == 4 and "running a quick probe first" in said[0]
    assert json.loads((tmp_path / "sw2" / "probe.json").read_text())["spec"]["steps"] == 10
    other = dict(result["workload"], batch_size=16)
    assert cache_lookup(CPU, other)["best_throughput"]["k"] == 4


def test_load_probe_routes_keys(tmp_path, micro_data):
    recipe = tmp_path / "p.yaml"
    recipe.write_text(
        f"command: pretrain\noverrides: {{model.preset: micro, data: {{dir: {micro_data}}}}}\n"
    )
    spec, work = load_probe(
        str(recipe), ["steps=7", "max_k=4", "train.batch_size=3", "overrides.train.seq_len=16"]
    )
    assert spec.steps == 7 and spec.max_k == 4 and spec.dir == "probes/p"
    assert (
        "train.batch_size=3" in work and "train.seq_len=16" in work and "model.preset=micro" in work
    )
    with pytest.raises(UserError, match="unknown probe key stepz"):
        load_probe(str(recipe), ["stepz=3"])
    with pytest.raises(UserError, match="unknown config key train.batch"):
        load_probe(str(recipe), ["train.batch=3"])
    cfg = tmp_path / "c.yaml"
    cfg.write_text("grpo: {beta: 0.0}\n")
    spec, _ = load_probe(str(cfg), [])
    assert spec.command == "grpo" and spec.base == str(cfg)


def test_step_times_from_metrics():
    rows = [
        {"step": 1.0, "train_s": 0.5},
        {"step": 2.0, "train_s": 0.6},
        {"step": 3.0, "train_s": 0.8},
        {"step": 5.0, "train_s": 1.2},
    ]
    assert step_times(rows, "pretrain") == [(2, pytest.approx(0.1)), (3, pytest.approx(0.2))]
    assert step_times([{"step": 1.0, "step_s": 0.3}], "grpo") == [(1, 0.3)]


def test_a_metrics_tail_reads_a_same_size_rewrite_after_invalidate(tmp_path):
    """The probe's final count: a rewrite that keeps inode, size and mtime looks unchanged to
    read(); invalidate() makes the next read take the file whole."""
    path = tmp_path / "metrics.csv"
    path.write_text("step,step_s\n1,0.5\n")
    stamp = path.stat().st_mtime_ns
    tail = MetricsTail(path)
    assert tail.read() == [{"step": 1.0, "step_s": 0.5}]
    with path.open("r+") as f:  # same inode, same size
        f.write("step,step_s\n2,0.7\n")
    os.utime(path, ns=(stamp, stamp))
    assert tail.read() == [{"step": 1.0, "step_s": 0.5}]
    tail.invalidate()
    assert tail.read() == [{"step": 2.0, "step_s": 0.7}]


def test_real_processes_with_controlled_step_times(
    fake_child, workload, micro_model, tmp_path, monkeypatch, capsys
):
    """k fake children share a slowdown: step = 20 ms x (1 + 0.5 (k - 1)); each sleeps 0.3 s
    before its first step, which the levels' start_s (launch to first logged step) counts."""
    monkeypatch.setenv("FAKE_START_S", "0.3")
    monkeypatch.setenv("FAKE_STEP_S", "0.02")
    monkeypatch.setenv("FAKE_SLOWDOWN", "0.5")
    spec = ProbeSpec(
        command="grpo", dir=str(tmp_path / "probe"), threads=4, max_k=4, warmup=2, steps=8
    )
    overrides = [
        o
        for o in workload
        if not o.startswith(("train.seq_len", "train.batch_size", "model.preset"))
    ]
    overrides += ["train.batch_size=8", "grpo.num_generations=4", f"model.path={micro_model}"]
    said: list[str] = []
    result = run_probe(spec, overrides, out=said.append, device=CPU)
    steps = {lv["k"]: lv["step_s"] for lv in result["levels"]}
    assert set(steps) == {1, 2, 4}
    for lv in result["levels"]:
        assert all(r["start_s"] >= 0.3 for r in lv["runs"]) and lv["start_s"] >= 0.3
        line = f"k={lv['k']}: step"
        said_k = [m for m in said if m.startswith(line)]
        assert any(f"first step {lv['start_s']:.2f} s after launch" in m for m in said_k)
        assert any(m.startswith(f"{lv['k']:>4} ") and f" {lv['start_s']:8.2f}  " in m for m in said)
    assert steps[1] == pytest.approx(0.02, rel=0.3)
    assert steps[2] == pytest.approx(0.03, rel=0.3)
    assert steps[4] == pytest.approx(0.05, rel=0.3)
    assert result["best_latency"]["k"] == 1 and result["best_throughput"]["k"] == 4
    assert result["unit"] == "completions/s"
    if sys.platform.startswith("linux"):  # forked from one server, their memory is their PSS
        assert result["start"] == "warm" and result["run_memory"] == "pss"
        assert (
            sum(m.startswith("run start: warm (start: auto on Linux): runs fork") for m in said)
            == 1
        )
        assert all(r["peak_mem_mb"] > 0 for lv in result["levels"] for r in lv["runs"])
        report_probe(tmp_path / "probe")  # `smollab report PROBE_DIR` says what MB/run is
        assert "MB/run: each run's largest PSS seen" in capsys.readouterr().out
    level = result["levels"][-1]
    assert all(r["steps"] >= 8 for r in level["runs"]) and level["observed_steps_per_s"] > 0
    assert not list((tmp_path / "probe").glob("k*/r*/.alive"))  # every child stopped


def test_cpu_stops_after_an_oversubscribed_level_that_does_not_win(workload, tmp_path):
    two_cores = dict(CPU, threads=2)
    # k=2 fills both cores; k=4 shares them (5% less aggregate, inside `drop`): stop there
    result, _ = probe(
        workload,
        tmp_path,
        fake_measure(lambda k: 0.1 * max(1, k / 2) * (1.1 if k > 2 else 1)),
        device=two_cores,
        max_k=32,
    )
    assert [lv["k"] for lv in result["levels"]] == [1, 2, 4]
    assert result["stop_reason"] == "k=4 runs oversubscribe the 2 CPU threads and did not beat k=2"
    assert result["best_throughput"]["k"] == 2


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["ks=[0, 2]"], "probe key ks: every k must be at least 1, got 0"),
        (["ks=[]"], "probe key ks: give at least one k, or leave ks out"),
        (["ks=[2, 2]"], "probe key ks: repeated k in [2, 2]"),
        (["ks=[2, 64]"], "probe key ks: 64 is above max_k (32)"),
        (["max_k=true"], "probe key max_k: expected a number, not true or false"),
        (["steps=false"], "probe key steps: expected a number, not true or false"),
        (["mps=3"], "probe key mps: Input should be a valid boolean"),
        (["overrides=[model.preset, micro]"], "probe key overrides: expected a mapping"),
        (["timeout_s=0"], "probe key timeout_s: Input should be greater than 0"),
        (["start=hot"], "probe key start: Input should be 'auto', 'warm' or 'cold'"),
    ],
)
def test_bad_probe_settings_fail_with_one_line(tmp_path, micro_data, capsys, overrides, message):
    from smollab.cli import main

    recipe = tmp_path / "p.yaml"
    recipe.write_text(
        f"command: pretrain\noverrides: {{data: {{dir: {micro_data}}}}}\n"
        f"dir: {tmp_path / 'probe'}\n"
    )
    with pytest.raises(UserError) as e:
        load_probe(str(recipe), overrides)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert main(["probe", str(recipe), *overrides]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "probe").exists()


def test_warm_is_refused_off_linux_in_one_line(tmp_path, micro_data, monkeypatch):
    recipe = tmp_path / "p.yaml"
    recipe.write_text(f"command: pretrain\noverrides: {{data: {{dir: {micro_data}}}}}\n")
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(UserError, match=r"^probe key start: warm needs Linux \(darwin"):
        load_probe(str(recipe), ["start=warm"])
    assert load_probe(str(recipe), ["start=auto"])[0].start == "auto"  # cold there, logged


def test_a_probe_recipe_whose_overrides_are_a_list(tmp_path):
    recipe = tmp_path / "p.yaml"
    recipe.write_text("command: pretrain\noverrides: [model.preset, micro]\n")
    with pytest.raises(UserError, match="probe key overrides: expected a mapping of config keys"):
        load_probe(str(recipe), [])
    (tmp_path / "p.yaml").write_text("command: pretrain\nks: [4, 1, 2]\n")
    assert load_probe(str(recipe), [])[0].ks == [1, 2, 4]


def test_the_mps_setting_is_part_of_the_cuda_cache_key(workload):
    from smollab.config.load import load_config
    from smollab.lab.probe.cache import cache_path, mps_daemon_setting, workload_signature

    cfg = load_config("pretrain", None, workload)
    gpu = {"kind": "cuda", "name": "H100", "memory_mb": 80_000.0, "threads": 8}
    assert mps_daemon_setting("cuda", "auto") is True and mps_daemon_setting("cuda", False) is False
    assert mps_daemon_setting("cpu", True) is None and mps_daemon_setting("mps", "auto") is None
    on, off = (workload_signature("pretrain", cfg, m) for m in (True, False))
    assert on["mps_daemon"] is True and off["mps_daemon"] is False
    assert cache_path(gpu, on) != cache_path(gpu, off)
    plain = workload_signature("pretrain", cfg, mps_daemon_setting("cpu", "auto"))
    assert "mps_daemon" not in plain  # CPU: the signature, so the cache key, is as before
    assert cache_path(CPU, plain) == cache_path(CPU, workload_signature("pretrain", cfg))


def test_sweep_concurrency_auto_probes_under_the_sweeps_own_mps_setting(workload, tmp_path):
    """Without MPS the k runs time-slice the GPU (k=1 is best); with it they overlap (k=4)."""
    gpu = {"kind": "cuda", "name": "H100", "memory_mb": 80_000.0, "threads": 8}
    spec_file = tmp_path / "sweep.yaml"

    def auto(mps: bool, measure=None):
        spec_file.write_text(
            yaml.safe_dump(
                {
                    "command": "pretrain",
                    "overrides": dict(o.split("=", 1) for o in workload),
                    "space": {"optim.lr": [1e-3, 1e-2]},
                    "metric": {"name": "val_loss"},
                    "concurrency": "auto",
                    "threads": 8,
                    "mps": mps,
                    "dir": str(tmp_path / "sw"),
                }
            )
        )
        control, said = StubMPS(), []
        kw = {"device": gpu, "mps": control, "measure": measure}
        k = auto_concurrency(
            load_spec(spec_file), tmp_path / f"probe-{mps}", "cuda", out=said.append, probe_kw=kw
        )
        return k, control.events, said

    time_sliced = fake_measure(lambda k: 0.1 * k * 1.05)
    shared = fake_measure(lambda k: 0.1 if k <= 4 else 0.1 * k)
    k, events, said = auto(True, shared)
    assert (k, events) == (4, ["start", "stop"])  # the sweep runs under MPS: so does its probe
    saved = json.loads((tmp_path / "probe-True" / "probe.json").read_text())
    assert saved["workload"]["mps_daemon"] is True
    assert saved["mps_daemon"] == {"requested": True, "used": True}
    assert any(s == "MPS daemon: on (as a sweep with mps: true runs)" for s in said)

    k, events, said = auto(False, time_sliced)  # the default: no MPS daemon, none in the probe
    assert (k, events) == (1, [])
    assert "MPS daemon off yet" in said[0] and "with the MPS daemon on is cached" in said[1]
    saved = json.loads((tmp_path / "probe-False" / "probe.json").read_text())
    assert saved["mps_daemon"] == {"requested": False, "used": False}

    assert auto(False)[:2] == (1, [])  # both cached now, each under its own key
    k, events, said = auto(True)
    assert (k, events) == (4, []) and "MPS daemon on;" in said[0]
