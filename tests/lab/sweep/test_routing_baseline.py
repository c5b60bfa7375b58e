"""`routing_baseline: true`: every routed trial gets its matched mode=none baseline, one per
distinct baseline, marked in results.csv and shown beside its routed trials (fake children).

The grpo.routing keys belong to the routing core, which may not be in this tree's
config schema: the spec is built with `SweepSpec.model_validate` (the loader checks keys
against the schema) and the sweep's config resolution (device, data preflight) is stubbed.
The fake child takes any override and trains by optim.lr alone.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from smollab.lab.sweep import resources, scheduler
from smollab.lab.sweep.baseline import Baselines
from smollab.lab.sweep.spec import SweepSpec
from smollab.report.sweep_report import write_sweep_report


def routing_spec(tmp_path: Path, **fields) -> SweepSpec:
    tree = dict(
        command="grpo",
        overrides={
            "grpo.routing.enabled": True,
            "grpo.routing.mode": "classic",
            "train.max_steps": 6,
            "optim.lr": 0.1,
        },
        space={"grpo.routing.routing_frac": [0.2, 1.0], "grpo.routing.retain_r": [4, 32]},
        metric={"name": "reward_mean", "goal": "max"},
        concurrency=2,
        dir=str(tmp_path / "sweep"),
        poll_s=0.05,
        routing_baseline=True,
    )
    tree.update(fields)
    return SweepSpec.model_validate(tree)


@pytest.fixture
def no_config_resolution(monkeypatch):
    monkeypatch.setattr(resources, "detect_device", lambda spec: "cpu")
    monkeypatch.setattr(scheduler, "preflight_data", lambda spec, say, out: None)


def results(d: Path) -> list[dict[str, str]]:
    with open(d / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def launches(run_dir: Path) -> int:
    return sum(1 for ln in (run_dir / "child.log").read_text().splitlines() if ln.startswith("$ "))


def test_which_trials_get_which_baseline(tmp_path):
    spec = routing_spec(tmp_path)
    found = Baselines(spec)
    a = found.add("000-x", {"grpo.routing.routing_frac": 0.2, "grpo.routing.retain_r": 4}, 0)
    b = found.add("001-x", {"grpo.routing.routing_frac": 1.0, "grpo.routing.retain_r": 4}, 0)
    c = found.add("002-x", {"grpo.routing.routing_frac": 0.2, "grpo.routing.retain_r": 32}, 0)
    d = found.add("003-x", {"grpo.routing.routing_frac": 0.2, "grpo.routing.retain_r": 4}, 1)
    assert a is b and len({a.name, c.name, d.name}) == 3  # routing_frac only: shared
    assert a.of == ["000-x", "001-x"] and a.params == {"grpo.routing.retain_r": 4}
    assert a.extra["grpo.routing.mode"] == "none" and a.name.startswith("b")
    assert a.name.endswith("-retain_r4-s0") and d.name.endswith("-s1")
    # ablated_frac is read by a none run too: the baseline keeps it, and it tells baselines apart
    e = found.add(
        "005-x",
        {
            "grpo.routing.routing_frac": 0.2,
            "grpo.routing.retain_r": 4,
            "grpo.routing.ablated_frac": 0.3,
        },
        0,
    )
    assert e is not a and e.params["grpo.routing.ablated_frac"] == 0.3
    assert "grpo.routing.ablated_frac" not in e.extra
    # eligibility changes the rewards a none run trains on: kept, and it tells baselines apart;
    # gate_flags only picks flags: shared, and reset to its default (a none run refuses it)
    both = {"grpo.routing.retain_r": 4, "grpo.routing.eligibility": "completion"}
    f = found.add("006-x", {**both, "grpo.routing.gate_flags": True}, 0)
    g = found.add("007-x", {**both, "grpo.routing.gate_flags": False}, 0)
    assert f is g and f is not a and f.params == both
    assert f.extra["grpo.routing.gate_flags"] is False
    # a trial whose routing is off, or already mode none, is no routed trial
    assert found.add("004-x", {"grpo.routing.mode": "none"}, 0) is None
    assert Baselines(routing_spec(tmp_path, routing_baseline=False)).add("0", {}, 0) is None
    off = routing_spec(tmp_path, overrides={"grpo.routing.enabled": False})
    assert Baselines(off).add("000-x", {"grpo.routing.retain_r": 4}, 0) is None
    assert "routing baselines: 2 matched mode=none trial(s) for 4 routed trial(s)" in (
        spec.describe()
    )


def test_sweep_runs_each_baseline_once_beside_its_routed_trials(
    fake_child, no_config_resolution, tmp_path
):
    spec = routing_spec(tmp_path)
    counts = scheduler.run_sweep(spec, out=lambda m: None)
    assert counts == {"completed": 6}  # 4 routed trials and 2 baselines
    d = tmp_path / "sweep"
    rows = results(d)
    assert [r["role"] for r in rows].count("routed") == 4
    bases = [r for r in rows if r["role"] == "baseline"]
    assert len(bases) == 2
    routed = {r["trial"]: r for r in rows if r["role"] == "routed"}
    for b in bases:
        served = b["baseline_of"].split()
        assert len(served) == 2  # the routing_frac 0.2 and 1.0 trials of one retain_r
        assert {routed[i]["grpo.routing.retain_r"] for i in served} == {b["grpo.routing.retain_r"]}
        assert {routed[i]["grpo.routing.routing_frac"] for i in served} == {"0.2", "1"}
        assert b["status"] == "completed" and float(b["reward_mean"]) < 0
        argv = json.loads((d / b["run_dir"] / "summary.json").read_text())["argv"]
        assert "grpo.routing.mode=none" in argv
        assert f"grpo.routing.retain_r={b['grpo.routing.retain_r']}" in argv
        assert not any(a.startswith("grpo.routing.routing_frac=0.2") for a in argv)
    study = scheduler.open_study(spec, d)
    assert len(study.trials) == 4  # baselines are no Optuna trials

    text = write_sweep_report(d, plots=False).read_text()
    assert "## Routing baselines" in text
    table = text.split("## All trials")[1].splitlines()
    order = [ln.split("|")[1].strip() for ln in table if ln.startswith("| ") and "---" not in ln]
    for b in bases:  # right after the last routed trial it serves
        last = max(order.index(i) for i in b["baseline_of"].split())
        assert order[last + 1] == b["trial"]
    best = text.split("## Best")[1].split("##")[0]
    assert "`trials/b" not in best  # a baseline is never the best point of the space

    # a rerun keeps finished baselines and continues an interrupted one in its run dir
    first = d / bases[0]["run_dir"]
    summary = json.loads((first / "summary.json").read_text())
    (first / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    scheduler.run_sweep(spec, out=lambda m: None)
    assert launches(first) == 2 and launches(d / bases[1]["run_dir"]) == 1
    assert all(launches(d / r["run_dir"]) == 1 for r in routed.values())
    assert {r["status"] for r in results(d)} == {"completed"} and len(results(d)) == 6


def test_without_the_option_results_csv_is_unchanged(fake_child, no_config_resolution, tmp_path):
    spec = routing_spec(tmp_path, routing_baseline=False, space={"grpo.routing.retain_r": [4]})
    assert scheduler.run_sweep(spec, out=lambda m: None) == {"completed": 1}
    rows = results(tmp_path / "sweep")
    assert len(rows) == 1 and "role" not in rows[0] and "baseline_of" not in rows[0]


@pytest.mark.parametrize(
    "command, match",
    [("pretrain", "routing is a grpo feature, not pretrain"), ("grpo", "no trial is routed")],
)
def test_a_baseline_option_with_nothing_to_match_is_refused(tmp_path, command, match):
    from smollab.errors import UserError
    from smollab.lab.sweep.spec_load import validate_spec

    tree = dict(
        command=command,
        space={"optim.lr": [1e-3]},
        routing_baseline=True,
        metric={"name": "lr", "goal": "min"},
        dir=str(tmp_path / "sweep"),
    )
    with pytest.raises(UserError, match=f"^sweep key routing_baseline: {match}"):
        validate_spec(tree)
