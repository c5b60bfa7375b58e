"""Sweeps end to end: real micro children for the grid and pruning; the fake child (conftest)
for the scheduling rules, resume after SIGKILL and Ctrl-C, which need many quick trials."""

from __future__ import annotations

import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from smollab.errors import UserError
from smollab.lab.children import first_row_s, pid_alive, split_threads
from smollab.lab.sweep.scheduler import run_sweep
from smollab.lab.sweep.spec_load import load_spec
from smollab.lab.sweep.study import open_study


def write_spec(path: Path, **fields) -> Path:
    path.write_text(yaml.safe_dump(fields, sort_keys=False))
    return path


def results(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def launches(run_dir: Path) -> int:
    return sum(1 for ln in (run_dir / "child.log").read_text().splitlines() if ln.startswith("$ "))


def micro_overrides(micro_pretrain: list[str]) -> dict:
    out = {}
    for item in micro_pretrain:
        k, v = item.split("=", 1)
        if k not in ("run.dir", "optim.lr"):
            out[k] = yaml.safe_load(v)
    return out


def fake_spec(tmp_path, micro_data, **fields):
    base = dict(
        command="pretrain",
        overrides={
            "data.dir": str(micro_data),
            "data.num_stories": 400,
            "data.vocab_size": 256,
            "perf.device": "cpu",
            "train.max_steps": 10,
            "optim.warmup_steps": 0,
        },
        space={"optim.lr": [0.1]},
        metric={"name": "val_loss", "goal": "min"},
        concurrency=2,
        dir=str(tmp_path / "sweep"),
        poll_s=0.05,
    )
    for k, v in fields.items():
        if k == "overrides":
            base["overrides"].update(v)
        else:
            base[k] = v
    return write_spec(tmp_path / "spec.yaml", **base)


def test_split_threads():
    assert split_threads(5, 2) == [3, 2]
    assert split_threads(2, 4) == [1, 1, 1, 1]
    assert split_threads(16, 4) == [4, 4, 4, 4]


def test_a_new_trials_thread_share():
    """The spec's own perf.threads wins; an executor's slot gives what it reserves; locally the
    threads the running trials leave are divided among the trials about to start."""
    from types import SimpleNamespace

    from smollab.lab.sweep.resources import trial_threads

    def never() -> int:
        raise AssertionError("trials left asked for without a local split")

    spec = SimpleNamespace(overrides={}, space={"optim.lr": [0.1]})
    running = [SimpleNamespace(threads=2)]
    assert trial_threads(spec, None, 8, 4, running, lambda: 5) == 2  # 6 free over 3 starting
    assert trial_threads(spec, None, 8, 4, running, lambda: 1) == 3  # it and the one left
    assert trial_threads(spec, None, 8, 4, running, lambda: 0) == 6  # the last takes them all
    assert trial_threads(spec, None, 1, 4, running, lambda: 5) == 1  # oversubscribed: still 1
    assert trial_threads(spec, SimpleNamespace(trial_threads=3), 8, 4, running, never) == 3
    for user in ({"overrides": {"perf.threads": 2}}, {"space": {"perf.threads": [1, 2]}}):
        own = SimpleNamespace(**{**vars(spec), **user})
        assert trial_threads(own, None, 8, 4, [], never) is None


# ---- real micro children ----------------------------------------------------------------------


def test_micro_grid_sweep_end_to_end(micro_pretrain, tmp_path):
    """Concurrency 2, a huge LR that diverges: results.csv complete, report with the LR analysis."""
    spec = write_spec(
        tmp_path / "lr.yaml",
        command="pretrain",
        overrides=micro_overrides(micro_pretrain),
        space={"optim.lr": [1e-2, 1e3]},
        seeds=[0, 1],
        metric={"name": "val_loss", "goal": "min"},
        concurrency=2,
        dir=str(tmp_path / "sweep"),
    )
    d = tmp_path / "sweep"
    counts = run_sweep(load_spec(spec))
    assert counts == {"completed": 2, "diverged": 2}
    rows = results(d)
    assert len(rows) == 4 and len({r["run_dir"] for r in rows}) == 4
    for r in rows:
        assert r["status"] == ("diverged" if float(r["optim.lr"]) == 1e3 else "completed")
        if r["status"] == "completed":
            assert float(r["val_loss"]) < 5.6 and r["steps"] == "20"
        else:
            assert "loss is nan" in r["reason"] or "start loss" in r["reason"]
            assert int(r["steps"]) < 20  # the run stopped itself early
        summary = json.loads((d / r["run_dir"] / "summary.json").read_text())
        assert summary["status"] == r["status"]
    study = open_study(load_spec(spec), d)
    states = {t.user_attrs["status"]: t.state.name for t in study.trials}
    assert states == {"completed": "COMPLETE", "diverged": "PRUNED"}
    report = (d / "report.md").read_text()
    assert "**Best LR: 0.01**" in report and "**First diverging LR: 1000**" in report
    assert "Ratio (first diverging LR / best LR): 1e+05" in report and "Cohen et al." in report
    assert "**diverged**: 2" in report
    for png in (
        "lr_sweep_comparison.png",
        "lr_vs_final_loss.png",
        "curves.png",
        "metric_vs_optim_lr.png",
    ):
        assert (d / png).stat().st_size > 10_000


def test_threshold_pruner_stops_a_trial(micro_pretrain, tmp_path):
    over = micro_overrides(micro_pretrain) | {"train.max_steps": 100_000, "optim.min_lr": 0}
    spec = write_spec(
        tmp_path / "p.yaml",
        command="pretrain",
        overrides=over,
        space={"optim.lr": [1e-7]},
        metric={"name": "val_loss"},
        pruner={"type": "threshold", "metric": "train_loss", "upper": 5.0, "n_warmup_steps": 5},
        concurrency=1,
        dir=str(tmp_path / "sweep"),
    )
    assert run_sweep(load_spec(spec)) == {"pruned": 1}
    (row,) = results(tmp_path / "sweep")
    assert row["status"] == "pruned" and "above the upper bound 5" in row["reason"]
    assert int(row["steps"]) < 1000
    summary = json.loads((tmp_path / "sweep" / row["run_dir"] / "summary.json").read_text())
    assert summary["status"] == "pruned" and "threshold pruner" in summary["evidence"]
    study = open_study(load_spec(spec), tmp_path / "sweep")
    assert study.trials[0].state.name == "PRUNED"


# ---- fake children: the scheduling rules --------------------------------------------------------


def test_status_mapping_threads_and_rerun(fake_child, micro_data, tmp_path):
    """completed -> COMPLETE, diverged -> PRUNED, crash -> FAIL; a rerun keeps finished trials
    and retries the failed one in its own run dir."""
    # The first poll comes after both quick endings (crash, divergence), so the last trial is
    # launched alone whatever order they end in; a 50 ms poll made the thread count a race.
    spec_path = fake_spec(
        tmp_path, micro_data, space={"optim.lr": [0.1, 20.0, 200.0]}, threads=4, poll_s=0.5
    )
    spec = load_spec(spec_path)
    counts = run_sweep(spec)
    assert counts == {"completed": 1, "diverged": 1, "failed": 1}
    d = tmp_path / "sweep"
    by_lr = {float(r["optim.lr"]): r for r in results(d)}
    assert by_lr[200.0]["status"] == "failed" and "RuntimeError: boom" in by_lr[200.0]["reason"]
    assert by_lr[20.0]["status"] == "diverged" and by_lr[20.0]["steps"] == "3"
    assert by_lr[0.1]["status"] == "completed" and by_lr[0.1]["steps"] == "10"
    states = {t.params["optim.lr"]: t.state.name for t in open_study(spec, d).trials}
    assert states == {0.1: "COMPLETE", 20.0: "PRUNED", 200.0: "FAIL"}
    argv = json.loads((d / by_lr[20.0]["run_dir"] / "summary.json").read_text())["argv"]
    assert "perf.threads=2" in argv  # 4 threads over 2 slots
    argv = json.loads((d / by_lr[0.1]["run_dir"] / "summary.json").read_text())["argv"]
    assert "perf.threads=4" in argv  # the last trial alone gets every thread
    assert "run.resume=auto" in argv and "model.preset=micro" not in argv

    run_sweep(spec)  # rerun: only the failed trial runs again, in the same directory
    rows = results(d)
    assert len(rows) == 3 and len({r["run_dir"] for r in rows}) == 3
    for r in rows:
        assert launches(d / r["run_dir"]) == (2 if r["optim.lr"] == "200" else 1)


def test_every_trial_failing_stops_the_sweep(fake_child, micro_data, tmp_path):
    spec = load_spec(
        fake_spec(tmp_path, micro_data, space={"optim.lr": [200.0, 300.0, 400.0, 500.0]})
    )
    with pytest.raises(UserError, match="every trial fails so far.*RuntimeError: boom"):
        run_sweep(spec)
    # Two run at once. When the first fails alone, its slot takes a third trial before the second
    # fails; once two have failed in a row nothing more is launched, so the fourth never runs.
    assert len(results(tmp_path / "sweep")) in (2, 3)


def test_median_pruner_and_enqueued_points_first(fake_child, micro_data, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_STEP_S", "0.02")
    spec = load_spec(
        fake_spec(
            tmp_path,
            micro_data,
            sampler="random",
            n_trials=2,
            concurrency=1,
            overrides={"train.max_steps": 60},
            space={"optim.lr": {"low": 1e-4, "high": 1.0, "log": True}},
            enqueue=[{"optim.lr": 1.0}, {"optim.lr": 1e-4}],
            metric={"name": "train_loss"},
            pruner={"type": "median", "n_startup_trials": 1, "n_warmup_steps": 5},
        )
    )
    assert run_sweep(spec) == {"completed": 1, "pruned": 1}
    rows = results(tmp_path / "sweep")
    assert [float(r["optim.lr"]) for r in rows] == [1.0, 1e-4]  # the enqueued points, in order
    assert rows[1]["status"] == "pruned" and "median" in rows[1]["reason"]


def test_seeds_run_each_sampled_configuration(fake_child, micro_data, tmp_path):
    spec = load_spec(
        fake_spec(
            tmp_path,
            micro_data,
            sampler="tpe",
            n_trials=2,
            seeds=[0, 1, 2],
            space={"optim.lr": {"low": 1e-3, "high": 1.0, "log": True}},
        )
    )
    assert run_sweep(spec) == {"completed": 6}
    rows = results(tmp_path / "sweep")
    by_lr: dict[str, set] = {}
    for r in rows:
        by_lr.setdefault(r["optim.lr"], set()).add(r["seed"])
    assert sorted(map(sorted, by_lr.values())) == [["0", "1", "2"], ["0", "1", "2"]]


def test_a_different_spec_in_the_same_dir_is_refused(fake_child, micro_data, tmp_path):
    run_sweep(load_spec(fake_spec(tmp_path, micro_data)))
    with pytest.raises(UserError, match="holds a different sweep"):
        run_sweep(load_spec(tmp_path / "spec.yaml", ["space.optim.lr=[0.5]"]))


# ---- the parent killed or interrupted (a real parent process over fake children) --------------

PARENT = """
import sys
from smollab.lab import children
script = sys.argv[1]
children.smollab_argv = lambda c, b, o: [sys.executable, script, c, *([b] if b else []), *o]
from smollab.cli import main
sys.exit(main(["sweep", *sys.argv[2:]]))
"""


def start_parent(fake_child, spec_path, env_extra) -> subprocess.Popen:
    env = {**os.environ, **env_extra}
    return subprocess.Popen(
        [sys.executable, "-c", PARENT, str(fake_child), str(spec_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def wait_for(cond, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    raise AssertionError("timed out")


def child_pids(sweep_dir: Path) -> dict[Path, int]:
    return {p.parent: int(p.read_text().split()[0]) for p in sweep_dir.glob("trials/*/.child.pid")}


def test_resume_after_the_parent_is_killed(fake_child, micro_data, tmp_path):
    spec_path = fake_spec(
        tmp_path,
        micro_data,
        space={"optim.lr": [0.1, 0.2, 0.3, 0.4]},
        overrides={"train.max_steps": 40},
    )
    d = tmp_path / "sweep"
    parent = start_parent(fake_child, spec_path, {"FAKE_STEP_S": "0.04"})

    def one_done_and_one_running():
        if not (d / "results.csv").exists():
            return False
        statuses = [r["status"] for r in results(d)]
        return "completed" in statuses and "running" in statuses

    wait_for(one_done_and_one_running)
    pids = child_pids(d)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert pids
    for run_dir, pid in pids.items():  # PR_SET_PDEATHSIG: the children stop too
        wait_for(lambda pid=pid, run_dir=run_dir: not pid_alive(pid, str(run_dir)), timeout=20)
    finished = {r["run_dir"] for r in results(d) if r["status"] == "completed"}

    assert run_sweep(load_spec(spec_path)) == {"completed": 4}
    rows = results(d)
    assert len(rows) == 4 and len({r["run_dir"] for r in rows}) == 4
    for r in rows:
        if r["run_dir"] in finished:
            assert launches(d / r["run_dir"]) == 1  # never rerun
        with open(d / r["run_dir"] / "metrics.csv") as f:
            steps = [int(x["step"]) for x in csv.DictReader(f)]
        assert steps == list(range(1, 41))  # each row exactly once, resumed or not


def test_ctrl_c_stops_children_cleanly_and_leaves_no_orphans(fake_child, micro_data, tmp_path):
    spec_path = fake_spec(
        tmp_path,
        micro_data,
        space={"optim.lr": [0.1, 0.2, 0.3]},
        overrides={"train.max_steps": 100_000},
    )
    d = tmp_path / "sweep"
    parent = start_parent(fake_child, spec_path, {"FAKE_STEP_S": "0.02"})
    wait_for(
        lambda: (
            len(child_pids(d)) == 2
            and all(
                (p / "metrics.csv").exists() and (p / "metrics.csv").stat().st_size > 100
                for p in child_pids(d)
            )
        )
    )
    pids = child_pids(d)
    parent.send_signal(signal.SIGINT)
    out, _ = parent.communicate(timeout=60)
    assert parent.returncode == 130, out
    assert "stopping 2 running trial(s) cleanly" in out
    for run_dir, pid in pids.items():
        assert not pid_alive(pid, str(run_dir))
        assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
    rows = results(d)
    assert [r["status"] for r in rows] == ["interrupted", "interrupted"]
    study = open_study(load_spec(spec_path), d)
    assert [t.state.name for t in study.trials] == ["RUNNING", "RUNNING"]  # left for the rerun


def test_concurrency_auto_uses_the_cached_probe(fake_child, micro_data, tmp_path, monkeypatch):
    from smollab.lab.probe.cache import cache_store, device_info, workload_signature
    from smollab.lab.sweep.spec import resolve_config

    monkeypatch.setenv("SMOLLAB_CACHE_DIR", str(tmp_path / "cache"))
    spec = load_spec(
        fake_spec(
            tmp_path,
            micro_data,
            concurrency="auto",
            threads=6,
            space={"optim.lr": [0.1, 0.2, 0.3, 0.4]},
        )
    )
    cfg = resolve_config(spec, {"optim.lr": 0.1}, 0)
    cache_store(
        {
            "device": device_info("cpu", 6),
            "workload": workload_signature("pretrain", cfg),
            "best_throughput": {"k": 3},
            "created": "earlier",
        }
    )
    said: list[str] = []
    from smollab.lab.sweep.scheduler import Sweep

    Sweep(spec, out=said.append).run()
    assert any("concurrency auto: 3 (best throughput of the probe of earlier" in s for s in said)
    assert json.loads((tmp_path / "sweep" / "sweep.json").read_text())["concurrency"] == 3
    assert any("concurrency 3," in s for s in said)


def test_bad_input_found_after_the_dir_was_made_leaves_nothing_behind(
    fake_child, micro_data, tmp_path
):
    """What the sweep finds wrong only once it runs (no Ray cluster, a probe that cannot run, the
    data) removes the dir it made; a dir that was there before, with a sweep's results, stays."""
    from smollab.errors import UserError
    from smollab.lab.sweep import resources

    def refused(*args, **kwargs):
        raise UserError("sweep key ray.address: no Ray cluster at auto")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(resources, "start_executor", refused)
        spec = load_spec(fake_spec(tmp_path, micro_data, dir=str(tmp_path / "new" / "sweep")))
        with pytest.raises(UserError, match="no Ray cluster"):
            run_sweep(spec)
    assert not (tmp_path / "new").exists()

    assert run_sweep(load_spec(fake_spec(tmp_path, micro_data))) == {"completed": 1}
    kept = sorted(p.relative_to(tmp_path) for p in (tmp_path / "sweep").rglob("*"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(resources, "start_executor", refused)
        with pytest.raises(UserError, match="no Ray cluster"):
            run_sweep(load_spec(fake_spec(tmp_path, micro_data)))
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "sweep").rglob("*")) == kept


@pytest.mark.parametrize("spec_plots", [None, True])
def test_trials_draw_no_plots_unless_the_spec_asks(fake_child, micro_data, tmp_path, spec_plots):
    """Plots cost a micro trial about its run: off the trials' path by default (the sweep log says
    so), and a run.plots the spec sets is what its trials get."""
    extra = {} if spec_plots is None else {"overrides": {"run.plots": spec_plots}}
    said: list[str] = []
    run_sweep(load_spec(fake_spec(tmp_path, micro_data, **extra)), out=said.append)
    (row,) = results(tmp_path / "sweep")
    argv = json.loads((tmp_path / "sweep" / row["run_dir"] / "summary.json").read_text())["argv"]
    plots = [a for a in argv if a.startswith("run.plots=")]
    if spec_plots is None:
        assert plots == ["run.plots=false"]
        assert any("trial plots: off" in line for line in said)
    else:
        assert plots[-1] == "run.plots=true"  # the spec's comes after the sweep's default
        assert any("trial plots: run.plots=True (the spec's)" in line for line in said)


def test_first_row_s_counts_back_to_the_first_row():
    """Three rows seen at once: the file's mtime is the third's, their wall_s says the first came
    2 s before it."""
    rows = [
        {"step": 1.0, "wall_s": 1.0},
        {"step": 2.0, "wall_s": 2.5},
        {"step": 3.0, "wall_s": 3.0},
    ]
    assert first_row_s(rows, mtime=110.0, launched=100.0) == 8.0
    assert first_row_s([{"step": 1.0}], mtime=104.0, launched=100.0) == 4.0


def test_start_s_per_trial_in_results_and_its_median_in_the_report(
    fake_child, micro_data, tmp_path, monkeypatch
):
    """A trial that sleeps 1 s before its first step: its start_s is at least that, and at most
    its wall time; the report gives the median."""
    monkeypatch.setenv("FAKE_START_S", "1")
    run_sweep(load_spec(fake_spec(tmp_path, micro_data, space={"optim.lr": [0.1, 0.2]})))
    d = tmp_path / "sweep"
    rows = results(d)
    assert len(rows) == 2
    for r in rows:
        assert 1.0 <= float(r["start_s"]) <= float(r["wall_s"]) + 0.1  # wall_s is rounded to 0.1
    median = statistics.median(float(r["start_s"]) for r in rows)
    report = (d / "report.md").read_text()
    assert f"Launch to first logged step (start s): median {median:.2f} s over 2 trials" in report
