"""The NVIDIA MPS control daemon: start it if none runs, check that clients really attach, stop
it afterwards if we started it.

Without MPS, processes sharing one GPU are time-sliced: one kernel stream at a time, so packing
small runs barely helps. With MPS their kernels run concurrently. Every call to the outside
goes through `runner` (argv, stdin text) -> CompletedProcess, so tests replace it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator

CONTROL = "nvidia-cuda-mps-control"
# Volta and newer: at most 48 MPS clients per GPU (CUDA MPS documentation, "Limitations").
MAX_CLIENTS = 48

Runner = Callable[..., subprocess.CompletedProcess]


def run_tool(
    argv: list[str],
    input: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> subprocess.CompletedProcess:
    """An outside tool's output; a missing or hung tool reads as exit 127, never an exception."""
    try:
        return subprocess.run(
            argv, input=input, capture_output=True, text=True, env=env, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(argv, 127, "", str(e))


class MPS:
    def __init__(
        self,
        runner: Runner | None = None,
        which: Callable[[str], str | None] | None = None,
        pipe_dir: str | None = None,
        log_dir: str | None = None,
    ):
        self.runner = runner or run_tool
        self.which = which or shutil.which
        self.pipe_dir = pipe_dir or os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
        self.log_dir = log_dir or os.environ.get("CUDA_MPS_LOG_DIRECTORY")

    def env(self) -> dict[str, str]:
        """Variables clients (and the control tool) need to find this daemon."""
        out = {}
        if self.pipe_dir:
            out["CUDA_MPS_PIPE_DIRECTORY"] = self.pipe_dir
        if self.log_dir:
            out["CUDA_MPS_LOG_DIRECTORY"] = self.log_dir
        return out

    def _control(self, command: str | None = None, *args: str) -> subprocess.CompletedProcess:
        env = {**os.environ, **self.env()}
        if command is None:
            return self.runner([CONTROL, *args], env=env)
        return self.runner([CONTROL], input=command + "\n", env=env)

    def available(self) -> bool:
        return self.which(CONTROL) is not None

    def is_running(self) -> bool:
        r = self._control("get_server_list")
        return r.returncode == 0 and "Cannot find" not in (r.stdout + r.stderr)

    def start(self, wait_s: float = 5.0) -> bool:
        for d in (self.pipe_dir, self.log_dir):
            if d:
                os.makedirs(d, exist_ok=True)
        r = self._control(None, "-d")
        if r.returncode != 0:
            return False
        deadline = time.time() + wait_s
        while time.time() < deadline:
            if self.is_running():
                return True
            time.sleep(0.2)
        return self.is_running()

    def stop(self) -> None:
        self._control("quit")

    def server_pids(self) -> list[int]:
        r = self._control("get_server_list")
        return [int(x) for x in r.stdout.split() if x.isdigit()] if r.returncode == 0 else []

    def client_pids(self) -> set[int]:
        pids: set[int] = set()
        for server in self.server_pids():
            r = self._control(f"get_client_list {server}")
            if r.returncode == 0:
                pids |= {int(x) for x in r.stdout.split() if x.isdigit()}
        return pids

    def verify(self, pids: list[int]) -> tuple[list[int], list[int]]:
        """(attached, missing): which of `pids` the MPS server lists as its clients."""
        clients = self.client_pids()
        return [p for p in pids if p in clients], [p for p in pids if p not in clients]


@contextlib.contextmanager
def mps_daemon(out: Callable[[str], None] = print, mps: MPS | None = None) -> Iterator[dict | None]:
    """Run the body under an MPS daemon; yields the clients' environment, or None without MPS."""
    m = mps or MPS()
    if not m.available():
        out(f"MPS: WARNING: {CONTROL} not found; concurrent runs will time-slice the GPU")
        yield None
        return
    started = False
    if m.is_running():
        out("MPS: control daemon already running; using it")
    elif m.start():
        started = True
        out("MPS: started the control daemon (it will be stopped afterwards)")
    else:
        out(
            "MPS: WARNING: could not start the control daemon (GPU in a prohibited compute mode, "
            "or no permission); concurrent runs will time-slice the GPU"
        )
        yield None
        return
    try:
        yield m.env()
    finally:
        if started:
            m.stop()
            out("MPS: stopped the control daemon")


def check_clients(pids: list[int], out: Callable[[str], None], mps: MPS | None = None) -> dict:
    """Say loudly when runs did not attach to MPS; returns what probe.json records."""
    m = mps or MPS()
    attached, missing = m.verify(pids)
    if missing:
        out(
            f"MPS: WARNING: {len(missing)} of {len(pids)} runs are NOT MPS clients (pids "
            f"{', '.join(map(str, missing))}): they time-slice the GPU instead of sharing it. "
            f"Check CUDA_MPS_PIPE_DIRECTORY and that the daemon runs as this user."
        )
    else:
        out(f"MPS: all {len(pids)} runs attached as clients")
    return {"attached": len(attached), "missing": missing}
