"""Warm trial starts (`smollab.lab.zygote`): a forked trial's state is its own, the server never
initializes CUDA and refuses to fork once something has, and a sweep through it keeps pruning's
process groups, the server's death and the log's first lines honest."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from smollab.errors import UserError
from smollab.lab import children as ch
from smollab.lab.sweep import scheduler
from smollab.lab.sweep.scheduler import run_sweep
from smollab.lab.sweep.spec_load import load_spec
from smollab.lab.zygote import Zygote, ZygoteError
from tests.lab.sweep.test_sweep import fake_spec, results, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm starts: Linux")

REPORT = r"""
import json, os, random, signal, sys, torch
out = {
    "pid": os.getpid(), "ppid": os.getppid(), "sid": os.getsid(0), "pgid": os.getpgrp(),
    "cwd": os.getcwd(), "env": os.environ.get("TRIAL_VAR"), "gone": os.environ.get("SERVER_VAR"),
    "threads": torch.get_num_threads(), "cuda": torch.cuda.is_initialized(),
    "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
    "stdout": os.readlink("/proc/self/fd/1"), "argv": sys.argv,
    "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
    "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    "sigpipe": signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN,
    "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "random": random.random(),
}
torch.manual_seed(int(sys.argv[1]))  # what every loop does with run.seed
out["torch"] = torch.rand(3).tolist()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def torch_server():
    """One server that imported torch (what matters for threads and CUDA), for the module."""
    z = Zygote(modules=("torch",), env={**os.environ, "SERVER_VAR": "server"})
    z.ready(120)
    yield z
    z.close()


def trial_report(z: Zygote, run: Path, seed: int, threads: int, cwd: Path) -> dict:
    run.mkdir(parents=True)
    env = {**os.environ, "TRIAL_VAR": run.name}
    env.pop("SERVER_VAR", None)
    here = os.getcwd()
    os.chdir(cwd)  # a trial runs in its launcher's cwd at launch, not the server's
    try:
        proc = z.launch([sys.executable, "-c", REPORT, str(seed)], run / "child.log", env, threads)
    finally:
        os.chdir(here)
    assert proc.wait(60) == 0, (run / "child.log").read_text()
    return json.loads((run / "child.log").read_text().strip().splitlines()[-1])


def test_a_warm_trials_env_cwd_threads_and_process_state_are_its_own(torch_server, tmp_path):
    a = trial_report(torch_server, tmp_path / "a", seed=3, threads=1, cwd=tmp_path)
    b = trial_report(torch_server, tmp_path / "b", seed=3, threads=2, cwd=tmp_path / "a")
    for r, run in ((a, "a"), (b, "b")):
        assert r["ppid"] == torch_server.pid != r["pid"]
        assert r["sid"] == r["pgid"] == r["pid"]  # its own session and process group
        assert r["env"] == run and r["gone"] is None  # its env, not the server's
        assert r["stdout"] == str(tmp_path / run / "child.log")
        assert r["fds"] == [0, 1, 2, 3]  # 3: listdir's own; nothing of the server's
        assert r["sigint"] and r["sigterm"] and r["sigpipe"] and r["blocked"] == []
        assert r["argv"] == ["-c", "3"] and not r["cuda"]
    assert a["cwd"] == str(tmp_path) and b["cwd"] == str(tmp_path / "a")
    assert (a["threads"], b["threads"]) == (1, 2)
    assert a["random"] != b["random"]  # Python's random is reseeded at each fork
    assert a["torch"] == b["torch"]  # and a seeded trial draws what its seed says


def test_a_warm_trials_pss_counts_the_servers_pages_shared_its_peak_rss_whole(
    torch_server, tmp_path
):
    """What the probe reports as a warm run's memory: PSS from smaps_rollup, which splits the
    pages the trial still shares with the server between them, where VmHWM counts them whole."""
    (tmp_path / "r").mkdir()
    code = "import sys, time; sys.stdout.write('up\\n'); time.sleep(60)"
    proc = torch_server.launch(
        [sys.executable, "-c", code], tmp_path / "r" / "log", dict(os.environ)
    )
    try:
        log = tmp_path / "r" / "log"
        wait_for(lambda: log.exists() and "up" in log.read_text())
        child_rss, pss = ch.peak_rss_mb(proc.pid), ch.pss_mb(proc.pid)
        assert child_rss > 50  # torch's pages (about 150 MB), counted as the child's own
        assert 0 < pss < 0.7 * child_rss  # shared with the server: about half each
    finally:
        proc.kill()
        proc.wait(10)
    assert ch.pss_mb(proc.pid) is None  # gone: no figure rather than a wrong one


def test_exit_codes_and_signals_as_popen_reports_them(tmp_path):
    z = Zygote(modules=())
    try:
        log = tmp_path / "child.log"
        code = [sys.executable, "-c", "import sys; sys.exit(7)"]
        assert z.launch(code, log, dict(os.environ)).wait(30) == 7
        sleeper = z.launch([sys.executable, "-c", "import time; time.sleep(60)"], log, {})
        time.sleep(0.2)
        os.killpg(sleeper.pid, signal.SIGINT)  # uncaught KeyboardInterrupt: death by SIGINT
        assert sleeper.wait(30) == -signal.SIGINT
        shell = z.launch(["/bin/sh", "-c", "exit 3"], log, dict(os.environ))  # exec'ed
        assert shell.wait(30) == 3
    finally:
        z.close()


