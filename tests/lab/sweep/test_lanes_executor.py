"""`executor: lanes`: the spec's rules, and sweeps whose trials are lanes of a FAKE worker
(tests/lab/fake_lanes_worker.py, stdlib only), so the scheduling, stopping, giving up, worker
death and resume are tested without torch and without the real worker's timing."""

from __future__ import annotations

import csv
import json
import threading
import time
from pathlib import Path

import pytest
import yaml

from smollab.errors import UserError
from smollab.lab.children import pid_alive
from smollab.lab.sweep.scheduler import Sweep, run_sweep
from smollab.lab.sweep.spec_load import load_spec


@pytest.fixture
def spec_file(tmp_path, micro_data):
    """Writes a lanes sweep spec over the micro data (`fields` replace the defaults)."""
    return lambda tmp_path, **fields: _spec_file(tmp_path, micro_data, **fields)


def _spec_file(tmp_path: Path, micro_data: Path, **fields) -> Path:
    base = tmp_path / "base"  # a model directory as the sweep checks it; the fake worker never
    base.mkdir(exist_ok=True)  # loads it
    (base / "config.json").write_text("{}")
    tree = dict(
        command="grpo",
        executor="lanes",
        lanes=2,
        overrides={
            "model.path": str(tmp_path / "base"),
            "model.lora.enabled": True,
            "data.dir": str(micro_data),
            "data.num_stories": 400,
            "data.vocab_size": 256,
            "perf.device": "cpu",
            "train.max_steps": 6,
        },
        space={"optim.lr": [1e-3, 2e-3]},
        metric={"name": "loss", "goal": "min"},
        dir=str(tmp_path / "sweep"),
        poll_s=0.05,
    )
    for k, v in fields.items():
        if k == "overrides":  # None removes a key
            tree["overrides"].update(v)
            tree["overrides"] = {a: b for a, b in tree["overrides"].items() if b is not None}
        elif v is None:
            tree.pop(k, None)
        else:
            tree[k] = v
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return path


def results(sweep_dir: Path) -> dict[str, dict[str, str]]:
    with open(sweep_dir / "results.csv", newline="") as f:
        return {r["run_dir"]: r for r in csv.DictReader(f)}


def lane_sets(sweep_dir: Path, inbox: str = "lanes") -> list[list[str]]:
    """The fake worker's `lanes: ...` lines: the lanes it trained at once, in order."""
    text = (sweep_dir / inbox / "worker.log").read_text()
    return [ln.split()[1:] for ln in text.splitlines() if ln.startswith("lanes:")]


def workers_started(sweep_dir: Path, inbox: str = "lanes") -> int:
    text = (sweep_dir / inbox / "worker.log").read_text()
    return sum(1 for ln in text.splitlines() if ln.startswith("$ "))


