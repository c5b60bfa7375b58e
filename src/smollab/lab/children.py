"""Child `smollab` processes: launch, divide CPU threads, tail metrics.csv, stop cleanly, no orphans.

Each child runs in its own session (process group), so a Ctrl-C in the terminal reaches only the
parent, which then stops the children in order: SIGINT (a run saves its state and writes status
`interrupted`), then SIGKILL after a grace period. On Linux each child also asks the kernel for a
SIGINT when its parent dies (PR_SET_PDEATHSIG), and a reaper process (`smollab.lab.reaper`)
started with the first child SIGKILLs, after the grace period, any child still alive once the
parent is gone however it died (a child stuck in C code ignores SIGINT); an atexit hook stops
whatever is left when the parent exits any other way. Every child writes its pid and host to
`<run_dir>/.child.pid`, so a rerun can wait for a straggler before reusing the directory. Every
child is marked as a lab child (`LAB_CHILD_ENV`): it competes with its siblings, so it reads the
CPU matmul peak its parent measured and never measures one itself (`smollab.device.mfu`).
"""

from __future__ import annotations

import atexit
import contextlib
import csv
import io
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from smollab.device.mfu import LAB_CHILD_ENV
from smollab.lab import reaper
from smollab.lab.zygote import WarmProc, Zygote
from smollab.rundir.atomic import atomic_write_text
from smollab.rundir.runs import CHILD_LOG, CHILD_PID, RunView


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def split_threads(total: int, n: int) -> list[int]:
    """`total` threads fairly over `n` processes (at least one each): 5 over 2 -> [3, 2]."""
    if n <= 0:
        return []
    base, extra = divmod(max(total, n), n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def smollab_argv(command: str, base: str | None, overrides: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "smollab", command, *([base] if base else []), *overrides]


def lanes_argv(args: Sequence[str]) -> list[str]:
    """`smollab lanes ARGS...`: a lanes worker (the sweep's executor lanes, the probe's lane
    counts); one place, so tests can start a fake worker instead."""
    return [sys.executable, "-m", "smollab", "lanes", *args]


def _pdeathsig(parent: int):
    """preexec_fn: SIGINT this child when the parent dies (Linux); None elsewhere.

    libc is loaded here, in the parent: nothing may be imported between fork and exec.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def set_it() -> None:
        prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return set_it


@dataclass
class Child:
    """One running child process and what the parent knows about it."""

    name: str
    run_dir: Path
    argv: list[str]
    threads: int | None
    proc: subprocess.Popen | WarmProc
    started: float = field(default_factory=time.time)
    stop_reason: str | None = None  # why the parent asked it to stop (prune, sweep stopping)
    stop_sent: float | None = None
    kill_sent: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        code = self.proc.poll()
        if code is not None:
            _LIVE.discard(self)
            reaper.forget(self.pid)
            with contextlib.suppress(OSError):
                (self.run_dir / CHILD_PID).unlink()
        return code

    def interrupt(self, reason: str | None = None) -> None:
        """Ask the child to stop cleanly (SIGINT to its process group)."""
        if self.stop_sent is None:
            self.stop_reason = reason
            self.stop_sent = time.time()
        _signal_group(self.proc, signal.SIGINT)

    def kill(self) -> None:
        if self.kill_sent is None:
            self.kill_sent = time.time()
        _signal_group(self.proc, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int | None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        return self.poll()

    def peak_rss_mb(self) -> float | None:
        return peak_rss_mb(self.pid)

    def pss_mb(self) -> float | None:
        return pss_mb(self.pid)

    def last_output(self) -> float:
        """When the child last wrote to its run dir (a file created or renamed there, metrics.csv,
        the logs), or when it started: what tells a silent hang from slow progress."""
        latest = self.started
        view = RunView(self.run_dir)
        for p in (self.run_dir, view.metrics_path, view.log_path, self.run_dir / CHILD_LOG):
            with contextlib.suppress(OSError):
                latest = max(latest, p.stat().st_mtime)
        return latest

    def __hash__(self) -> int:
        return id(self)


_LIVE: set[Child] = set()


def _signal_group(proc: subprocess.Popen | WarmProc, sig: int) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError, AttributeError):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def launch(
    name: str,
    argv: list[str],
    run_dir: Path,
    threads: int | None = None,
    env: dict[str, str] | None = None,
    cpus: Sequence[int] | None = None,
    grace: float = 60.0,
    log_name: str = CHILD_LOG,
    zygote: Zygote | None = None,
) -> Child:
    """Start `argv` in its own session; stdout and stderr append to `<run_dir>/<log_name>`
    (child.log; a lanes worker's is its inbox's worker.log).

    `grace`: seconds the reaper leaves the child between SIGINT and SIGKILL once this process
    is gone. `zygote`: fork the child from that warm start server instead of starting a fresh
    interpreter (`smollab.lab.zygote`); it is the same process for everything here. Its parent is
    the server, so the kernel sends it nothing when this process dies: the reaper's SIGINT does."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("TOKENIZERS_PARALLELISM", "false")
    child_env["PYTHONUNBUFFERED"] = "1"
    child_env[LAB_CHILD_ENV] = "1"  # reads the CPU peak its parent measured, never measures
    if threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            child_env[var] = str(threads)
    with open(run_dir / log_name, "ab") as log:
        log.write(f"\n$ {' '.join(argv)}\n".encode())
    watcher = reaper.current()  # before the child, so that it never outlives us unwatched
    if zygote is not None:
        proc = zygote.launch(argv, run_dir / log_name, child_env, threads=threads, cpus=cpus)
        return _started(name, run_dir, argv, threads, proc, watcher, grace, pdeath=False)
    parent = os.getpid()
    pdeath = _pdeathsig(parent)

    def preexec() -> None:
        if pdeath:
            pdeath()
        if cpus:
            with contextlib.suppress(AttributeError, OSError):
                os.sched_setaffinity(0, cpus)

    with open(run_dir / log_name, "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_env,
            start_new_session=True,
            preexec_fn=preexec if (pdeath or cpus) else None,
        )
    return _started(name, run_dir, argv, threads, proc, watcher, grace, pdeath is not None)


def _started(
    name: str,
    run_dir: Path,
    argv: list[str],
    threads: int | None,
    proc: subprocess.Popen | WarmProc,
    watcher: reaper.Watcher | None,
    grace: float,
    pdeath: bool,
) -> Child:
    """Register a started child: with the reaper, for `stop_all` at exit, and in its run dir."""
    child = Child(name=name, run_dir=run_dir, argv=argv, threads=threads, proc=proc)
    _LIVE.add(child)
    reaper.watch(watcher, proc.pid, grace, pdeath)
    with contextlib.suppress(OSError):
        atomic_write_text(run_dir / CHILD_PID, f"{proc.pid}\n{socket.gethostname()}\n")
    return child


def stop_all(
    children: Sequence[Child],
    timeout: float = 60.0,
    reason: str | None = None,
    kill_now: bool = False,
) -> None:
    """SIGINT every child, wait up to `timeout` seconds, SIGKILL the rest."""
    for c in children:
        if kill_now:
            c.kill()
        else:
            c.interrupt(reason)
    deadline = time.time() + timeout
    for c in children:
        if c.wait(max(0.0, deadline - time.time())) is None:
            c.kill()
            c.wait(10)


@atexit.register
def _kill_leftovers() -> None:
    """Last line of defence: no child outlives the parent."""
    leftovers = [c for c in list(_LIVE) if c.proc.poll() is None]
    if leftovers:
        stop_all(leftovers, timeout=10.0)


def last_log_line(run_dir: Path, log_name: str = CHILD_LOG) -> str:
    """The child's last words (an error line or the end of a traceback)."""
    try:
        text = (Path(run_dir) / log_name).read_text(errors="replace")
    except OSError:
        return "no child log"
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("$ ")]
    errors = [ln for ln in lines if ln.startswith("smollab: error:") or "Error" in ln.split(":")[0]]
    return (errors or lines or ["child exited without output"])[-1][:300]


