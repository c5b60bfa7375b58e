"""Population-based training (`sampler: pbt`): the lineage, continuation from a parent's
checkpoint, resume after the parent is killed, and the spec's refusals. Fake children (conftest)
for the scheduling; one real micro pretraining population for the checkpoint hand-over."""

from __future__ import annotations

import csv
import json
import signal

import pytest
import yaml

from smollab.errors import UserError
from smollab.lab.children import pid_alive
from smollab.lab.sweep.scheduler import run_sweep
from smollab.lab.sweep.spec_load import load_spec
from smollab.lab.sweep.study import open_study
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


def test_pbt_resumes_exactly_after_the_parent_is_killed(fake_child, micro_data, tmp_path):
    spec_path = pbt_spec(tmp_path, micro_data, concurrency=2)
    d = tmp_path / "sweep"
    parent = start_parent(fake_child, spec_path, {"FAKE_STEP_S": "0.03"})

    def second_generation_running():
        if not (d / "results.csv").exists():
            return False
        return any(r["generation"] == "1" and r["status"] == "running" for r in results(d))

    wait_for(second_generation_running)
    pids = child_pids(d)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for run_dir, pid in pids.items():
        wait_for(lambda pid=pid, run_dir=run_dir: not pid_alive(pid, str(run_dir)), timeout=20)
    done = {r["run_dir"] for r in results(d) if r["status"] == "completed"}
    assert done

    assert run_sweep(load_spec(spec_path)) == {"completed": 12}
    rows = results(d)
    check_lineage(d, rows)
    for r in rows:
        if r["run_dir"] in done:
            assert launches(d / r["run_dir"]) == 1  # never rerun
    assert len({p.name for p in (d / "trials").iterdir()}) == 12  # no stray fork


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pbt": {**PBT, "perturb": {"optim.schedule": [2]}}}, "not a number ('cosine')"),
        ({"pbt": {**PBT, "perturb": {"optim.lr": [0, 2]}}}, "factor 0 must be above 0"),
        ({"pbt": {**PBT, "population": 1}}, "pbt.population"),
        ({"pbt": {**PBT, "perturb": {"optim.learning_rate": [2]}}}, "unknown pretrain config key"),
        ({"pbt": {**PBT, "perturb": {"optim.beta2": [2]}}}, "AdamW state restores it"),
        ({"executor": "lanes", "command": "grpo"}, "executor local"),
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


def test_a_real_member_continues_from_its_parents_checkpoint(micro_pretrain, tmp_path):
    """Micro pretraining, 2 members: generation 1 resumes the parent's step_10 checkpoint (its
    weights, AdamW state and step counter) under the perturbed LR, in a run dir of its own."""
    overrides = micro_overrides(micro_pretrain)
    for key in ("train.max_steps", "train.save_interval"):
        overrides.pop(key)
    spec = write_spec(
        tmp_path / "pbt.yaml",
        command="pretrain",
        overrides={**overrides, "optim.min_lr_ratio": 0.1},  # the LR scales the whole schedule
        space={"optim.lr": [1e-3, 1e-2]},
        sampler="pbt",
        pbt={
            "population": 2,
            "interval": 10,
            "budget": 20,
            "perturb": {"optim.lr": [2.0]},
            "quantile": 0.5,
        },
        metric={"name": "val_loss", "goal": "min"},
        concurrency=2,
        dir=str(tmp_path / "sweep"),
    )
    d = tmp_path / "sweep"
    assert run_sweep(load_spec(spec)) == {"completed": 4}
    rows = {(r["generation"], r["member"]): r for r in results(d)}
    best = min((rows[("0", m)] for m in "01"), key=lambda r: float(r["val_loss"]))
    worst = rows[("0", "1" if best["member"] == "0" else "0")]
    child = rows[("1", worst["member"])]
    assert child["parent"] == best["run_dir"].split("/")[-1] and child["perturbed"] == "optim.lr*2"
    run = d / child["run_dir"]
    config = json.loads((run / "config.json").read_text())
    assert config["optim"]["lr"] == pytest.approx(2 * float(best["optim.lr"]))
    assert config["train"]["max_steps"] == 20 and child["steps"] == "20"
    assert "resumed from step_10 at step 10" in (run / "training.log").read_text()
    assert steps_of(run) == [1, 5, 10, 15, 20]
    # a continuation's start is its own launch to its first row past the parent's step 10
    assert all(float(r["start_s"]) > 0 for r in rows.values())

    def lrs(r):
        with open(d / r["run_dir"] / "metrics.csv") as f:
            return {int(x["step"]): float(x["lr"]) for x in csv.DictReader(f)}

    own = lrs(rows[("1", best["member"])])  # the donor continued itself
    assert all(lrs(child)[s] == own[s] for s in (1, 5, 10))  # the parent's rows
    assert lrs(child)[15] == pytest.approx(2 * own[15], rel=1e-5)  # the same cosine, twice the LR