# ---- the spec -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"command": "pretrain", "overrides": {"model.lora.enabled": None}},
            "sweep key executor: lanes trains grpo trials only, not pretrain",
        ),
        (
            {"overrides": {"perf.grad_checkpointing": True}},
            "sweep key executor: lanes: lane of this sweep: perf.grad_checkpointing=True is not supported",
        ),
        (
            {"space": {"train.batch_size": [8, 16]}},
            "sweep key space.train.batch_size: executor lanes: train.batch_size cannot differ between lanes",
        ),
        ({"space": {"grpo.num_generations": [4, 8]}}, "grpo.num_generations cannot differ"),
        ({"lanes": None}, "sweep key lanes: executor lanes needs lanes: N"),
        ({"lanes": 0}, "sweep key lanes: at least 1"),
        (
            {"executor": "local"},
            "sweep key lanes: set only with executor: lanes (the executor is local)",
        ),
        ({"concurrency": 4}, "sweep key concurrency: not with executor: lanes"),
        (
            {"overrides": {"perf.threads": 2}},
            "sweep key overrides.perf.threads: not with executor: lanes",
        ),
        ({"routing_baseline": True}, "sweep key routing_baseline: not with executor: lanes"),
        ({"lane_workers": 0}, "sweep key lane_workers: at least 1 (lanes worker processes"),
        ({"lane_workers": "two"}, "sweep key lane_workers: at least 1"),
        (
            {"executor": "local", "lanes": None, "lane_workers": 2},
            "sweep key lane_workers: set only with executor: lanes (the executor is local)",
        ),
    ],
)
def test_spec_refusals(tmp_path, spec_file, fields, message):
    if fields.get("command") == "pretrain":
        fields["metric"] = {"name": "val_loss", "goal": "min"}
    with pytest.raises(UserError) as e:
        load_spec(spec_file(tmp_path, **fields))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_spec_lanes_is_the_concurrency_and_lane_keys_may_differ(tmp_path, spec_file):
    spec = load_spec(
        spec_file(
            tmp_path,
            lanes=3,
            space={"optim.lr": [1e-3, 2e-3], "grpo.beta": [0.0, 0.04], "model.lora.r": [4, 8]},
        )
    )
    assert spec.concurrency == 3 and spec.lanes == 3
    assert any("lanes: 3; executor: lanes" in ln for ln in spec.describe())
    spec = load_spec(spec_file(tmp_path, lanes=3, lane_workers=2))
    assert spec.concurrency == 6
    assert any("lanes: 3; lane_workers: 2; executor: lanes" in ln for ln in spec.describe())
    assert load_spec(spec_file(tmp_path, lanes=3, lane_workers="auto")).concurrency == "auto"


def test_more_workers_than_threads_is_refused_in_one_line(tmp_path, spec_file, fake_lanes):
    with pytest.raises(UserError) as e:
        run_sweep(load_spec(spec_file(tmp_path, lane_workers=3, threads=2)), out=lambda m: None)
    assert str(e.value) == (
        "sweep key lane_workers: 3 workers need at least 3 CPU threads (one each), the sweep has 2"
    )