# ---- stale children of a dead parent --------------------------------------------------------


def pid_alive(pid: int, must_contain: str | None = None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if must_contain is not None:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return True  # no /proc: trust the pid
        if must_contain in cmdline:
            return True
        # A trial forked from a warm start server has the server's command line; its stdout is
        # its child.log in its run dir, as a cold child's is.
        with contextlib.suppress(OSError):
            return must_contain in os.readlink(f"/proc/{pid}/fd/1")
        return False
    return True


REMOTE_MARGIN_S = 10.0  # beyond its grace: a child on another host is surely gone by then
_first_stale: float | None = None  # this process's first look at a stale child on another host


def reap_stale(run_dir: Path, timeout: float = 60.0, parent_gone: float | None = None) -> bool:
    """If a previous parent's child still runs in `run_dir`, stop it and wait. True if one did.

    A child on another host (executor ray) cannot be seen from here. Its parent (a Ray actor)
    died at `parent_gone`, by default before this process first looked at such a child (with
    the previous sweep process), so its reaper SIGKILLed it `timeout` (its grace) after that at
    the latest: we wait until then, plus a margin (once for all of a previous sweep's)."""
    global _first_stale
    pidfile = Path(run_dir) / CHILD_PID
    try:
        pid_line, *rest = pidfile.read_text().split()
        pid = int(pid_line)
    except (OSError, ValueError):
        return False
    if rest and rest[0] != socket.gethostname():
        if parent_gone is None:
            parent_gone = _first_stale = _first_stale or time.time()
        time.sleep(max(0.0, parent_gone + timeout + REMOTE_MARGIN_S - time.time()))
        with contextlib.suppress(OSError):
            pidfile.unlink()
        return True
    if not pid_alive(pid, must_contain=str(run_dir)):
        with contextlib.suppress(OSError):
            pidfile.unlink()
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGINT)
    deadline = time.time() + timeout
    while time.time() < deadline and pid_alive(pid, must_contain=str(run_dir)):
        time.sleep(0.2)
    if pid_alive(pid, must_contain=str(run_dir)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        time.sleep(0.2)
    with contextlib.suppress(OSError):
        pidfile.unlink()
    return True


def peak_rss_mb(pid: int) -> float | None:
    """Peak resident memory of a live process (Linux /proc), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def pss_mb(pid: int) -> float | None:
    """Proportional set size of a live process now (Linux /proc smaps_rollup), in MiB: its private
    pages plus each shared page divided by the processes sharing it. Unlike the peak RSS it adds
    up across processes, so it is a warm child's memory (forked from a server whose pages it
    shares until it writes them): k children and their server use the sum of their PSS."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# ---- tailing metrics.csv ---------------------------------------------------------------------


