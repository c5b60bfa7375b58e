"""The reaper: a tiny stdlib process that stops a parent's children once the parent is gone.

PR_SET_PDEATHSIG sends a child SIGINT when its parent dies, but a child stuck in C code (a
reward function, a deadlock, a collective) or one that ignores SIGINT would run on forever, and
an atexit hook never runs when the parent is SIGKILLed. So the first `children.launch` of a
process also starts this reaper (its own session, so a terminal Ctrl-C does not reach it). It
holds the read end of a pipe whose write end only the parent holds, and reads lines from it:

    + PGID START GRACE PDEATH   a child's process group (START: its /proc start time, 0 when
                                unknown; GRACE: seconds between SIGINT and SIGKILL; PDEATH: 1 if
                                the kernel already sends it SIGINT when the parent dies)
    - PGID                      that child has exited and was reaped by the parent

End of file means the parent is gone, however it died (the kernel closes its descriptors). The
reaper then SIGINTs each group the kernel did not already signal, waits up to its grace period,
SIGKILLs what is left and exits. A group whose leader pid now belongs to another process (a
different start time) is left alone. The reaper runs this file as a script (`python -I
reaper.py FD`), so it imports nothing from smollab and starts in milliseconds; the parent's end
is `Watcher`, used by `smollab.lab.children`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time


def start_time(pid: int) -> int:
    """The process's start time in clock ticks since boot (Linux), 0 when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def read_groups(fd: int) -> dict[int, tuple[int, float, bool]]:
    """Follow the parent's messages until end of file: the groups still registered."""
    groups: dict[int, tuple[int, float, bool]] = {}
    buf = b""
    while True:
        try:
            chunk = os.read(fd, 4096)
        except InterruptedError:
            continue
        if not chunk:
            return groups
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            parts = line.split()
            try:
                if parts[0] == b"+":
                    groups[int(parts[1])] = (int(parts[2]), float(parts[3]), parts[4] == b"1")
                elif parts[0] == b"-":
                    groups.pop(int(parts[1]), None)
            except (IndexError, ValueError):
                continue


def reap(groups: dict[int, tuple[int, float, bool]], poll: float = 0.1) -> None:
    """SIGINT (unless the kernel did), wait each group's grace, SIGKILL what is left."""
    now = time.monotonic()
    deadlines: dict[int, float] = {}
    for pgid, (start, grace, pdeath) in groups.items():
        leader = start_time(pgid)
        if start and leader and leader != start:
            continue  # the pid was reused: not our child
        if not pdeath:
            _signal(pgid, signal.SIGINT)
        deadlines[pgid] = now + grace
    while deadlines:
        now = time.monotonic()
        for pgid, deadline in list(deadlines.items()):
            if not _alive(pgid):
                del deadlines[pgid]
            elif now >= deadline:
                _signal(pgid, signal.SIGKILL)
                del deadlines[pgid]
        if deadlines:
            time.sleep(poll)


# ---- the parent's end ----------------------------------------------------------------------


class Watcher:
    """The parent's end of a reaper process: it registers each child's process group; closing
    the pipe (the parent exiting, or being killed) tells the reaper to stop them."""

    def __init__(self) -> None:
        read_fd, self.fd = os.pipe()  # both non-inheritable: no child holds the write end
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", __file__, str(read_fd)],
                pass_fds=(read_fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            os.close(self.fd)
            raise
        finally:
            os.close(read_fd)
        self.owner = os.getpid()
        self.groups: dict[int, str] = {}  # pgid -> its registration line

    def send(self, line: str) -> bool:
        try:
            os.write(self.fd, line.encode())
            return True
        except OSError:  # the reaper died
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


_WATCHER: Watcher | None = None


def current(replace: bool = False) -> Watcher | None:
    """This process's reaper, started on first use, and again when it died (`replace`: its pipe
    broke), taking over every group the old one watched. A forked process starts its own."""
    global _WATCHER
    old = _WATCHER
    mine = old is not None and old.owner == os.getpid()
    if mine and not replace and old.proc.poll() is None:
        return old
    groups = old.groups if mine else {}
    if mine:
        old.close()
    _WATCHER = None
    try:
        new = _WATCHER = Watcher()
    except OSError:
        return None
    for pgid, line in groups.items():
        new.groups[pgid] = line
        new.send(line)
    return new


def watch(watcher: Watcher | None, pid: int, grace: float, pdeath: bool) -> None:
    """Register a child (the leader of its own process group) with the reaper."""
    if watcher is None:
        return
    line = f"+ {pid} {start_time(pid)} {grace:g} {int(pdeath)}\n"
    watcher.groups[pid] = line
    if not watcher.send(line):
        current(replace=True)  # a new reaper takes over every registered group


def forget(pid: int) -> None:
    """The child has exited and been reaped: nothing left to stop."""
    w = _WATCHER
    if w is not None and w.owner == os.getpid() and w.groups.pop(pid, None) is not None:
        w.send(f"- {pid}\n")


def reaper_pid() -> int | None:
    """The pid of this process's reaper, if one runs (tests check it exits with the parent)."""
    w = _WATCHER
    return w.proc.pid if w is not None and w.owner == os.getpid() else None


# ---- the reaper ------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only the pipe's end of file stops the reaper
    reap(read_groups(int(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
