"""The probe's lane counts (`lanes: [...]`): the rules and the recommendation with fake measures,
`lanes: auto` of a sweep reading the cache, and one level through the FAKE lanes worker
(tests/lab/fake_lanes_worker.py), whose step times are exact."""

from __future__ import annotations

import sys

import pytest
import yaml

from smollab.errors import UserError
from smollab.lab import zygote
from smollab.lab.probe.cache import cache_lookup, device_info, lanes_signature
from smollab.lab.probe.lanes import LaneLevel
from smollab.lab.probe.levels import RunMeasure
from smollab.lab.probe.run import Probe
from smollab.lab.probe.spec import ProbeSpec, load_probe
from smollab.lab.sweep.lanes_executor import resolve_lanes
from smollab.lab.sweep.spec_load import load_spec


@pytest.fixture
def workload(micro_data, micro_model, tmp_path, monkeypatch):
    monkeypatch.setenv("SMOLLAB_CACHE_DIR", str(tmp_path / "cache"))
    return [
        f"model.path={micro_model}",  # the probe finds it before any (fake) worker starts
        "model.lora.enabled=true",
        f"data.dir={micro_data}",
        "data.num_stories=400",
        "data.vocab_size=256",
        "train.batch_size=8",
        "grpo.num_generations=4",
        "perf.device=cpu",
    ]


def processes(step_s):
    """k processes, each step_s(k) per step."""
    return lambda k, t: ([RunMeasure(step_s(k), 20, 100.0) for _ in range(k)], k / step_s(k))


def lanes(step_s, fail_at=None, calls=None):
    """w processes of n lanes, step_s(n) per iteration (step_s(n, w) if it takes two arguments);
    `fail_at` n fails (out of memory)."""

    def measure(n, threads, workers=1):
        if calls is not None:
            calls.append((n, threads) if workers == 1 else (n, threads, workers))
        if fail_at is not None and n >= fail_at:
            return LaneLevel(lanes=n, threads=threads, workers=workers, error="out of memory")
        s = step_s(n, workers) if step_s.__code__.co_argcount == 2 else step_s(n)
        if s is None:
            return LaneLevel(lanes=n, threads=threads, workers=workers, error="out of memory")
        return LaneLevel(
            lanes=n, threads=threads, workers=workers, step_s=s, steps=10, peak_mem_mb=50.0 * n
        )

    return measure


def probe(workload, tmp_path, measure, lanes_measure, **spec):
    spec.setdefault("split", False)
    s = ProbeSpec(command="grpo", dir=str(tmp_path / "probe"), threads=2, max_k=4, **spec)
    said: list[str] = []
    result = Probe(s, workload, out=said.append, measure=measure, lanes_measure=lanes_measure).run(
        tmp_path / "probe"
    )
    return result, said


def test_lanes_beside_processes_recommended_and_cached_for_lanes_auto(workload, tmp_path):
    """Processes gain nothing (k runs, k times slower); lanes cost 10% per lane per iteration:
    8 lanes win, by 8 / 1.7 over the best process packing; a lanes sweep's `lanes: auto` reads it."""
    calls: list = []
    result, said = probe(
        workload,
        tmp_path,
        processes(lambda k: 0.1 * k),
        lanes(lambda n: 0.1 * (1 + 0.1 * (n - 1)), calls=calls),
        lanes=[1, 2, 4, 8],
    )
    assert calls == [(1, 2), (2, 2), (4, 2), (8, 2)]  # every lane count on all the threads
    assert result["best_throughput"]["k"] == 1  # the process half, as before
    best = result["best_lanes"]
    assert best["lanes"] == 8 and best["steps_per_s"] == pytest.approx(8 / 0.17)
    assert best["units_per_s"] == pytest.approx(8 * 8 / 0.17)  # lanes x batch_size / step_s
    assert best["vs_best_processes"] == pytest.approx(8 / 0.17 / 10)
    assert result["recommended"]["executor"] == "lanes" and result["recommended"]["lanes"] == 8
    assert result["lanes_stop_reason"] == "tried every lane count in [1, 2, 4, 8]"
    assert any(ln.startswith("recommended: 8 lanes in one process") and "k=1" in ln for ln in said)
    assert any(ln.split()[:2] == ["1", "8"] and "best lanes" in ln for ln in said)
    assert any("cached for `lanes: auto`" in ln for ln in said)
    device = device_info("cpu", 2)
    assert cache_lookup(device, lanes_signature(result["workload"]))["best_lanes"]["lanes"] == 8
    sweep = tmp_path / "sweep.yaml"
    overrides = dict(item.split("=", 1) for item in workload)
    sweep.write_text(
        yaml.safe_dump(
            {
                "command": "grpo",
                "executor": "lanes",
                "lanes": "auto",
                "threads": 2,
                "overrides": {k: yaml.safe_load(v) for k, v in overrides.items()},
                "space": {"optim.lr": [1e-3, 2e-3]},
                "metric": "reward_mean",
            }
        )
    )
    said.clear()
    assert resolve_lanes(load_spec(sweep), "cpu", said.append) == 8
    assert said[0].startswith("lanes auto: 8 lanes in one worker (the best of the probe of")