def test_lanes_auto_without_a_probe_is_refused_in_one_line(
    tmp_path, spec_file, fake_lanes, monkeypatch
):
    monkeypatch.setenv("SMOLLAB_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(UserError, match="sweep key lanes: auto needs a probe of lane counts"):
        run_sweep(load_spec(spec_file(tmp_path, lanes="auto")), out=lambda m: None)


# ---- sweeps with the fake worker ------------------------------------------------------------------


def test_lanes_sweep_refills_a_freed_lane_in_one_worker(
    tmp_path, spec_file, fake_lanes, monkeypatch
):
    """3 trials of different lengths on 2 lanes: one worker, never more than 2 lanes, the shorter
    trial's lane refilled while the longer goes on; every run dir as a process trial's; the
    worker gone at the end."""
    monkeypatch.setenv("FAKE_UNTIL_DONE", "2")  # the long lane ends once both short ones have
    spec = load_spec(
        spec_file(
            tmp_path, space={"train.max_steps": [3, 5, 1000]}, overrides={"train.max_steps": None}
        )
    )
    lines: list[str] = []
    counts = run_sweep(spec, out=lines.append)
    d = tmp_path / "sweep"
    assert counts == {"completed": 3}
    rows = results(d)
    assert len(rows) == 3 and all(r["status"] == "completed" for r in rows.values())
    for run_dir in rows:
        summary = json.loads((d / run_dir / "summary.json").read_text())
        assert summary["status"] == "completed"
        argv = summary["argv"]
        assert argv[0] == "grpo" and f"run.dir={d / run_dir}" in " ".join(argv)
        assert not any(a.startswith("perf.threads=") for a in argv)  # the worker's, not a lane's
    assert workers_started(d) == 1
    sets = lane_sets(d)
    assert max(len(s) for s in sets) == 2
    refilled = [
        b
        for a, b in zip(sets, sets[1:], strict=False)
        if len(b) == 2 and set(a) & set(b) and a != b
    ]
    assert refilled, sets
    assert any("2 lanes in one worker" in ln for ln in lines)
    assert not pid_alive(worker_pid(lines))


def test_two_workers_share_the_trials_and_the_threads(tmp_path, spec_file, fake_lanes):
    """lane_workers: 2 x lanes: 2 on 2 threads: two workers of 1 thread each, each with its own
    inbox, never more than 2 lanes each; 5 trials spread over both, every one completed."""
    spec = load_spec(
        spec_file(
            tmp_path, lane_workers=2, threads=2, space={"optim.lr": [1e-3, 2e-3, 3e-3, 4e-3, 5e-3]}
        )
    )
    lines: list[str] = []
    assert run_sweep(spec, out=lines.append) == {"completed": 5}
    d = tmp_path / "sweep"
    assert any("2 workers x 2 lanes on 2 CPU threads (1 each)" in ln for ln in lines)
    per_worker = []
    for w in ("lanes/w0", "lanes/w1"):
        log = (d / w / "worker.log").read_text()
        assert f"--inbox {d / w} --max-lanes 2 --threads 1" in log
        sets = lane_sets(d, w)
        assert max(len(s) for s in sets) <= 2
        per_worker.append({name for s in sets for name in s})
    assert per_worker[0] and per_worker[1] and not per_worker[0] & per_worker[1]
    assert len(per_worker[0] | per_worker[1]) == 5
    assert all(r["status"] == "completed" for r in results(d).values())
    for which in (0, 1):
        assert not pid_alive(worker_pid(lines, which))


def test_a_dying_worker_ends_only_its_own_lanes(tmp_path, spec_file, fake_lanes, monkeypatch):
    """Two workers of one lane: the first dies at step 3 (its trial fails); the second's trial
    runs on to its end, and the third trial starts a fresh first worker."""
    monkeypatch.setenv("FAKE_DIE_AT", "3")
    monkeypatch.setenv("FAKE_DIE_ONCE", str(tmp_path / "died"))
    monkeypatch.setenv("FAKE_DIE_IN", "w0")
    # w0 dies only once w1 has started, whatever the machine's load, so w1 holds the survivor.
    monkeypatch.setenv("FAKE_DIE_AFTER", str(tmp_path / "sweep" / "lanes" / "w1" / "worker.log"))
    spec = load_spec(
        spec_file(
            tmp_path,
            lanes=1,
            lane_workers=2,
            threads=2,
            overrides={"train.max_steps": 30},
            space={"optim.lr": [1e-3, 2e-3, 3e-3]},
        )
    )
    lines: list[str] = []
    assert run_sweep(spec, out=lines.append) == {"completed": 2, "failed": 1}
    d = tmp_path / "sweep"
    rows = results(d)
    failed = next(r for r in rows.values() if r["status"] == "failed")
    assert "exited with code 3" in failed["reason"] and "fake worker died" in failed["reason"]
    survivor = lane_sets(d, "lanes/w1")[0][0]
    assert rows[f"trials/{survivor}"]["status"] == "completed"
    assert int(rows[f"trials/{survivor}"]["steps"]) == 30
    assert workers_started(d, "lanes/w0") == 2 and workers_started(d, "lanes/w1") == 1


def worker_pid(lines: list[str], which: int = 0) -> int:
    started = [ln for ln in lines if "lanes: worker pid" in ln and "started" in ln][which]
    return int(started.split("worker pid ")[1].split()[0])


def test_pruned_lane_is_stopped_through_the_inbox(tmp_path, spec_file, fake_lanes):
    spec = load_spec(
        spec_file(
            tmp_path,
            space={"optim.lr": [1e-3, 0.5]},
            overrides={"train.max_steps": 40},
            pruner={"type": "threshold", "upper": 4.9, "n_warmup_steps": 2},
        )
    )
    run_sweep(spec, out=lambda m: None)
    d = tmp_path / "sweep"
    by_lr = {r["optim.lr"]: r for r in results(d).values()}
    assert by_lr["0.5"]["status"] == "completed"
    assert by_lr["0.001"]["status"] == "pruned"
    name = Path(by_lr["0.001"]["run_dir"]).name
    assert (d / "lanes" / f"{name}.stop").read_text().startswith("pruned:")
    assert (d / "lanes" / f"{name}.exit").read_text() == "130"  # ended as a SIGINT ends a child
    assert int(by_lr["0.001"]["steps"]) < 40
    summary = json.loads((d / by_lr["0.001"]["run_dir"] / "summary.json").read_text())
    assert summary["status"] == "pruned"


def test_a_lane_that_ignores_its_stop_is_given_up_and_the_abandoned_worker_killed(
    tmp_path, spec_file, fake_lanes, monkeypatch
):
    """trial_timeout_s, then stop_timeout_s: each lane is given up (-9, failed, timed out), and
    the worker, with no lane the sweep still follows, is SIGKILLed."""
    monkeypatch.setenv("FAKE_IGNORE_STOP", "1")
    spec = load_spec(
        spec_file(
            tmp_path, overrides={"train.max_steps": 10**6}, trial_timeout_s=0.5, stop_timeout_s=0.5
        )
    )
    lines: list[str] = []
    with pytest.raises(UserError, match="every trial fails so far"):
        run_sweep(spec, out=lines.append)
    rows = results(tmp_path / "sweep")
    assert [r["status"] for r in rows.values()] == ["failed", "failed"]
    assert all("timed out after 0.5 s" in r["reason"] for r in rows.values())
    assert any("was given up; SIGKILL" in ln for ln in lines)
    assert not pid_alive(worker_pid(lines))


def test_a_dead_worker_fails_its_lanes_and_a_fresh_one_takes_the_next(
    tmp_path, spec_file, fake_lanes, monkeypatch
):
    """The first worker dies at step 3 (its lane fails, with the worker's last words); the next
    trial starts a fresh worker on a cleared inbox and completes."""
    once = tmp_path / "died"
    monkeypatch.setenv("FAKE_DIE_AT", "3")
    monkeypatch.setenv("FAKE_DIE_ONCE", str(once))
    spec = load_spec(spec_file(tmp_path, lanes=1, space={"optim.lr": [1e-3, 2e-3, 3e-3]}))
    lines: list[str] = []
    counts = run_sweep(spec, out=lines.append)
    assert counts == {"completed": 2, "failed": 1}
    failed = next(r for r in results(tmp_path / "sweep").values() if r["status"] == "failed")
    assert "lanes worker" in failed["reason"] and "exited with code 3" in failed["reason"]
    assert "fake worker died at step 3" in failed["reason"]
    assert workers_started(tmp_path / "sweep") == 2
    assert any("a fresh worker takes the next trials" in ln for ln in lines)


def test_stopped_lanes_sweep_resumes_its_trials(tmp_path, spec_file, fake_lanes):
    """Ctrl-C (the stop flag) once the lanes have logged 7 steps: each lane is interrupted through
    the inbox (status interrupted, left running in the study); a rerun resumes them from their
    checkpoints in the same run dirs, under a fresh worker, and runs the third trial."""
    spec_path = spec_file(
        tmp_path, space={"optim.lr": [1e-3, 2e-3, 3e-3]}, overrides={"train.max_steps": 200}
    )
    sweep = Sweep(load_spec(spec_path), out=lambda m: None)
    d = tmp_path / "sweep"

    def ctrl_c() -> None:
        deadline = time.time() + 60
        while time.time() < deadline:
            logged = [len(p.read_text().splitlines()) - 1 for p in d.glob("trials/*/metrics.csv")]
            if len(logged) == 2 and min(logged) >= 7:
                sweep.stop.count = 1
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=ctrl_c)
    watcher.start()
    with pytest.raises(KeyboardInterrupt):
        sweep.run()
    watcher.join()
    rows = results(d)
    assert [r["status"] for r in rows.values()] == ["interrupted", "interrupted"]
    assert all(7 <= int(r["steps"]) < 200 for r in rows.values())
    counts = run_sweep(load_spec(spec_path), out=lambda m: None)
    assert counts == {"completed": 3}
    for r in rows.values():
        run_dir = d / r["run_dir"]
        with open(run_dir / "metrics.csv", newline="") as f:
            steps = [int(row["step"]) for row in csv.DictReader(f)]
        assert steps == list(range(1, 201))  # resumed from its checkpoint, later rows cut back
        text = (run_dir / "child.log").read_text()
        assert sum(1 for ln in text.splitlines() if ln.startswith("$ ")) == 2
    assert workers_started(d) == 2


