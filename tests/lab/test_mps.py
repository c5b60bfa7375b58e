"""MPS daemon handling with every outside call mocked."""

from __future__ import annotations

import subprocess

from smollab.lab.mps import MPS, check_clients, mps_daemon


class FakeControl:
    """Plays nvidia-cuda-mps-control: `-d` starts it, `quit` stops it, lists servers/clients."""

    def __init__(self, running=False, clients=(), start_ok=True):
        self.running = running
        self.clients = list(clients)
        self.start_ok = start_ok
        self.calls: list[tuple[tuple[str, ...], str | None]] = []

    def __call__(self, argv, input=None, env=None, timeout=10.0):
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


def test_starts_the_daemon_and_stops_it_afterwards():
    control, said = FakeControl(running=False), []
    with mps_daemon(out=said.append, mps=make(control, pipe_dir="/tmp/mps-pipe")) as env:
        assert control.running and env == {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/mps-pipe"}
    assert not control.running
    assert any("started the control daemon" in s for s in said)
    assert any("stopped" in s for s in said)
    assert (("nvidia-cuda-mps-control", "-d"), None) in control.calls


def test_a_running_daemon_is_used_and_left_running():
    control, said = FakeControl(running=True), []
    with mps_daemon(out=said.append, mps=make(control)) as env:
        assert env == {}
    assert control.running and "already running" in said[0]
    assert not any(c[1] == "quit\n" for c in control.calls)


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
