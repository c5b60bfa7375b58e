"""MPS daemon handling: every outside call mocked, then a fake `nvidia-cuda-mps-control` on PATH
that behaves as the real one does where it matters (`-d` forks a daemon that keeps the file
descriptors it inherited; commands on stdin; the directories from the environment)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap

import pytest

from smollab.lab.mps import (
    LOG_VAR,
    MPS,
    PIPE_VAR,
    check_clients,
    daemon_in_the_way,
    mps_daemon,
    private_dirs,
)


class FakeControl:
    """Plays nvidia-cuda-mps-control: `-d` starts it, `quit` stops it, lists servers/clients."""

    def __init__(self, running=False, clients=(), start_ok=True):
        self.running = running
        self.clients = list(clients)
        self.start_ok = start_ok
        self.calls: list[tuple[tuple[str, ...], str | None]] = []

    def __call__(self, argv, input=None, env=None, timeout=10.0, detach=False):
        self.calls.append((tuple(argv), input))
        cmd = (input or "").strip()
        if argv[1:] == ["-d"]:
            self.running = self.start_ok
            return subprocess.CompletedProcess(argv, 0 if self.start_ok else 1, "", "")
        if not self.running:
            return subprocess.CompletedProcess(
                argv, 1, "", "Cannot find MPS control daemon process"
            )
        if cmd == "get_server_list":
            return subprocess.CompletedProcess(argv, 0, "4242\n", "")
        if cmd == "get_client_list 4242":
            return subprocess.CompletedProcess(argv, 0, "".join(f"{p}\n" for p in self.clients), "")
        if cmd == "quit":
            self.running = False
            return subprocess.CompletedProcess(argv, 0, "", "")
        return subprocess.CompletedProcess(argv, 1, "", "unknown")


def make(control, available=True, **kw):
    return MPS(runner=control, which=lambda name: "/usr/bin/" + name if available else None, **kw)


def test_starts_the_daemon_and_stops_it_afterwards(tmp_path):
    control, said = FakeControl(running=False), []
    pipe, log = str(tmp_path / "pipe"), str(tmp_path / "log")
    with mps_daemon(out=said.append, mps=make(control, pipe_dir=pipe, log_dir=log)) as env:
        assert control.running and env == {PIPE_VAR: pipe, LOG_VAR: log}
    assert not control.running
    assert any("started the control daemon" in s for s in said)
    assert any("stopped" in s for s in said)
    assert (("nvidia-cuda-mps-control", "-d"), None) in control.calls


def test_a_running_daemon_is_used_and_left_running(monkeypatch, tmp_path):
    monkeypatch.delenv(PIPE_VAR, raising=False)
    monkeypatch.delenv(LOG_VAR, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    control, said = FakeControl(running=True), []
    with mps_daemon(out=said.append, mps=make(control)) as env:
        assert env == dict(zip((PIPE_VAR, LOG_VAR), private_dirs(), strict=True))
    assert control.running and "already running" in said[0]
    assert not any(c[1] == "quit\n" for c in control.calls)


def test_the_default_directories_are_this_users_own(monkeypatch, tmp_path):
    """Not CUDA's shared /tmp/nvidia-mps and /var/log/nvidia-mps: per user, made 0700."""
    monkeypatch.delenv(PIPE_VAR, raising=False)
    monkeypatch.delenv(LOG_VAR, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    m = make(FakeControl())
    assert m.pipe_dir == str(tmp_path / f"smollab-mps-{os.getuid()}" / "pipe")
    assert m.log_dir == str(tmp_path / f"smollab-mps-{os.getuid()}" / "log")
    assert m.start()
    for d in (m.pipe_dir, m.log_dir, os.path.dirname(m.pipe_dir)):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    monkeypatch.setenv(PIPE_VAR, "/srv/mps")  # the user's own choice wins
    assert make(FakeControl()).pipe_dir == "/srv/mps"


def test_a_directory_someone_else_made_is_not_used(monkeypatch, tmp_path):
    monkeypatch.delenv(PIPE_VAR, raising=False)
    monkeypatch.delenv(LOG_VAR, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    (tmp_path / f"smollab-mps-{os.getuid()}").write_text("not a directory")
    control = FakeControl()
    assert not make(control).start()
    assert control.calls == []  # never started in a place it cannot trust


def test_a_daemon_running_although_mps_is_false_is_found(monkeypatch):
    monkeypatch.delenv(PIPE_VAR, raising=False)
    said: list[str] = []
    m = MPS.found_by_clients(FakeControl(running=True), which=lambda n: "/usr/bin/" + n)
    assert m.pipe_dir == "/tmp/nvidia-mps"  # where CUDA looks by default
    assert daemon_in_the_way(said.append, m) is m
    assert "WARNING: a control daemon is running" in said[0] and "mps is false" in said[0]
    quiet = MPS.found_by_clients(FakeControl(running=False), which=lambda n: "/usr/bin/" + n)
    assert daemon_in_the_way(said.append, quiet) is None and len(said) == 1


def test_missing_or_failing_daemon_is_said_loudly():
    said = []
    with mps_daemon(out=said.append, mps=make(FakeControl(), available=False)) as env:
        assert env is None
    assert "WARNING" in said[0] and "not found" in said[0]
    said.clear()
    with mps_daemon(out=said.append, mps=make(FakeControl(start_ok=False))) as env:
        assert env is None
    assert "WARNING: could not start" in said[0]


def test_client_verification():
    control = FakeControl(running=True, clients=[101, 102])
    said = []
    report = check_clients([101, 102, 103], said.append, make(control))
    assert report == {"attached": 2, "missing": [103]}
    assert "WARNING: 1 of 3 runs are NOT MPS clients" in said[0]
    said.clear()
    assert check_clients([101, 102], said.append, make(control)) == {"attached": 2, "missing": []}
    assert "all 2 runs attached" in said[0]


# The fake control tool: `-d` starts a "daemon" (a sleeping grandchild that inherits stdout and
# stderr, as the real one does) recording the directories it was given; stdin commands answer
# from its record. A caller that captures `-d`'s output waits for an end of file that only the
# daemon's exit brings.
FAKE_CONTROL = textwrap.dedent(
    """\
    #!{python}
    import json, os, subprocess, sys
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    record = os.path.join(pipe, "fake-daemon.json")
    if sys.argv[1:] == ["-d"]:
        if not os.path.isdir(pipe):
            sys.exit(1)
        daemon = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
        )
        with open(record, "w") as f:
            json.dump({{"pid": daemon.pid, "pipe": pipe,
                       "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}}, f)
        sys.exit(0)
    command = sys.stdin.read().strip()
    if not os.path.exists(record):
        print("Cannot find MPS control daemon process", file=sys.stderr)
        sys.exit(1)
    if command == "quit":
        os.kill(json.load(open(record))["pid"], 9)
        os.unlink(record)
    sys.exit(0)
    """
)


@pytest.fixture
def fake_control_on_path(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "nvidia-cuda-mps-control"
    tool.write_text(FAKE_CONTROL.format(python=sys.executable))
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv(PIPE_VAR, raising=False)
    monkeypatch.delenv(LOG_VAR, raising=False)
    yield tmp_path
    for record in tmp_path.rglob("fake-daemon.json"):  # a daemon a failed test left running
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.kill(json.loads(record.read_text())["pid"], signal.SIGKILL)


def test_the_real_tool_starts_in_private_directories_and_returns(fake_control_on_path):
    """`-d` returns at once though the daemon it leaves keeps its inherited output: with the
    output captured the start read as failed after the 10 s time-out. The daemon got this
    user's own directories, and so does every child (`env`)."""
    said: list[str] = []
    with mps_daemon(out=said.append) as env:
        assert env is not None, said
        assert any("started the control daemon" in s for s in said), said
        with open(os.path.join(env[PIPE_VAR], "fake-daemon.json")) as f:
            record = json.load(f)
        assert (record["pipe"], record["log"]) == (env[PIPE_VAR], env[LOG_VAR])
        assert env[PIPE_VAR].startswith(str(fake_control_on_path)) and "nvidia-mps" not in str(env)
        probe = subprocess.run(
            [sys.executable, "-c", f"import os; print(os.environ['{PIPE_VAR}'])"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
        )
        assert probe.stdout.strip() == env[PIPE_VAR]  # what a child started with it finds
    assert any("stopped the control daemon" in s for s in said)
    assert not MPS().is_running()
