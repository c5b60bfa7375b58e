"""The sweep's study in a real PostgreSQL server (`storage: postgresql://...`): a whole sweep, a
parent killed and resumed, two parents sharing one study as two machines would, and bad URLs.
The server is the test's own (postgres_server.py); the trials are the fake child (conftest)."""

from __future__ import annotations

import csv
import os
import signal
import socket
import subprocess
import sys

import pytest

from smollab.errors import UserError
from smollab.lab.children import pid_alive
from smollab.lab.sweep.scheduler import run_sweep
from smollab.lab.sweep.spec_load import load_spec
from smollab.lab.sweep.study import open_study
from tests.lab.sweep.postgres_server import start_or_skip
from tests.lab.sweep.test_sweep import (
    PARENT,
    child_pids,
    fake_spec,
    launches,
    results,
    wait_for,
)


@pytest.fixture(scope="module")
def postgres():
    server = start_or_skip()
    yield server
    server.stop()


@pytest.fixture
def pg_url(postgres) -> str:
    return postgres.create_database()  # each test its own database


def start_parent(fake_child, spec_path, env_extra) -> subprocess.Popen:
    """`smollab sweep SPEC` in a process group of its own, so the test can kill the group."""
    return subprocess.Popen(
        [sys.executable, "-c", PARENT, str(fake_child), str(spec_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **env_extra},
        start_new_session=True,
    )


def statuses(sweep_dir) -> list[str]:
    return [r["status"] for r in results(sweep_dir)] if (sweep_dir / "results.csv").exists() else []


def server_sessions(url: str) -> int:
    """Connections to the URL's database other than this query's own."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as conn:
        n = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                "current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar()
    engine.dispose()
    return n


def metric_steps(run_dir) -> list[int]:
    with open(run_dir / "metrics.csv") as f:
        return [int(r["step"]) for r in csv.DictReader(f)]


def test_a_sweep_runs_to_the_end_in_postgres(fake_child, micro_data, tmp_path, pg_url):
    spec = load_spec(
        fake_spec(
            tmp_path,
            micro_data,
            storage=pg_url,
            study_name="pg-grid",
            space={"optim.lr": [0.1, 0.5, 20.0, 200.0]},
        )
    )
    assert run_sweep(spec) == {"completed": 2, "diverged": 1, "failed": 1}
    assert server_sessions(pg_url) == 0  # the sweep closed its connections
    by_lr = {float(r["optim.lr"]): r for r in results(tmp_path / "sweep")}
    assert by_lr[0.5]["status"] == "completed" and by_lr[0.5]["steps"] == "10"
    assert float(by_lr[0.5]["val_loss"]) == pytest.approx(5 * 2.718281828 ** (-5) + 0.1, rel=1e-4)
    assert by_lr[20.0]["status"] == "diverged" and by_lr[200.0]["status"] == "failed"
    assert not (tmp_path / "sweep" / "study.journal").exists()  # the study is in the database
    study = open_study(spec, tmp_path / "sweep")
    states = {t.params["optim.lr"]: t.state.name for t in study.trials}
    assert states == {0.1: "COMPLETE", 0.5: "COMPLETE", 20.0: "PRUNED", 200.0: "FAIL"}
    assert study.best_trial.params["optim.lr"] == 0.5


def test_a_killed_parent_resumes_from_postgres(fake_child, micro_data, tmp_path, pg_url):
    spec_path = fake_spec(
        tmp_path,
        micro_data,
        storage=pg_url,
        study_name="pg-resume",
        space={"optim.lr": [0.1, 0.2, 0.3, 0.4]},
        overrides={"train.max_steps": 40},
    )
    d = tmp_path / "sweep"
    parent = start_parent(fake_child, spec_path, {"FAKE_STEP_S": "0.04"})
    wait_for(lambda: "completed" in statuses(d) and "running" in statuses(d))
    pids = child_pids(d)
    os.killpg(parent.pid, signal.SIGKILL)  # the whole `smollab sweep` process group
    parent.wait()
    for run_dir, pid in pids.items():
        wait_for(lambda pid=pid, run_dir=run_dir: not pid_alive(pid, str(run_dir)), timeout=20)
    finished = {r["run_dir"] for r in results(d) if r["status"] == "completed"}

    spec = load_spec(spec_path)
    assert run_sweep(spec) == {"completed": 4}
    rows = results(d)
    assert sorted(float(r["optim.lr"]) for r in rows) == [0.1, 0.2, 0.3, 0.4]
    for r in rows:
        assert launches(d / r["run_dir"]) == 1 or r["run_dir"] not in finished  # not rerun
        assert metric_steps(d / r["run_dir"]) == list(range(1, 41))  # each step exactly once
    trials = open_study(spec, d).trials
    assert len(trials) == 4 and {t.state.name for t in trials} == {"COMPLETE"}


# Both parents settle, meet, then ask at once, each waiting RACE_GAP_S between counting the
# study's trials and asking for one: without the study lock both count the same trials and the
# grid is overrun (a sixth trial, which GridSampler gives a point already running).
RACE = """
import os, time
from pathlib import Path
import optuna
from smollab.lab.sweep.trials import Trials
settle, ask = Trials.settle_previous, optuna.study.Study.ask
def settle_then_meet(self, *args):
    settle(self, *args)
    Path(os.environ["RACE_DIR"], os.environ["RACE_ME"]).touch()
    deadline = time.time() + 60
    while len(os.listdir(os.environ["RACE_DIR"])) < 2 and time.time() < deadline:
        time.sleep(0.01)
def slow_ask(self, *args, **kwargs):
    time.sleep(float(os.environ["RACE_GAP_S"]))
    return ask(self, *args, **kwargs)
Trials.settle_previous, optuna.study.Study.ask = settle_then_meet, slow_ask
"""


def test_two_parents_share_one_study(fake_child, micro_data, tmp_path, pg_url):
    """Two sweep dirs (two machines) on one study, asking at the same time: each grid point runs
    once overall, the grid is not overrun, and each parent lists only its own trials."""
    lrs = [0.1, 0.2, 0.3, 0.4, 0.5]
    specs, parents = {}, {}
    (tmp_path / "race").mkdir()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        specs[name] = fake_spec(
            tmp_path / name,
            micro_data,
            storage=pg_url,
            study_name="shared",
            space={"optim.lr": lrs},
            concurrency=3,
        )
    for name in ("a", "b"):
        env = {
            "FAKE_STEP_S": "0.05",
            "RACE_DIR": str(tmp_path / "race"),
            "RACE_ME": name,
            "RACE_GAP_S": "0.5",
        }
        parents[name] = subprocess.Popen(
            [sys.executable, "-c", RACE + PARENT, str(fake_child), str(specs[name])],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **env},
        )
    outs = {name: p.communicate(timeout=120)[0] for name, p in parents.items()}
    for name, p in parents.items():
        assert p.returncode == 0, outs[name]

    rows = {name: results(tmp_path / name / "sweep") for name in ("a", "b")}
    assert rows["a"] and rows["b"]  # both parents ran trials
    ran = [float(r["optim.lr"]) for name in ("a", "b") for r in rows[name]]
    assert sorted(ran) == lrs  # every grid point once overall
    for name in ("a", "b"):
        for r in rows[name]:
            assert r["status"] == "completed"
            assert launches(tmp_path / name / "sweep" / r["run_dir"]) == 1
    trials = open_study(load_spec(specs["a"]), tmp_path / "a" / "sweep").trials
    assert len(trials) == 5 and {t.state.name for t in trials} == {"COMPLETE"}
    owners = {t.user_attrs["owner"] for t in trials}
    assert len(owners) == 2


def test_a_parent_settles_its_own_trials_outside_the_lock(
    micro_data, tmp_path, pg_url, monkeypatch
):
    """A rerun of dir a stops what a's previous parent left and retries a's failed trial, without
    holding the study lock meanwhile; dir b's parent touches none of it, nor takes a's retry."""
    from optuna.trial import TrialState
    from sqlalchemy import create_engine, text

    from smollab.lab.sweep import trials as trials_mod
    from smollab.lab.sweep.study_lock import StudyLock
    from smollab.rundir.atomic import atomic_write_json

    spec = load_spec(
        fake_spec(
            tmp_path,
            micro_data,
            storage=pg_url,
            study_name="own",
            space={"optim.lr": [0.1, 0.2, 0.3, 0.4]},
        )
    )
    study = open_study(spec, tmp_path / "a")
    lock = StudyLock(pg_url, "own")

    def parent(name):
        return trials_mod.Trials(
            spec, study, tmp_path / name, lambda _: None, owner=name, lock=lock
        )

    first = parent("a")
    failed, left, done = (first.next_trial() for _ in range(3))
    study.tell(failed.trial, state=TrialState.FAIL)
    first.run_dir(done.name).mkdir(parents=True)
    atomic_write_json(first.run_dir(done.name) / "summary.json", {"status": "completed"})

    other = create_engine(pg_url).connect()

    def lock_free() -> bool:  # what a second parent sees: could it ask now?
        free = other.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": lock._key}).scalar()
        if free:
            other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": lock._key})
        return free

    seen = []
    monkeypatch.setattr(
        trials_mod.ch,
        "reap_stale",
        lambda run_dir, timeout: seen.append(("reap", run_dir.name, lock_free())),
    )

    def conclude(trial, name, status, summary, code, wall):
        seen.append(("conclude", name, lock_free()))
        study.tell(trial, 1.0)

    b = parent("b")
    b.settle_previous(1.0, conclude)
    assert seen == [] and b.resume_queue == []  # a's RUNNING trials are alive elsewhere

    rerun = parent("a")
    with lock:
        assert not lock_free()  # the probe sees a held lock
    rerun.settle_previous(1.0, conclude)
    assert sorted(seen) == sorted(
        [("reap", left.name, True), ("reap", done.name, True), ("conclude", done.name, True)]
    )
    fresh = b.next_trial()
    assert fresh.name not in (failed.name, left.name, done.name) and b.next_trial() is None
    resumed, retry = rerun.next_trial(), rerun.next_trial()
    assert resumed.name == left.name and retry.name == failed.name
    assert retry.trial.number not in (failed.trial.number, fresh.trial.number)
    assert retry.params == failed.params and retry.seed == failed.seed
    assert retry.trial.user_attrs["owner"] == "a" and rerun.next_trial() is None
    other.close()
    lock.close()


def test_the_connect_timeout_is_named_as_each_driver_names_it():
    from smollab.lab.sweep.study import CONNECT_TIMEOUT_S, connect_args

    t = CONNECT_TIMEOUT_S
    assert connect_args("postgresql+psycopg2://u@h/db") == {"connect_timeout": t}
    assert connect_args("postgresql+psycopg://u@h/db") == {"connect_timeout": t}
    assert connect_args("postgresql+pg8000://u@h/db") == {"timeout": t}  # no connect_timeout
    assert connect_args("mysql+pymysql://u@h/db") == {"connect_timeout": t}
    assert connect_args("postgresql+pg8000://u@h/db?timeout=3") == {}  # the URL's own
    assert connect_args("postgresql://u@h/db?connect_timeout=3") == {}
    assert connect_args("sqlite:///x.db") == {}


def test_bad_storage_urls_fail_in_one_line(fake_child, micro_data, tmp_path, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://smol:secret@127.0.0.1:{port}/nodb"
    spec = load_spec(fake_spec(tmp_path, micro_data, storage=url))
    with pytest.raises(UserError, match=r"^sweep key storage: cannot open .*Connection refused"):
        run_sweep(spec)
    with pytest.raises(UserError) as e:
        run_sweep(spec)
    assert "secret" not in str(e.value) and "\n" not in str(e.value)

    import smollab.lab.sweep.study as study_mod

    monkeypatch.setattr(study_mod, "CONNECT_TIMEOUT_S", 1)
    with socket.socket() as mute:  # accepts connections (the kernel's backlog), never answers
        mute.bind(("127.0.0.1", 0))
        mute.listen(4)
        url = f"postgresql://u@127.0.0.1:{mute.getsockname()[1]}/db"
        spec = load_spec(fake_spec(tmp_path, micro_data, storage=url))
        with pytest.raises(UserError, match="^sweep key storage: cannot open .*timeout expired"):
            run_sweep(spec)  # without a connect timeout libpq would wait forever

    with pytest.raises(UserError, match=r"driver is not installed.*smollab\[postgres\]"):
        load_spec(fake_spec(tmp_path, micro_data, storage="postgresql+pg8000://u@h/db"))


def test_the_study_lock_excludes_a_second_parent(pg_url):
    from sqlalchemy import create_engine, text

    from smollab.lab.sweep.study_lock import StudyLock

    lock = StudyLock(pg_url, "locked")
    other = create_engine(pg_url).connect()
    try_lock = text("SELECT pg_try_advisory_lock(:k)")
    with lock, lock:  # re-entrant: an inner use keeps it
        assert other.execute(try_lock, {"k": lock._key}).scalar() is False
    assert other.execute(try_lock, {"k": lock._key}).scalar() is True  # released
    other.close()
    lock.close()
