"""A sweep stopped, crashed or hung at any moment leaves true output and no process behind:
trial time limits, SIGKILL for children that ignore SIGINT (the sweep stopping them, and the
reaper once the sweep itself is SIGKILLed), the sweep dir's lock, a study per sweep dir on a
shared RDB, and a journal left torn by a kill. Fake children (conftest) throughout."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from smollab.errors import UserError
from smollab.lab import children as ch
from smollab.lab.sweep import scheduler
from smollab.lab.sweep.scheduler import run_sweep
from smollab.lab.sweep.spec_load import load_spec
from smollab.lab.sweep.study import open_study
from tests.lab.sweep.test_sweep import (
    PARENT,
    child_pids,
    fake_spec,
    results,
    start_parent,
    wait_for,
)


def alive(pid: int) -> bool:
    """Running (a zombie, dead but not yet reaped by its new parent, does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ch.pid_alive(pid)
    return stat[stat.rindex(")") + 2] != "Z"


def run_guarded(spec, said: list[str], limit: float = 120.0) -> dict:
    """Run a sweep in this process; a sweep that hangs is stopped (as by Ctrl-C twice) after
    `limit` seconds and fails the test instead of hanging it."""
    sweep = scheduler.Sweep(spec, out=said.append)
    dog = threading.Timer(limit, lambda: setattr(sweep.stop, "count", 2))
    dog.start()
    try:
        return sweep.run()
    except KeyboardInterrupt:
        pytest.fail(f"the sweep hung; stopped after {limit:g} s")
    finally:
        dog.cancel()


def recorded_pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def kill_leftovers(pids: list[int]) -> None:
    """A failing test must not leave its SIGINT-ignoring children running."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize(
    "limit, evidence",
    [
        ("trial_timeout_s", "timed out after 3 s"),
        ("stall_timeout_s", "stalled: wrote nothing for 3 s"),
    ],
)
def test_a_hung_trial_is_stopped_and_the_sweep_goes_on(
    fake_child, micro_data, tmp_path, monkeypatch, limit, evidence
):
    """The lr=0.3 child hangs before its first step and ignores SIGINT: SIGKILL after
    stop_timeout_s, recorded as failed with the evidence; every other trial completes."""
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_PIDS_FILE", str(pids))
    monkeypatch.setenv("FAKE_HANG_LR", "0.3")
    spec = load_spec(
        fake_spec(
            tmp_path,
            micro_data,
            space={"optim.lr": [0.1, 0.2, 0.3, 0.4]},
            stop_timeout_s=1,
            **{limit: 3},
        )
    )
    said: list[str] = []
    try:
        counts = run_guarded(spec, said)
    finally:
        kill_leftovers(recorded_pids(pids))
    assert counts == {"completed": 3, "failed": 1}
    d = tmp_path / "sweep"
    by_lr = {r["optim.lr"]: r for r in results(d)}
    hung = by_lr.pop("0.3")
    assert hung["status"] == "failed" and hung["reason"] == evidence
    assert all(r["status"] == "completed" for r in by_lr.values())
    summary = json.loads((d / hung["run_dir"] / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["evidence"] == evidence
    (t,) = [t for t in open_study(spec, d).trials if t.params["optim.lr"] == 0.3]
    assert t.state.name == "FAIL" and t.user_attrs["reason"] == evidence
    assert any("SIGKILL" in s for s in said)  # it ignored SIGINT
    assert any(s == f"  failed: {hung['run_dir']}: {evidence}" for s in said)
    report = (d / "report.md").read_text()
    name = Path(hung["run_dir"]).name
    assert f"| `{name}` | 0.3 | 0 | failed |" in report and evidence in report
    assert len(recorded_pids(pids)) == 4
    assert not [p for p in recorded_pids(pids) if alive(p)]


def test_a_child_that_survives_sigkill_is_given_up_on(
    fake_child, micro_data, tmp_path, monkeypatch
):
    """Nothing the sweep waits on is unbounded: a child SIGKILL does not end (here: a kill that
    does nothing) is recorded as failed and the sweep finishes."""
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_PIDS_FILE", str(pids))
    monkeypatch.setenv("FAKE_HANG_LR", "0.3")
    monkeypatch.setattr(scheduler, "KILL_WAIT_S", 1.0)
    monkeypatch.setattr(ch.Child, "kill", lambda self: setattr(self, "kill_sent", 0.0))
    spec = load_spec(
        fake_spec(
            tmp_path,
            micro_data,
            space={"optim.lr": [0.3]},
            concurrency=1,
            trial_timeout_s=1,
            stop_timeout_s=1,
        )
    )
    try:
        assert run_guarded(spec, []) == {"failed": 1}
    finally:
        kill_leftovers(recorded_pids(pids))
        for c in list(ch._LIVE):
            c.wait(10)
    (row,) = results(tmp_path / "sweep")
    assert "did not exit 1 s after SIGKILL (timed out after 1 s)" in row["reason"]


def test_ctrl_c_kills_children_that_ignore_sigint(fake_child, micro_data, tmp_path):
    spec_path = fake_spec(
        tmp_path,
        micro_data,
        space={"optim.lr": [0.1, 0.2, 0.3]},
        overrides={"train.max_steps": 100_000},
        stop_timeout_s=1,
    )
    d = tmp_path / "sweep"
    pids = tmp_path / "pids"
    parent = start_parent(
        fake_child,
        spec_path,
        {"FAKE_STEP_S": "0.02", "FAKE_IGNORE_SIGINT": "1", "FAKE_PIDS_FILE": str(pids)},
    )
    try:
        wait_for(lambda: len(recorded_pids(pids)) == 2)  # both ignore SIGINT by now
        parent.send_signal(signal.SIGINT)
        out, _ = parent.communicate(timeout=60)
    finally:
        parent.kill()
        kill_leftovers(recorded_pids(pids))
    assert parent.returncode == 130, out
    assert "still running 1 s after SIGINT; SIGKILL" in out
    assert len(recorded_pids(pids)) == 2 and not [p for p in recorded_pids(pids) if alive(p)]
    assert [r["status"] for r in results(d)] == ["interrupted", "interrupted"]


def reaper_of(parent: int) -> int | None:
    """The reaper process the sweep `parent` started (a child of it running reaper.py)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            ppid = int(text[text.rindex(")") + 2 :].split()[1])
            if ppid == parent and b"reaper.py" in (stat.parent / "cmdline").read_bytes():
                return int(stat.parent.name)
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_reaper_kills_children_that_ignore_sigint_after_the_sweep_is_sigkilled(
    fake_child, micro_data, tmp_path
):
    """PR_SET_PDEATHSIG only sends SIGINT: the reaper SIGKILLs what ignores it, then exits."""
    spec_path = fake_spec(
        tmp_path,
        micro_data,
        space={"optim.lr": [0.1, 0.2, 0.3]},
        overrides={"train.max_steps": 100_000},
        stop_timeout_s=1,
    )
    pids = tmp_path / "pids"
    with open(tmp_path / "parent.log", "w") as log:
        env = {
            **os.environ,
            "FAKE_STEP_S": "0.02",
            "FAKE_IGNORE_SIGINT": "1",
            "FAKE_PIDS_FILE": str(pids),
        }
        parent = subprocess.Popen(
            [sys.executable, "-c", PARENT, str(fake_child), str(spec_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    reaper = None
    try:
        wait_for(
            lambda: len(recorded_pids(pids)) == 2 and all(alive(p) for p in recorded_pids(pids))
        )
        reaper = reaper_of(parent.pid)
        assert reaper is not None and alive(reaper)
        parent.kill()
        parent.wait()
        wait_for(lambda: not [p for p in recorded_pids(pids) if alive(p)], timeout=30)
        wait_for(lambda: not alive(reaper), timeout=10)
    finally:
        parent.kill()
        parent.wait()
        kill_leftovers(recorded_pids(pids) + ([reaper] if reaper else []))


def test_a_second_sweep_on_the_same_dir_stops_at_once(fake_child, micro_data, tmp_path, capsys):
    spec_path = fake_spec(
        tmp_path, micro_data, space={"optim.lr": [0.1]}, overrides={"train.max_steps": 100_000}
    )
    d = tmp_path / "sweep"
    parent = start_parent(fake_child, spec_path, {"FAKE_STEP_S": "0.02"})
    try:
        wait_for(lambda: len(child_pids(d)) == 1)
        with pytest.raises(UserError) as e:
            run_sweep(load_spec(spec_path))
        assert str(e.value).startswith(
            f"sweep dir {d} is in use by another sweep (pid {parent.pid})"
        )
        from smollab.cli import main

        assert main(["sweep", str(spec_path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"(pid {parent.pid})" in err
        assert [r["status"] for r in results(d)] == ["running"]  # the first sweep was not disturbed
    finally:
        parent.send_signal(signal.SIGINT)
        parent.communicate(timeout=60)
    assert parent.returncode == 130


def test_sweep_dirs_sharing_an_rdb_url_keep_their_own_studies(fake_child, micro_data, tmp_path):
    import optuna

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    names = {}
    for sub, lr, extra in (("a", 0.1, {}), ("b", 0.2, {}), ("c", 0.3, {"study_name": "mine"})):
        spec = load_spec(
            fake_spec(
                tmp_path,
                micro_data,
                space={"optim.lr": [lr]},
                storage=url,
                dir=str(tmp_path / sub),
                **extra,
            )
        )
        assert run_sweep(spec, out=lambda _: None) == {"completed": 1}
        meta = json.loads((tmp_path / sub / "sweep.json").read_text())
        names[sub] = meta["spec"]["study_name"]
        assert [
            t.params["optim.lr"]
            for t in open_study(load_spec(tmp_path / "spec.yaml"), tmp_path / sub).trials
        ] == [lr]
    assert names["a"].startswith("a-") and names["b"].startswith("b-") and names["c"] == "mine"
    studies = {s.study_name: s.n_trials for s in optuna.get_all_study_summaries(url)}
    assert studies == {names["a"]: 1, names["b"]: 1, "mine": 1}


def test_a_torn_journal_and_its_stale_lock_do_not_stop_the_rerun(fake_child, micro_data, tmp_path):
    """A sweep killed while writing its journal leaves a torn last line and the journal's lock
    file; the rerun (which writes: it retries the crashed trial) reads and appends as before."""
    spec = load_spec(fake_spec(tmp_path, micro_data, space={"optim.lr": [0.1, 200.0]}))
    assert run_sweep(spec, out=lambda _: None) == {"completed": 1, "failed": 1}
    d = tmp_path / "sweep"
    with open(d / "study.journal", "ab") as f:
        f.write(b'{"op_code": 5, "worker_id": "x", "tri')
    (d / "study.journal.lock").write_text("")
    assert run_sweep(spec, out=lambda _: None) == {"completed": 1, "failed": 1}
    assert not (d / "study.journal.lock").exists()
    states = [t.state.name for t in open_study(spec, d).trials]
    assert sorted(states) == ["COMPLETE", "FAIL", "FAIL"]  # the retry is a trial of its own
