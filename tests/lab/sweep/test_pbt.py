"""Population-based training (`sampler: pbt`): the lineage, continuation from a parent's
checkpoint, resume after the parent is killed, and the spec's refusals, under the process
executor and with lanes. Fake children and the fake lanes worker (conftest) for the scheduling;
one real micro pretraining population and one real micro GRPO population of lanes for the
checkpoint hand-over."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml

from smollab.errors import UserError
from smollab.lab.children import pid_alive
from smollab.lab.sweep.pbt import Population
from smollab.lab.sweep.scheduler import run_sweep
from smollab.lab.sweep.spec_load import load_spec
from smollab.lab.sweep.study import open_study
from tests.lab.conftest import FAKE_WORKER
from tests.lab.sweep.test_lanes_executor import _spec_file as lanes_spec_file
from tests.lab.sweep.test_lanes_executor import lane_sets, micro_lanes_overrides, workers_started
from tests.lab.sweep.test_sweep import (
    child_pids,
    fake_spec,
    launches,
    micro_overrides,
    results,
    start_parent,
    wait_for,
    write_spec,
)

PBT = {"population": 4, "interval": 10, "budget": 30, "perturb": {"optim.lr": [0.8, 1.25]}}


def pbt_spec(tmp_path, micro_data, **fields):
    fields = {
        "sampler": "pbt",
        "pbt": PBT,
        "space": {"optim.lr": [0.05, 0.1, 0.2, 0.4]},
        "concurrency": 4,
        **fields,
    }
    path = fake_spec(tmp_path, micro_data, **fields)
    tree = yaml.safe_load(path.read_text())
    del tree["overrides"]["train.max_steps"]  # pbt.budget
    return write_spec(path, **tree)


def steps_of(run_dir) -> list[int]:
    with open(run_dir / "metrics.csv") as f:
        return [int(r["step"]) for r in csv.DictReader(f)]


def check_lineage(d, rows):
    by_dir = {r["run_dir"].split("/")[-1]: r for r in rows}
    assert sorted((int(r["generation"]), int(r["member"])) for r in rows) == [
        (g, m) for g in range(3) for m in range(4)
    ]
    for r in rows:
        assert r["status"] == "completed"
        g, end = int(r["generation"]), 10 * (int(r["generation"]) + 1)
        assert int(r["steps"]) == end
        assert steps_of(d / r["run_dir"]) == list(range(1, end + 1))  # each step once
        if g == 0:
            assert r["parent"] == ""
            continue
        parent = by_dir[r["parent"]]
        assert int(parent["generation"]) == g - 1 and int(r["parent_step"]) == 10 * g
        if r["perturbed"]:  # exploited a top member: its lr times a factor
            factor = float(r["perturbed"].split("*")[-1])
            assert factor in (0.8, 1.25)
            assert float(r["optim.lr"]) == pytest.approx(float(parent["optim.lr"]) * factor)
        else:  # continued itself
            assert parent["member"] == r["member"] and parent["optim.lr"] == r["optim.lr"]


def test_pbt_exploits_the_top_member_and_records_the_lineage(fake_child, micro_data, tmp_path):
    spec_path = pbt_spec(tmp_path, micro_data)
    d = tmp_path / "sweep"
    assert run_sweep(load_spec(spec_path)) == {"completed": 12}
    rows = results(d)
    check_lineage(d, rows)
    gen1 = {int(r["member"]): r for r in rows if r["generation"] == "1"}
    # the lowest lr has the highest fake loss: bottom quantile (1 of 4), exploits the top (0.4)
    assert gen1[0]["parent"].startswith("g00-m03") and gen1[0]["perturbed"]
    assert all(not gen1[m]["perturbed"] for m in (1, 2, 3))
    study = open_study(load_spec(spec_path), d)
    t = next(t for t in study.trials if t.user_attrs["run_dir"] == gen1[0]["run_dir"][7:])
    assert t.user_attrs["parent_step"] == 10 and t.user_attrs["parent"].startswith("g00-m03")
    donor = next(t for t in study.trials if t.user_attrs["run_dir"].startswith("g00-m03"))
    assert t.user_attrs["parent_trial"] == donor.number
    assert t.user_attrs["perturbed"] == {"optim.lr": float(gen1[0]["perturbed"].split("*")[-1])}
    report = (d / "report.md").read_text()
    assert "## Population (PBT) lineage" in report


def test_a_bottom_member_exploits_only_a_top_member_that_did_better(micro_data, tmp_path):
    """A flat metric fills the top quantile with ties: a bottom member takes its values from a
    top member whose metric beats its own, never from one that ties it."""
    spec = load_spec(pbt_spec(tmp_path, micro_data, pbt={**PBT, "quantile": 0.5}))
    population = Population(spec, None, tmp_path, print, None)
    sign = 1 if spec.metric.goal == "min" else -1
    values = {0: sign * 1.0, 1: sign * 1.0, 2: sign * 1.0, 3: sign * 0.5}  # 3 best, 0-2 tie
    prev = {m: SimpleNamespace(params={"optim.lr": 0.1 * (m + 1)}) for m in range(4)}
    for g in range(1, 20):
        for m in (1, 2):  # the bottom half; 0 is top, tied with them
            donor, point, factors = population._decide(g, m, prev, values)
            assert donor == 3 and point["optim.lr"] == pytest.approx(0.4 * factors["optim.lr"])


def second_generation_running(d) -> bool:
    if not (d / "results.csv").exists():
        return False
    return any(r["generation"] == "1" and r["status"] == "running" for r in results(d))


def rerun_after_the_kill(spec_path, d) -> None:
    """Rerun a sweep whose parent was killed once some members completed: it ends with the whole
    lineage, each step once, no finished member rerun and no stray fork."""
    done = {r["run_dir"] for r in results(d) if r["status"] == "completed"}
    assert done
    assert run_sweep(load_spec(spec_path), out=lambda m: None) == {"completed": 12}
    rows = results(d)
    check_lineage(d, rows)
    for r in rows:
        if r["run_dir"] in done:
            assert launches(d / r["run_dir"]) == 1  # never rerun
    assert len({p.name for p in (d / "trials").iterdir()}) == 12  # no stray fork


def test_pbt_resumes_exactly_after_the_parent_is_killed(fake_child, micro_data, tmp_path):
    spec_path = pbt_spec(tmp_path, micro_data, concurrency=2)
    d = tmp_path / "sweep"
    parent = start_parent(fake_child, spec_path, {"FAKE_STEP_S": "0.03"})
    wait_for(lambda: second_generation_running(d))
    pids = child_pids(d)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for run_dir, pid in pids.items():
        wait_for(lambda pid=pid, run_dir=run_dir: not pid_alive(pid, str(run_dir)), timeout=20)
    rerun_after_the_kill(spec_path, d)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pbt": {**PBT, "perturb": {"optim.schedule": [2]}}}, "not a number ('cosine')"),
        ({"pbt": {**PBT, "perturb": {"optim.lr": [0, 2]}}}, "factor 0 must be above 0"),
        ({"pbt": {**PBT, "population": 1}}, "pbt.population"),
        ({"pbt": {**PBT, "perturb": {"optim.learning_rate": [2]}}}, "unknown pretrain config key"),
        ({"pbt": {**PBT, "perturb": {"optim.beta2": [2]}}}, "AdamW state restores it"),
        ({"executor": "ray"}, "sampler pbt runs with executor local or lanes, not ray"),
        ({"sampler": "tpe", "n_trials": 2}, "sweep key pbt: set only with sampler: pbt"),
        ({"pbt": None}, "sampler pbt needs it"),
        ({"overrides": {"train.save_interval": 5}}, "sampler pbt sets it"),
        ({"pruner": {"type": "none", "patience": 2}}, "use pruner: none"),
        ({"measure": {"seeds": 2}}, "measure is for grid, random, qmc and tpe"),
    ],
)
def test_pbt_bad_input_one_line_each(micro_data, tmp_path, change, message):
    spec_path = pbt_spec(tmp_path, micro_data, **change)
    with pytest.raises(UserError) as e:
        load_spec(spec_path)
    assert message in str(e.value) and "\n" not in str(e.value)


def two_members(tmp_path, interval: int, metric: dict, **fields):
    """Run a population of 2 over a 2-point lr space for 2 generations of `interval` steps, the
    worse exploiting the better with twice its LR, and check the exploiter: its parent and
    factor, its config, its resume at the parent's step. Returns (sweep dir, the exploiter's run
    dir, the donor's continuation's run dir)."""
    spec = write_spec(
        tmp_path / "pbt.yaml",
        sampler="pbt",
        pbt={
            "population": 2,
            "interval": interval,
            "budget": 2 * interval,
            "perturb": {"optim.lr": [2.0]},
            "quantile": 0.5,
        },
        metric=metric,
        dir=str(tmp_path / "sweep"),
        **fields,
    )
    d = tmp_path / "sweep"
    assert run_sweep(load_spec(spec), out=lambda m: None) == {"completed": 4}
    rows = {(r["generation"], r["member"]): r for r in results(d)}
    sign = 1 if metric["goal"] == "max" else -1
    best = max((rows[("0", m)] for m in "01"), key=lambda r: sign * float(r[metric["name"]]))
    worst = rows[("0", "1" if best["member"] == "0" else "0")]
    assert best[metric["name"]] != worst[metric["name"]]
    child = rows[("1", worst["member"])]
    assert child["parent"] == best["run_dir"].split("/")[-1] and child["perturbed"] == "optim.lr*2"
    run = d / child["run_dir"]
    config = json.loads((run / "config.json").read_text())
    assert config["optim"]["lr"] == pytest.approx(2 * float(best["optim.lr"]))
    assert config["train"]["max_steps"] == 2 * interval and child["steps"] == str(2 * interval)
    assert f"resumed from step_{interval} at step {interval}" in (run / "training.log").read_text()
    return d, run, d / rows[("1", best["member"])]["run_dir"]


def lrs_of(run_dir) -> dict[int, float]:
    with open(run_dir / "metrics.csv") as f:
        return {int(r["step"]): float(r["lr"]) for r in csv.DictReader(f)}


def test_a_real_member_continues_from_its_parents_checkpoint(micro_pretrain, tmp_path):
    """Micro pretraining, 2 members: generation 1 resumes the parent's step_10 checkpoint (its
    weights, AdamW state and step counter) under the perturbed LR, in a run dir of its own."""
    overrides = micro_overrides(micro_pretrain)
    for key in ("train.max_steps", "train.save_interval"):
        overrides.pop(key)
    d, run, donor = two_members(
        tmp_path,
        10,
        {"name": "val_loss", "goal": "min"},
        command="pretrain",
        overrides={**overrides, "optim.min_lr_ratio": 0.1},  # the LR scales the whole schedule
        space={"optim.lr": [1e-3, 1e-2]},
        concurrency=2,
    )
    assert steps_of(run) == [1, 5, 10, 15, 20]
    own = lrs_of(donor)  # the donor continued itself
    assert all(lrs_of(run)[s] == own[s] for s in (1, 5, 10))  # the parent's rows
    assert lrs_of(run)[15] == pytest.approx(2 * own[15], rel=1e-5)  # the same cosine, twice the LR
    # a continuation's start is its own launch to its first row past the parent's step 10
    assert all(float(r["start_s"]) > 0 for r in results(d))


# ---- with lanes: a member is a lane ---------------------------------------------------------------


def lanes_pbt_spec(tmp_path, micro_data, **fields):
    """A pbt sweep of the fake lanes worker's GRPO lanes (test_lanes_executor's spec)."""
    fields = {
        "sampler": "pbt",
        "pbt": PBT,
        "space": {"optim.lr": [0.05, 0.1, 0.2, 0.4]},
        "overrides": {"train.max_steps": None, **fields.pop("overrides", {})},
        **fields,
    }
    return lanes_spec_file(tmp_path, micro_data, **fields)


def test_pbt_with_lanes_refills_a_lane_from_its_parents_checkpoint(
    fake_lanes, micro_data, tmp_path, monkeypatch
):
    """4 members as 2 lanes of one worker: a generation's end stops the lane through the inbox,
    as a pruned lane is, once its checkpoint is written; the next generation's members are lanes
    posted to the same worker that resume their parent's checkpoint with their own values. The
    lineage is recorded as under the process executor."""
    monkeypatch.setenv("FAKE_STEP_S", "0.03")  # a stop lands well before the budget's end
    d = tmp_path / "sweep"
    spec = load_spec(lanes_pbt_spec(tmp_path, micro_data))
    assert run_sweep(spec, out=lambda m: None) == {"completed": 12}
    rows = results(d)
    check_lineage(d, rows)
    assert workers_started(d) == 1 and max(len(s) for s in lane_sets(d)) == 2
    for r in rows:
        name, run = r["run_dir"].split("/")[-1], d / r["run_dir"]
        if r["generation"] != "2":  # stopped at its generation's end through the inbox
            stop = (d / "lanes" / f"{name}.stop").read_text()
            assert stop == f"completed: pbt: its generation ends at step {r['steps']}"
        if r["parent"]:  # the parent's rows, then its own lr from the parent's checkpoint on
            parent, step = d / "trials" / r["parent"], int(r["parent_step"])
            assert (run / "checkpoints" / f"step_{step}").is_dir()
            assert all(lrs_of(run)[s] == lrs_of(parent)[s] for s in range(1, step + 1))
            assert lrs_of(run)[step + 1] == float(r["optim.lr"])
    gen1 = {int(r["member"]): r for r in rows if r["generation"] == "1"}
    assert gen1[0]["parent"].startswith("g00-m03") and gen1[0]["perturbed"]
    assert "## Population (PBT) lineage" in (d / "report.md").read_text()


PARENT_LANES = """
import sys
from smollab.lab import children
children.lanes_argv = lambda args: [sys.executable, sys.argv[1], *args]
from smollab.cli import main
sys.exit(main(["sweep", sys.argv[2]]))
"""


def test_pbt_with_lanes_resumes_exactly_after_the_parent_is_killed(
    fake_lanes, micro_data, tmp_path
):
    """kill -9 of the sweep while generation 1 runs as lanes: the worker ends its lanes (its
    parent is gone); a rerun continues every open member from its checkpoint in a fresh worker,
    reruns no finished one, and ends with the same lineage, each step once."""
    spec_path = lanes_pbt_spec(tmp_path, micro_data)
    d = tmp_path / "sweep"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_LANES, str(FAKE_WORKER), str(spec_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "FAKE_STEP_S": "0.03"},
    )
    wait_for(lambda: second_generation_running(d))
    worker = int((d / "lanes" / ".child.pid").read_text().split()[0])
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    wait_for(lambda: not pid_alive(worker, str(d / "lanes")), timeout=20)
    rerun_after_the_kill(spec_path, d)
    assert workers_started(d) == 2  # one per sweep process


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"pbt": {**PBT, "perturb": {"grpo.temperature": [0.8, 1.25]}}},
            "sweep key pbt.perturb.grpo.temperature: executor lanes: grpo.temperature cannot "
            "differ between lanes",
        ),
        (
            {"pbt": {**PBT, "perturb": {"model.lora.r": [2]}}},
            "sweep key pbt.perturb.model.lora.r: it shapes the checkpoint's weights",
        ),
        (
            {"overrides": {"train.save_interval": 5}},
            "sweep key overrides.train.save_interval: sampler pbt sets it",
        ),
        ({"pbt": {**PBT, "perturb": {"grpo.beta": [0, 2]}}}, "factor 0 must be above 0"),
    ],
)
def test_pbt_with_lanes_bad_input_one_line_each(micro_data, tmp_path, change, message):
    with pytest.raises(UserError) as e:
        load_spec(lanes_pbt_spec(tmp_path, micro_data, **change))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_real_lane_continues_from_its_parents_checkpoint(micro_model, micro_data, tmp_path):
    """Micro GRPO LoRA, 2 members as 2 lanes of one real worker: generation 1's exploiter is a
    lane that resumes the donor's step_2 checkpoint (adapter, AdamW state, RNG, step counter)
    under twice its LR, in a run dir of its own; the donor's own continuation, stopped at step 2
    and resumed as a new lane, logs what a lane run straight through its 4 steps logs."""
    lanes = {
        "command": "grpo",
        "executor": "lanes",
        "lanes": 2,
        "threads": 1,
        "space": {"optim.lr": [1e-4, 3e-2]},
        "poll_s": 0.2,
    }
    overrides = {
        **micro_lanes_overrides(micro_model, micro_data),
        "reward": [{"name": "sentence_length"}],  # a reward with a spread: a gradient
    }
    d, run, donor = two_members(
        tmp_path, 2, {"name": "reward_mean", "goal": "max"}, overrides=overrides, **lanes
    )
    assert steps_of(run) == [1, 2, 3, 4]
    own = lrs_of(donor)
    assert all(lrs_of(run)[s] == own[s] for s in (1, 2))  # the parent's rows
    assert lrs_of(run)[3] == pytest.approx(2 * own[3], rel=1e-5)  # the same schedule, twice the LR

    def logged(run_dir, steps=(1, 2, 3, 4)):
        with open(run_dir / "metrics.csv") as f:
            rows = {int(r["step"]): r for r in csv.DictReader(f)}
        keys = ("reward_mean", "reward_std", "loss", "kl", "grad_norm")
        return [float(rows[s][k]) for s in steps for k in keys]

    # Step 3 samples from the checkpoint's weights with its RNG streams, and the LR acts only
    # in its update: both continuations draw the same completions and the same loss.
    assert logged(run, [3]) == pytest.approx(logged(donor, [3]), rel=1e-5)
    assert workers_started(d) == 1  # generation 1 refilled the lanes of generation 0's worker

    plain = write_spec(
        tmp_path / "plain.yaml",
        **lanes,
        overrides={**overrides, "train.max_steps": 4},
        metric={"name": "reward_mean", "goal": "max"},
        dir=str(tmp_path / "plain"),
    )
    assert run_sweep(load_spec(plain), out=lambda m: None) == {"completed": 2}
    lr = json.loads((donor / "config.json").read_text())["optim"]["lr"]
    straight = next(
        tmp_path / "plain" / r["run_dir"]
        for r in results(tmp_path / "plain")
        if float(r["optim.lr"]) == lr
    )
    assert logged(donor) == pytest.approx(logged(straight), rel=1e-5)
