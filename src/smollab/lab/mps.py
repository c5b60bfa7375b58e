"""The NVIDIA MPS control daemon: start it if none runs, check that clients really attach, stop
it afterwards if we started it; and tell whether one runs where CUDA processes would find it.

Without MPS, processes sharing one GPU are time-sliced: one kernel stream at a time, so packing
small runs barely helps. With MPS their kernels run concurrently. Every call to the outside
goes through `runner` (argv, stdin text) -> CompletedProcess, so tests replace it.

Where the daemon lives: NVIDIA's MPS documentation has clients and the control tool find the
daemon through CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps) and the daemon log to
CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps). Those defaults are shared by every user
(and the log one needs root), so a daemon smollab starts gets directories of this user's own
(`private_dirs`: under XDG_RUNTIME_DIR, else the temp dir, made 0700 and checked to be ours),
unless the environment names them, and `env()` gives both to every child. The control tool's
`-d` forks the daemon and returns; the daemon keeps the file descriptors it inherited, so its
output goes to /dev/null (captured pipes would make the call wait its whole time-out for an end
of file that never comes, and read as a failure).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

CONTROL = "nvidia-cuda-mps-control"
PIPE_VAR, LOG_VAR = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"  # where CUDA looks without CUDA_MPS_PIPE_DIRECTORY
# Volta and newer: at most 48 MPS clients per GPU (CUDA MPS documentation, "Limitations").
MAX_CLIENTS = 48

Runner = Callable[..., subprocess.CompletedProcess]


def run_tool(
    argv: list[str],
    input: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 10.0,
    detach: bool = False,
) -> subprocess.CompletedProcess:
    """An outside tool's output; a missing or hung tool reads as exit 127, never an exception.
    `detach`: a tool that leaves a daemon behind, which would hold captured pipes open; its
    output goes to /dev/null and only the exit code comes back."""
    try:
        if detach:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                timeout=timeout,
            )
            return subprocess.CompletedProcess(argv, done.returncode, "", "")
        return subprocess.run(
            argv, input=input, capture_output=True, text=True, env=env, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return subprocess.CompletedProcess(argv, 127, "", str(e))


def private_dirs() -> tuple[str, str]:
    """This user's own pipe and log directories for a daemon smollab starts (not yet made)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = runtime if runtime and os.path.isdir(runtime) else tempfile.gettempdir()
    root = os.path.join(base, f"smollab-mps-{os.getuid()}")
    return os.path.join(root, "pipe"), os.path.join(root, "log")


def make_private(path: str) -> str | None:
    """Make `path` (and its parent) a directory only this user can enter; None when it is, or
    the reason it cannot be (another user's directory of that name, say, in a shared /tmp)."""
    for d in (os.path.dirname(path), path):
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            st = os.lstat(d)
        except OSError as e:
            return f"cannot make {d} ({e.strerror})"
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return f"{d} is not a directory of this user's"
        if st.st_mode & 0o077:
            os.chmod(d, 0o700)
    return None


class MPS:
    def __init__(
        self,
        runner: Runner | None = None,
        which: Callable[[str], str | None] | None = None,
        pipe_dir: str | None = None,
        log_dir: str | None = None,
    ):
        """A daemon in `pipe_dir` / `log_dir`: by default the environment's, else this user's
        private ones (`private_dirs`)."""
        self.runner = runner or run_tool
        self.which = which or shutil.which
        own_pipe, own_log = private_dirs()
        self.pipe_dir = pipe_dir or os.environ.get(PIPE_VAR) or own_pipe
        self.log_dir = log_dir or os.environ.get(LOG_VAR) or own_log

    @classmethod
    def found_by_clients(cls, runner: Runner | None = None, which=None) -> MPS:
        """The daemon a CUDA process started from this environment would attach to: the one in
        CUDA_MPS_PIPE_DIRECTORY, else in CUDA's default /tmp/nvidia-mps."""
        return cls(runner, which, pipe_dir=os.environ.get(PIPE_VAR) or DEFAULT_PIPE_DIR)

    def env(self) -> dict[str, str]:
        """Variables clients (and the control tool) need to find this daemon: every child gets
        both, so none falls back to the shared defaults."""
        return {PIPE_VAR: self.pipe_dir, LOG_VAR: self.log_dir}

    def _control(self, command: str) -> subprocess.CompletedProcess:
        return self.runner([CONTROL], input=command + "\n", env={**os.environ, **self.env()})

    def available(self) -> bool:
        return self.which(CONTROL) is not None

    def is_running(self) -> bool:
        r = self._control("get_server_list")
        return r.returncode == 0 and "Cannot find" not in (r.stdout + r.stderr)

    def start(self, wait_s: float = 5.0) -> bool:
        """Start the daemon (`-d`, output to /dev/null: see the module docstring) in directories
        of this user's own, and wait until it answers. False when it does not."""
        for d in (self.pipe_dir, self.log_dir):
            if make_private(d) is not None:
                return False
        env = {**os.environ, **self.env()}
        r = self.runner([CONTROL, "-d"], env=env, detach=True)
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
        out(f"MPS: started the control daemon in {m.pipe_dir} (it will be stopped afterwards)")
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


def daemon_in_the_way(out: Callable[[str], None], mps: MPS | None = None) -> MPS | None:
    """With `mps: false` on CUDA: the daemon the runs attach to all the same (one running where
    this environment's CUDA processes look), said loudly; None when there is none. What such
    runs measure is MPS sharing, not time-slicing, and must be recorded as that."""
    m = mps or MPS.found_by_clients()
    if not m.available() or not m.is_running():
        return None
    out(
        f"MPS: WARNING: a control daemon is running ({PIPE_VAR}={m.pipe_dir}) and the runs "
        "attach to it although mps is false: they share the GPU through MPS, and are "
        "recorded as such"
    )
    return m


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