# ---- the real worker ------------------------------------------------------------------------------


def micro_lanes_overrides(micro_model: Path, micro_data: Path) -> dict:
    """Micro GRPO LoRA lanes: 8 completions (2 prompts x 4) of 12 tokens per step, no evals."""
    return {
        "model.path": str(micro_model),
        "model.lora.enabled": True,
        "data.dir": str(micro_data),
        "data.num_stories": 400,
        "data.vocab_size": 256,
        "perf.device": "cpu",
        "train.batch_size": 8,
        "grpo.num_generations": 4,
        "grpo.max_completion_length": 12,
        "train.eval_interval": 0,
        "run.plots": False,
    }


def test_micro_lanes_sweep_with_the_real_worker(tmp_path, micro_model, micro_data):
    """2 GRPO LoRA trials of the micro model as 2 lanes of one `smollab lanes grpo` worker: each
    run dir as `smollab grpo` writes it, results.csv complete, one worker, gone at the end."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "command": "grpo",
                "executor": "lanes",
                "lanes": 2,
                "threads": 1,
                "overrides": {
                    **micro_lanes_overrides(micro_model, micro_data),
                    "train.max_steps": 3,
                    "train.save_interval": 2,
                },
                "space": {"optim.lr": [1e-3, 3e-3]},
                "metric": {"name": "reward_mean", "goal": "max"},
                "dir": str(tmp_path / "sweep"),
                "poll_s": 0.2,
            }
        )
    )
    lines: list[str] = []
    assert run_sweep(load_spec(spec), out=lines.append) == {"completed": 2}
    d = tmp_path / "sweep"
    rows = results(d)
    assert [r["status"] for r in rows.values()] == ["completed", "completed"]
    for run_dir, row in rows.items():
        run = d / run_dir
        config = json.loads((run / "config.json").read_text())
        assert config["optim"]["lr"] == float(row["optim.lr"]) and config["perf"]["threads"] == 1
        assert json.loads((run / "summary.json").read_text())["status"] == "completed"
        with open(run / "metrics.csv", newline="") as f:
            metrics = list(csv.DictReader(f))
        assert [int(m["step"]) for m in metrics] == [1, 2, 3] and all(m["step_s"] for m in metrics)
        assert (run / "checkpoints").is_dir()
    assert workers_started(d) == 1
    assert not pid_alive(worker_pid(lines))


def test_micro_sweep_with_two_real_workers(tmp_path, micro_model, micro_data):
    """lane_workers: 2 x lanes: 1 on 2 threads: two real `smollab lanes grpo` workers at once,
    one thread each, each trial's run dir complete; both workers gone at the end."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "command": "grpo",
                "executor": "lanes",
                "lanes": 1,
                "lane_workers": 2,
                "threads": 2,
                "overrides": {
                    **micro_lanes_overrides(micro_model, micro_data),
                    "train.max_steps": 2,
                },
                "space": {"optim.lr": [1e-3, 3e-3]},
                "metric": {"name": "reward_mean", "goal": "max"},
                "dir": str(tmp_path / "sweep"),
                "poll_s": 0.2,
            }
        )
    )
    lines: list[str] = []
    assert run_sweep(load_spec(spec), out=lines.append) == {"completed": 2}
    d = tmp_path / "sweep"
    for run_dir in results(d):
        config = json.loads((d / run_dir / "config.json").read_text())
        assert config["perf"]["threads"] == 1
        assert json.loads((d / run_dir / "summary.json").read_text())["status"] == "completed"
    assert workers_started(d, "lanes/w0") == 1 and workers_started(d, "lanes/w1") == 1
    assert not pid_alive(worker_pid(lines, 0)) and not pid_alive(worker_pid(lines, 1))
