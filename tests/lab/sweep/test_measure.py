"""The measure step: the search's best configurations rerun on fresh seeds, packed like trials,
resumable, and compared in the report (fake children: many quick runs)."""

from __future__ import annotations

import csv
import json
import signal

import pytest

from smollab.cli import main
from smollab.errors import UserError
from smollab.lab.children import pid_alive
from smollab.lab.sweep.scheduler import run_sweep
from smollab.lab.sweep.spec_load import load_spec
from tests.lab.sweep.test_sweep import (
    child_pids,
    fake_spec,
    launches,
    results,
    start_parent,
    wait_for,
)

# the fake child's loss is 5 exp(-lr step): the larger lr, the better
LRS = [0.05, 0.2, 0.5]


def measured(rows):
    return [r for r in rows if r.get("role") == "measure"]


def test_the_best_configurations_rerun_on_fresh_seeds_and_are_compared(
    fake_child, micro_data, tmp_path
):
    spec = load_spec(
        fake_spec(
            tmp_path,
            micro_data,
            space={"optim.lr": LRS},
            seeds=[0, 1],
            measure={"top_k": 2, "seeds": 3},
        )
    )
    assert run_sweep(spec) == {"completed": 12}
    d = tmp_path / "sweep"
    rows = results(d)
    search = [r for r in rows if r["role"] != "measure"]
    assert len(search) == 6 and {r["seed"] for r in search} == {"0", "1"}
    m = measured(rows)
    assert sorted((float(r["optim.lr"]), int(r["seed"])) for r in m) == [
        (lr, s) for lr in (0.2, 0.5) for s in (2, 3, 4)
    ]
    assert all(r["status"] == "completed" and r["run_dir"].startswith("trials/m") for r in m)
    out = json.loads((d / "results.json").read_text())
    assert {c["name"] for c in out["measure"]["configs"]} == {"lr=0.2", "lr=0.5"}
    assert len(out["configs"]) == 3  # the search's own comparison is still there
    report = (d / "report.md").read_text()
    assert "## Measured on fresh seeds" in report and "seeds [2, 3, 4]" in report
    assert "lr=0.5" in report.split("## Best")[1].split("\n\n")[1]  # the search's best

    # a rerun finds the measured runs finished: nothing launched again
    assert run_sweep(spec) == {"completed": 12}
    assert all(launches(d / r["run_dir"]) == 1 for r in results(d))


def test_measure_added_to_a_finished_search_and_the_cli_flag(fake_child, micro_data, tmp_path):
    spec_path = fake_spec(tmp_path, micro_data, space={"optim.lr": LRS})
    run_sweep(load_spec(spec_path))
    assert main(["sweep", str(spec_path), "measure.top_k=1", "--measure", "2"]) == 0
    rows = results(tmp_path / "sweep")
    assert [(r["optim.lr"], r["seed"]) for r in measured(rows)] == [("0.5", "1"), ("0.5", "2")]
    assert all(launches(tmp_path / "sweep" / r["run_dir"]) == 1 for r in rows)


def test_a_killed_measure_step_continues_without_duplicates(fake_child, micro_data, tmp_path):
    spec_path = fake_spec(
        tmp_path,
        micro_data,
        space={"optim.lr": LRS},
        overrides={"train.max_steps": 40},
        measure={"top_k": 2, "seeds": 2},
    )
    d = tmp_path / "sweep"
    parent = start_parent(fake_child, spec_path, {"FAKE_STEP_S": "0.04"})

    def measuring():
        return (d / "results.csv").exists() and any(
            r["status"] == "running" for r in measured(results(d))
        )

    wait_for(measuring)
    pids = child_pids(d)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for run_dir, pid in pids.items():
        wait_for(lambda pid=pid, run_dir=run_dir: not pid_alive(pid, str(run_dir)), timeout=20)
    done_before = {r["run_dir"] for r in results(d) if r["status"] == "completed"}

    assert run_sweep(load_spec(spec_path)) == {"completed": 7}
    rows = results(d)
    assert len(measured(rows)) == 4 and len({r["run_dir"] for r in rows}) == 7
    for r in rows:
        if r["run_dir"] in done_before:
            assert launches(d / r["run_dir"]) == 1
        with open(d / r["run_dir"] / "metrics.csv") as f:
            assert [int(x["step"]) for x in csv.DictReader(f)] == list(range(1, 41))


def test_nothing_to_measure_is_one_line_after_the_results(fake_child, micro_data, tmp_path):
    spec = load_spec(
        fake_spec(
            tmp_path,
            micro_data,
            space={"optim.lr": [20.0, 30.0]},  # both diverge
            measure={"seeds": 2},
        )
    )
    with pytest.raises(UserError, match="sweep key measure: no search trial completed") as e:
        run_sweep(spec)
    assert "\n" not in str(e.value)
    assert [r["status"] for r in results(tmp_path / "sweep")] == ["diverged", "diverged"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--measure", "0"], "sweep key measure.seeds: .*greater than or equal to 1"),
        (["measure.top_k=0", "--measure", "2"], "sweep key measure.top_k"),
        (["measure.top=2", "--measure", "2"], "measure.top"),
    ],
)
def test_measure_bad_input_is_one_line(micro_data, tmp_path, capsys, args, message):
    spec_path = fake_spec(tmp_path, micro_data, space={"optim.lr": LRS})
    assert main(["sweep", str(spec_path), *args]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    import re

    assert re.search(message, err), err
    assert not (tmp_path / "sweep").exists()