def test_processes_recommended_when_lanes_do_not_pay(workload, tmp_path):
    result, said = probe(
        workload,
        tmp_path,
        processes(lambda k: 0.1 * (1 + 0.2 * (k - 1))),
        lanes(lambda n: 0.1 * n),
        lanes=[1, 2],
    )
    assert result["recommended"] == {
        "executor": "local",
        "concurrency": 4,
        "steps_per_s": pytest.approx(4 / 0.16),
        "units_per_s": pytest.approx(8 * 4 / 0.16),
        "sweep": "concurrency: 4",
    }
    assert any(ln.startswith("recommended: 4 processes") for ln in said)


def test_lanes_stop_at_a_failure_or_a_drop(workload, tmp_path):
    calls: list = []
    result, _ = probe(
        workload,
        tmp_path,
        processes(lambda k: 0.1 * k),
        lanes(lambda n: 0.1, fail_at=4, calls=calls),
        lanes=[1, 2, 4, 8],
    )
    assert [n for n, _ in calls] == [1, 2, 4]
    assert result["lanes_stop_reason"] == "lanes=4 failed: out of memory"
    assert result["best_lanes"]["lanes"] == 2
    result, _ = probe(
        workload,
        tmp_path,
        processes(lambda k: 0.1 * k),
        lanes(lambda n: 0.1 if n < 4 else 0.1 * n),
        lanes=[1, 2, 4, 8],
    )
    assert result["lanes_stop_reason"].startswith("aggregate throughput at lanes=4 is 50% below")
    assert len(result["lanes"]) == 3


def test_workers_x_lanes_measured_recommended_and_cached(workload, tmp_path):
    """lane_workers: [1, 2] on 2 threads: each lane count as one process on 2 threads and as 2
    processes on 1 thread each, whose iteration is 20% slower: 2 x 8 lanes win (aggregate summed
    over the processes); `lanes: auto` takes that pair, and each key fixed picks within it."""
    calls: list = []

    def step_s(n, w):
        return 0.1 * (1 + 0.1 * (n - 1)) * (1.2 if w == 2 else 1.0)

    result, said = probe(
        workload,
        tmp_path,
        processes(lambda k: 0.1 * k),
        lanes(step_s, calls=calls),
        lanes=[1, 2, 4, 8],
        lane_workers=[1, 2],
    )
    assert calls == [(1, 2), (2, 2), (4, 2), (8, 2), (1, 1, 2), (2, 1, 2), (4, 1, 2), (8, 1, 2)]
    best = result["best_lanes"]
    assert (best["workers"], best["lanes"], best["threads"]) == (2, 8, 1)
    assert best["steps_per_s"] == pytest.approx(2 * 8 / (0.17 * 1.2))
    assert best["vs_best_processes"] == pytest.approx(2 * 8 / (0.17 * 1.2) / 10)
    rec = result["recommended"]
    assert rec["executor"] == "lanes" and (rec["lanes"], rec["lane_workers"]) == (8, 2)
    assert rec["sweep"] == "executor: lanes, lanes: 8, lane_workers: 2"
    assert any(
        ln.startswith("recommended: 2 workers x 8 lanes (2 processes, 1 thread(s) each)")
        and "the best process packing (k=1)" in ln
        for ln in said
    )
    assert any(ln.split()[:3] == ["2", "8", "1"] and "best lanes" in ln for ln in said)
    assert result["lanes_stop_reason"] == (
        "1 worker(s): tried every lane count in [1, 2, 4, 8]; "
        "2 worker(s): tried every lane count in [1, 2, 4, 8]"
    )
    overrides = dict(item.split("=", 1) for item in workload)
    for keys, total in (
        ({"lanes": "auto"}, 16),
        ({"lanes": "auto", "lane_workers": 1}, 8),
        ({"lanes": 4, "lane_workers": "auto"}, 8),
    ):
        sweep = tmp_path / "sweep.yaml"
        sweep.write_text(
            yaml.safe_dump(
                {
                    "command": "grpo",
                    "executor": "lanes",
                    "threads": 2,
                    **keys,
                    "overrides": {k: yaml.safe_load(v) for k, v in overrides.items()},
                    "space": {"optim.lr": [1e-3, 2e-3]},
                    "metric": "reward_mean",
                }
            )
        )
        spec, said = load_spec(sweep), []
        assert resolve_lanes(spec, "cpu", said.append) == total, keys
        assert spec.lanes * spec.lane_workers == total and isinstance(spec.lane_workers, int)
    assert said[0].startswith("lane_workers auto: 2 workers x 4 lanes (the best of the probe of")


