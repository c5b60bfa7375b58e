"""A finished sweep's study, opened the way the README tells users to: Optuna's own `load_study` on
the journal file smollab writes, and optuna-dashboard's JSON API on the same file."""

from __future__ import annotations

import csv
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from smollab.lab.sweep.scheduler import run_sweep
from smollab.lab.sweep.spec_load import load_spec
from smollab.lab.sweep.study import JOURNAL
from smollab.rundir.runs import RunView


@pytest.fixture
def finished_sweep(fake_child, micro_data, tmp_path):
    """A grid over three learning rates with the fake child: two complete, one diverges."""
    spec = dict(
        command="pretrain",
        overrides={
            "data.dir": str(micro_data),
            "data.num_stories": 400,
            "data.vocab_size": 256,
            "perf.device": "cpu",
            "train.max_steps": 10,
            "optim.warmup_steps": 0,
        },
        space={"optim.lr": [0.1, 0.5, 20.0]},
        metric={"name": "val_loss", "goal": "min"},
        concurrency=2,
        dir=str(tmp_path / "sweep"),
        poll_s=0.05,
    )
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert run_sweep(load_spec(tmp_path / "spec.yaml")) == {"completed": 2, "diverged": 1}
    return tmp_path / "sweep"


def journal_storage(sweep_dir):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(sweep_dir / JOURNAL)))


def test_load_study_reads_trials_params_values_and_states(finished_sweep):
    import optuna

    storage = journal_storage(finished_sweep)
    [name] = optuna.get_all_study_names(storage)
    study = optuna.load_study(study_name=name, storage=storage)
    with open(finished_sweep / "results.csv", newline="") as f:
        rows = {float(r["optim.lr"]): r for r in csv.DictReader(f)}
    by_lr = {t.params["optim.lr"]: t for t in study.trials}
    assert sorted(by_lr) == [0.1, 0.5, 20.0] and len(study.trials) == 3
    assert {lr: t.state.name for lr, t in by_lr.items()} == {
        0.1: "COMPLETE",
        0.5: "COMPLETE",
        20.0: "PRUNED",
    }
    for lr in (0.1, 0.5):
        run = RunView(finished_sweep / rows[lr]["run_dir"])
        assert by_lr[lr].value == run.last("val_loss")  # the study holds the run's metric
        assert by_lr[lr].value == pytest.approx(float(rows[lr]["val_loss"]), rel=1e-4)
        assert by_lr[lr].params == {"optim.lr": lr, "seed": 0}
    assert by_lr[20.0].value is None
    assert study.best_trial.params["optim.lr"] == 0.5  # the fake loss falls faster at a higher lr
    assert study.direction == optuna.study.StudyDirection.MINIMIZE
    # each trial was launched with the study as its tracker group
    argv = json.loads((finished_sweep / rows[0.1]["run_dir"] / "summary.json").read_text())["argv"]
    assert f"run.group={json.dumps(name)}" in argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_optuna_dashboard_serves_the_study(finished_sweep):
    pytest.importorskip("optuna_dashboard")
    import optuna

    [name] = optuna.get_all_study_names(journal_storage(finished_sweep))
    port = free_port()
    # The README's command, `optuna-dashboard <sweep dir>/study.journal`, from this interpreter's
    # environment (its console script sits beside it).
    exe = Path(sys.executable).parent / "optuna-dashboard"
    server = subprocess.Popen(
        [str(exe), str(finished_sweep / JOURNAL), "--port", str(port), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        body, deadline = None, time.monotonic() + 60
        while body is None and time.monotonic() < deadline:
            assert server.poll() is None, server.stdout.read().decode()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as r:
                    body = json.loads(r.read())
            except OSError:
                time.sleep(0.2)
        assert body is not None, "optuna-dashboard did not answer within 60 s"
        [study] = body["study_summaries"]
        assert study["study_name"] == name
        url = f"http://127.0.0.1:{port}/api/studies/{study['study_id']}"
        with urllib.request.urlopen(url, timeout=5) as r:
            detail = json.loads(r.read())
        assert sorted(t["state"] for t in detail["trials"]) == ["Complete", "Complete", "Pruned"]
    finally:
        server.terminate()
        server.wait(timeout=30)