def first_row_s(rows: list[dict[str, float | None]], mtime: float | None, launched: float) -> float:
    """Seconds from a trial's launch to its first logged step, from the first time its metrics
    show rows: the file's mtime is when the last of them was written, and their own `wall_s`
    clock says how long after the first (a poll can see several rows at once). Without an mtime
    or `wall_s`, the poll's own time bounds it from above."""
    t = mtime if mtime is not None else time.time()
    first, last = rows[0].get("wall_s"), rows[-1].get("wall_s")
    if mtime is not None and first is not None and last is not None:
        t -= last - first
    return max(t - launched, 0.0)


class MetricsTail:
    """Rows of a growing metrics.csv: re-read when the file changes; a half-written last line is
    left for the next read. A resumed run rewrites the file (rows after its checkpoint dropped),
    which shows up as a different inode or a smaller size and is simply read again."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._sig: tuple | None = None
        self.rows: list[dict[str, float | None]] = []
        self.mtime: float | None = None  # the file's mtime (time.time()) when last read

    def read(self) -> list[dict[str, float | None]]:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return self.rows
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        if sig == self._sig:
            return self.rows
        try:
            text = self.path.read_text()
        except OSError:
            return self.rows
        complete = text[: text.rfind("\n") + 1]
        rows = []
        for r in csv.DictReader(io.StringIO(complete)):
            try:
                rows.append(
                    {k: (float(v) if v not in ("", None) else None) for k, v in r.items() if k}
                )
            except ValueError:
                continue
        self._sig = sig
        self.rows = rows
        self.mtime = st.st_mtime
        return rows

    def invalidate(self) -> None:
        """Make the next read() take the file whole even if its size and mtime look unchanged: a
        final read once the writer has stopped (a rewrite within the clock's resolution can keep
        both), e.g. the probe's count of logged steps."""
        self._sig = None


# ---- Ctrl-C as a flag ------------------------------------------------------------------------


class StopFlag:
    """SIGINT, SIGTERM and SIGHUP set a flag instead of raising at an arbitrary line, so the
    parent stops its children in order and never leaves a half-written study record. The
    count tells a second Ctrl-C (stop now) from the first (stop cleanly)."""

    def __init__(self) -> None:
        self.count = 0
        self.signal: int | None = None
        self._old: dict[int, object] = {}

    def __bool__(self) -> bool:
        return self.count > 0

    def _handler(self, signum, frame) -> None:
        self.count += 1
        self.signal = signum

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopFlag]:
        sigs = [signal.SIGINT, signal.SIGTERM] + (
            [signal.SIGHUP] if hasattr(signal, "SIGHUP") else []
        )
        for s in sigs:
            with contextlib.suppress(ValueError):  # not the main thread
                self._old[s] = signal.signal(s, self._handler)
        try:
            yield self
        finally:
            for s, old in self._old.items():
                signal.signal(s, old)
            self._old.clear()