def test_each_worker_count_climbs_and_stops_on_its_own(workload, tmp_path):
    """2 processes run out of memory at 4 lanes each; one process goes on to 8."""
    calls: list = []
    result, _ = probe(
        workload,
        tmp_path,
        processes(lambda k: 0.1 * k),
        lanes(lambda n, w: None if w == 2 and n >= 4 else 0.1, calls=calls),
        lanes=[1, 2, 4, 8],
        lane_workers=[1, 2],
    )
    assert calls == [(1, 2), (2, 2), (4, 2), (8, 2), (1, 1, 2), (2, 1, 2), (4, 1, 2)]
    assert result["lanes_stop_reason"].endswith(
        "2 worker(s): 2 workers x lanes=4 failed: out of memory"
    )
    assert (result["best_lanes"]["workers"], result["best_lanes"]["lanes"]) == (1, 8)


@pytest.mark.parametrize("start", ["cold", "warm"])
def test_a_lane_level_through_the_fake_worker(workload, tmp_path, monkeypatch, fake_lanes, start):
    """One `smollab lanes grpo ... --lane ... --lane ...` process per lane count; the iteration
    time is the lanes' steady-state step_s (the fake's is exact: 0.02 x (1 + 0.5 (n - 1))).
    Cold, a process's memory is what it logged (the fake's FAKE_MEM_MB); warm, forked from the
    server, the largest PSS its parent saw, since its logged peak RSS counts the server's pages."""
    if start == "warm" and not sys.platform.startswith("linux"):
        pytest.skip("warm starts: Linux")
    monkeypatch.setattr(zygote, "WARM_MODULES", ())  # the server, not its imports
    monkeypatch.setenv("FAKE_STEP_S", "0.02")
    monkeypatch.setenv("FAKE_LANE_COST", "0.5")
    monkeypatch.setenv("FAKE_MEM_MB", "123")
    result, said = probe(
        workload,
        tmp_path,
        processes(lambda k: 0.1 * k),
        None,
        lanes=[1, 2],
        lane_workers=[1, 2],
        warmup=2,
        steps=5,
        start=start,
    )
    one, two, _, two_x2 = result["lanes"]
    assert one["step_s"] == pytest.approx(0.02) and two["step_s"] == pytest.approx(0.03)
    assert two["steps_per_s"] == pytest.approx(2 / 0.03) and two["steps"] == 5
    assert two["error"] is None and result["start"] == start
    if start == "cold":
        assert two["peak_mem_mb"] == 123 and result["run_memory"] == "peak"
        assert any(m.startswith("run start: cold (start: cold)") for m in said)
    else:
        assert 0 < two["peak_mem_mb"] != 123 and result["run_memory"] == "pss"
        assert any(m.startswith("run start: warm (start: warm): runs fork") for m in said)
        assert any(m.startswith("MB/run: each run's largest PSS seen") for m in said)
    level = tmp_path / "probe" / "lanes2"
    assert (level / "l0" / "metrics.csv").exists() and (level / "l1" / "metrics.csv").exists()
    cmd = next(ln for ln in (level / "child.log").read_text().splitlines() if ln.startswith("$ "))
    assert f"--lane run.seed=1 run.dir={level / 'l1'}" in cmd and "--threads 2" in cmd
    # 2 processes of 2 lanes, 1 thread each, at once: each iterates in 0.03 s, the aggregate sums
    assert two_x2["workers"] == 2 and two_x2["threads"] == 1 and two_x2["steps"] == 5
    assert two_x2["worker_step_s"] == [pytest.approx(0.03)] * 2
    assert two_x2["steps_per_s"] == pytest.approx(2 * 2 / 0.03)
    level = tmp_path / "probe" / "lanes2x2"
    for j in (0, 1):
        cmd = next(
            ln
            for ln in (level / f"p{j}" / "child.log").read_text().splitlines()
            if ln.startswith("$ ")
        )
        assert f"--lane run.seed={2 * j + 1} run.dir={level / f'p{j}' / 'l1'}" in cmd
        assert "--threads 1" in cmd


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["lanes=[]"], "probe key lanes: give at least one lane count"),
        (["lanes=[2, 2]"], "probe key lanes: repeated lane count in [2, 2]"),
        (
            ["lanes=[1, 2]", "perf.grad_checkpointing=true"],
            "perf.grad_checkpointing=True is not supported in lanes",
        ),
        (["lane_workers=[1, 2]"], "probe key lane_workers: set it with lanes: [...]"),
        (
            ["lanes=[1, 2]", "lane_workers=[0, 2]"],
            "probe key lane_workers: every worker count must be",
        ),
    ],
)
def test_bad_lane_settings_fail_with_one_line(tmp_path, micro_data, overrides, message):
    recipe = tmp_path / "w.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "command": "grpo",
                "overrides": {
                    "model.path": str(tmp_path / "base"),
                    "model.lora.enabled": True,
                    "data.dir": str(micro_data),
                },
            }
        )
    )
    with pytest.raises(UserError) as e:
        load_probe(str(recipe), overrides)
    assert message in str(e.value)


def test_lanes_refused_for_pretraining(tmp_path, micro_data):
    with pytest.raises(
        UserError, match="probe key lanes: lanes train grpo runs only, not pretrain"
    ):
        load_probe("configs/pretrain/cs336-17m.yaml", ["lanes=[1, 2]"])