def test_the_server_never_initializes_cuda_and_refuses_to_fork_once_it_is(tmp_path):
    # What the server holds at a fork, seen from the trial: torch imported, CUDA not initialized
    # (checked in the trial report above). Here, a preload that initializes it (faked: no GPU
    # in CI) makes every fork refused, in words.
    (tmp_path / "cuda_in_server.py").write_text(
        "import torch\ntorch.cuda.is_initialized = lambda: True\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    z = Zygote(modules=("cuda_in_server",), env=env)
    try:
        z.ready(120)
        with pytest.raises(ZygoteError, match="CUDA was initialized in the warm start server"):
            z.launch([sys.executable, "-c", "pass"], tmp_path / "child.log", env)
    finally:
        z.close()


def test_a_server_whose_imports_fail_says_so(tmp_path):
    z = Zygote(modules=("no_such_module_here",))
    try:
        with pytest.raises(ZygoteError, match="importing no_such_module_here: ModuleNotFound"):
            z.ready(60)
    finally:
        z.close()


# ---- through a sweep ------------------------------------------------------------------------


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in the process group `pgid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        state, _, pgrp = text[text.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            found.append(int(stat.parent.name))
    return found


def test_a_pruned_warm_trials_process_group_is_gone(fake_child, micro_data, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_STEP_S", "0.02")
    monkeypatch.setenv("FAKE_GRANDCHILD", "1")  # a second process in the trial's group
    spec = load_spec(
        fake_spec(
            tmp_path,
            micro_data,
            space={"optim.lr": [1e-3]},
            overrides={"train.max_steps": 100_000},
            pruner={"type": "threshold", "metric": "train_loss", "upper": 4.0},
            concurrency=1,
        )
    )
    said: list[str] = []
    pids: dict[str, int] = {}
    real_launch = ch.launch

    def launch(*args, **kw):
        child = real_launch(*args, **kw)
        pids["trial"] = child.pid
        return child

    monkeypatch.setattr(ch, "launch", launch)
    assert run_sweep(spec, out=said.append) == {"pruned": 1}
    assert any("] trial start: warm (start: auto on Linux)" in s for s in said)
    (row,) = results(tmp_path / "sweep")
    assert row["status"] == "pruned"
    assert (tmp_path / "sweep" / row["run_dir"] / "grandchild.pid").exists()
    wait_for(lambda: not group_members(pids["trial"]), timeout=20)  # the whole group, sleep too


def test_the_servers_death_stops_the_sweep_in_one_line(fake_child, micro_data, tmp_path):
    spec = load_spec(
        fake_spec(
            tmp_path,
            micro_data,
            space={"optim.lr": [0.1, 0.2, 0.3]},
            overrides={"train.max_steps": 100_000},
        )
    )
    os.environ["FAKE_STEP_S"] = "0.02"
    said: list[str] = []
    sweep = scheduler.Sweep(spec, out=said.append)

    def kill_server() -> None:
        wait_for(lambda: len(sweep.running) == 2 and sweep.zygote is not None)
        time.sleep(0.5)
        os.kill(sweep.zygote.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_server)
    killer.start()
    try:
        with pytest.raises(UserError, match=r"warm start server \(pid \d+\) died \(signal 9\)"):
            sweep.run()
    finally:
        killer.join()
        del os.environ["FAKE_STEP_S"]
    assert sum("died" in s for s in said) == 1
    rows = results(tmp_path / "sweep")
    assert [r["status"] for r in rows] == ["interrupted", "interrupted"]  # resumed on a rerun
    for r in rows:  # each stopped cleanly: its .alive removed on the way out
        assert not (tmp_path / "sweep" / r["run_dir"] / ".alive").exists()


def test_start_cold_and_refusals(fake_child, micro_data, tmp_path):
    said: list[str] = []
    spec = load_spec(fake_spec(tmp_path, micro_data, start="cold"))
    assert run_sweep(spec, out=said.append) == {"completed": 1}
    assert any("trial start: cold (start: cold)" in s for s in said)
    with pytest.raises(
        UserError,
        match=r"sweep key start: warm is not available here \(executor lanes: a worker trains",
    ):
        load_spec(fake_spec(tmp_path, micro_data, start="warm", executor="lanes"))
    with pytest.raises(UserError, match=r"\(executor ray: an actor that ends takes its own"):
        load_spec(fake_spec(tmp_path, micro_data, start="warm", executor="ray"))


def test_macos_starts_cold_and_refuses_warm(fake_child, micro_data, tmp_path, monkeypatch):
    from smollab.lab.sweep import resources

    spec = load_spec(fake_spec(tmp_path, micro_data))
    monkeypatch.setattr(sys, "platform", "darwin")
    said: list[str] = []
    assert resources.start_server(spec, tmp_path, None, said.append) is None
    assert said == [
        "trial start: cold (start: auto on darwin: fork after torch's imports is unsafe): "
        "each trial a fresh interpreter"
    ]
    with pytest.raises(UserError, match="sweep key start: warm needs Linux"):
        load_spec(fake_spec(tmp_path, micro_data, start="warm"))
