"""Warm trial starts: a fork server (zygote) that has imported torch, transformers, peft and
smollab's loops once, and forks each trial from there instead of starting a fresh interpreter.

Why: a micro trial spent about 6 s of a 7 s start importing (torch 2.6 s, peft 3.3 s,
transformers 0.9 s) before its first step, on every trial of a sweep; a fork of a warm process
reaches the same step in a fraction of a second (`benchmarks/trial_start.py`).

The server runs this file as a module (`python -m smollab.lab.zygote REQ STATUS MODULES...`) in
its own session, and imports the MODULES named on its command line, by name: the sweep parent
never imports a loop, the server is a trial in waiting. It reads one JSON request per line from
the pipe REQ, whose write end only the parent holds (end of file: the parent is gone, however
it died, and the server exits), and writes one line per event to STATUS:

    ready SECONDS        the modules are imported (once, first)
    fail MESSAGE         they could not be (then it exits)
    p PID                a trial was forked (the answer to a fork request)
    e MESSAGE            a fork request refused (the answer to it)
    x PID CODE           trial PID exited (CODE as `subprocess.Popen.returncode`)

A trial's exit is seen with `waitid(WNOWAIT)` and reaped only once the parent has read it (the
parent's `{"reap": PID}`), so its pid stays reserved, as a `Popen` child's does, until the parent
knows it is gone and no signal the parent sends can reach a reused pid.

A forked trial is its own process with its own pid, session and process group, and starts from
a state a fresh interpreter would have, as far as a trial can tell (`become_trial`): a new
session; every signal handler back to Python's defaults and no signal blocked; stdin on
/dev/null, stdout and stderr appended to its log; every other inherited descriptor closed; the
request's cwd and environment; its CPU affinity and torch's thread count. What a preloaded
library read from the environment at import (huggingface_hub's HF_HUB_OFFLINE and HF_HOME, for
one) is the server's, started with the sweep's environment, which a trial's extends only with
smollab's own variables, thread counts (set again here) and the MPS daemon's (read by CUDA, which
initializes in the trial). RNG: Python's `random`
is reseeded by `os.fork` itself; torch's and numpy's global streams are inherited, and every loop
seeds torch from `run.seed` before it draws (`torch.manual_seed(cfg.run.seed)`), as a cold trial
depends on too. It then runs its command line as the interpreter would (`-m`, `-c` or a script
of this interpreter; anything else is exec'ed), and exits as the interpreter would: threads
joined, atexit handlers run, an uncaught KeyboardInterrupt as death by SIGINT.

CUDA: the server never initializes it. Importing torch does not, the server runs no tensor code,
and before every fork it checks `torch.cuda.is_initialized()` and refuses the fork (`e ...`) if
something did: a CUDA context does not survive a fork (torch then refuses CUDA in the child).
It also refuses while a Python thread other than its own runs (a fork copies only the calling
thread; a lock another held would stay locked). The native OpenBLAS threads numpy and scipy start
on import shut themselves down around a fork (OpenBLAS's own `pthread_atfork` handler). macOS:
fork without exec after importing Apple's frameworks (Metal, Accelerate) is unsafe, which is why
Python's multiprocessing spawns there by default; sweeps start trials cold there
(`smollab.lab.sweep.resources`).

Python's `multiprocessing.forkserver` does the same fork (a server that preloads modules, the
child's exit code sent back over a pipe), but it runs a pickled `Process` target through
multiprocessing's bootstrap rather than a command line, ignores a preload that fails to import
(a trial would then start cold unnoticed), and is one server per process behind a socket. This
one is started per sweep, says when its imports fail, and hands back a `Popen`-like handle.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# ---- the server ---------------------------------------------------------------------------------


def _write(fd: int, line: str) -> None:
    with contextlib.suppress(BrokenPipeError):  # the parent is gone: its end of file follows
        os.write(fd, (line.replace("\n", " ") + "\n").encode())


def fork_problem() -> str | None:
    """Why this process must not fork a trial now, or None."""
    import threading

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA was initialized in the warm start server: a forked trial could not use it"
    if threading.active_count() > 1:
        return f"the warm start server runs {threading.active_count()} Python threads"
    return None


def _reset_signals() -> None:
    """What a fresh interpreter has: SIGINT raises KeyboardInterrupt, SIGPIPE and SIGXFSZ are
    ignored, every other signal does its default, and none is blocked."""
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGPIPE", "SIGXFSZ"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)


def become_trial(req: dict) -> None:
    """In the forked child: leave the server's state behind (see the module docstring)."""
    os.setsid()
    _reset_signals()
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(req["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.closerange(3, os.sysconf("SC_OPEN_MAX") if hasattr(os, "sysconf") else 65536)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    if req.get("cpus"):
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setaffinity(0, req["cpus"])
    torch = sys.modules.get("torch")
    if req.get("threads") and torch is not None:  # OMP_NUM_THREADS was read at torch's import
        torch.set_num_threads(int(req["threads"]))


def run_argv(argv: Sequence[str]) -> None:
    """Run `argv` in this process as the interpreter would run it: `-m MODULE`, `-c CODE` or a
    script of this same interpreter; any other command line is exec'ed."""
    import runpy

    args = list(argv[1:])
    same = bool(args) and os.path.realpath(argv[0]) == os.path.realpath(sys.executable)
    if same and args[0] == "-m" and len(args) > 1:
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif same and args[0] == "-c" and len(args) > 1:
        sys.argv = ["-c", *args[2:]]
        sys.path[0] = ""
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
    elif same and not args[0].startswith("-"):
        sys.argv = args
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(args[0], run_name="__main__")
    else:
        os.execvpe(argv[0], list(argv), dict(os.environ))


def trial_main(req: dict) -> None:
    """The forked child's whole life; never returns."""
    import atexit
    import threading
    import traceback

    code, by_signal = 1, False
    try:
        become_trial(req)
        code = 0
        run_argv(req["argv"])
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        by_signal = True
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # as the interpreter does at exit (and multiprocessing's children)
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if by_signal:  # as the interpreter exits on an uncaught KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        os._exit(code & 0xFF if code >= 0 else 1)


def _exit_code(info: os.waitid_result) -> int:
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status  # killed or dumped: the signal, as Popen.returncode


def serve(req_fd: int, out_fd: int, modules: Sequence[str]) -> int:
    import importlib

    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only the request pipe's end of file stops it
    t0 = time.perf_counter()
    try:
        for name in modules:
            importlib.import_module(name)
    except BaseException as e:
        _write(out_fd, f"fail importing {name}: {type(e).__name__}: {e}")
        return 1
    _write(out_fd, f"ready {time.perf_counter() - t0:.2f}")
    unreported: set[int] = set()
    buf = b""
    while True:
        ready, _, _ = select.select([req_fd], [], [], 0.05)
        if ready:
            chunk = os.read(req_fd, 1 << 16)
            if not chunk:
                return 0  # the parent is gone
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                req = json.loads(line)
                if "reap" in req:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(int(req["reap"]), 0)
                    continue
                problem = fork_problem()
                if problem:
                    _write(out_fd, f"e {problem}")
                    continue
                pid = os.fork()
                if pid == 0:
                    trial_main(req)
                unreported.add(pid)
                _write(out_fd, f"p {pid}")
        for pid in list(unreported):
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                unreported.discard(pid)
                continue
            if info is not None:
                unreported.discard(pid)
                _write(out_fd, f"x {pid} {_exit_code(info)}")


# ---- the parent's end ---------------------------------------------------------------------------

# What a sweep's server imports: the libraries and every loop a trial's command may run.
WARM_MODULES: tuple[str, ...] = (
    "torch",
    "transformers",
    "peft",
    "smollab.cli",
    "smollab.train.pretrain",
    "smollab.train.grpo.run",
    "smollab.train.sft",
    "smollab.train.rft",
)


class ZygoteError(RuntimeError):
    """The server could not start, refused a fork, or died."""


class Zygote:
    """The parent's end of a warm start server: `launch` forks a trial and returns a `WarmProc`,
    a handle with `subprocess.Popen`'s pid, poll, wait and send_signal."""

    def __init__(
        self,
        modules: Sequence[str] | None = None,
        env: dict[str, str] | None = None,
        log: Path | None = None,
    ) -> None:
        modules = WARM_MODULES if modules is None else modules
        req_r, self._req = os.pipe()  # both ends non-inheritable: only the server gets req_r
        self._st, st_w = os.pipe()
        server_env = dict(os.environ if env is None else env)
        server_env["PYTHONUNBUFFERED"] = "1"  # a trial's stdout object is made here, at start
        # numpy's and scipy's OpenBLAS size their pools at import, from here; torch's threads are
        # set per trial. One thread each keeps a trial's numpy off its siblings' cores.
        server_env["OPENBLAS_NUM_THREADS"] = "1"
        server_env.setdefault("TOKENIZERS_PARALLELISM", "false")  # as `children.launch` sets it
        out = open(log, "ab") if log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "smollab.lab.zygote", str(req_r), str(st_w), *modules],
                pass_fds=(req_r, st_w),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=server_env,
                start_new_session=True,
            )
        except BaseException:
            os.close(self._req)
            os.close(self._st)
            raise
        finally:
            os.close(req_r)
            os.close(st_w)
            if log:
                out.close()
        self._buf = b""
        self._answers: list[str] = []  # p/e/ready/fail lines not yet taken
        self.exits: dict[int, int] = {}  # pid -> code, read but not yet taken by its WarmProc
        self.import_s: float | None = None
        self.gone: str | None = None  # why the server is gone, once it is

    @property
    def pid(self) -> int:
        return self.proc.pid

    def died(self) -> str | None:
        """Why the server is gone (`(pid N) died (signal 9)`), else None; reads its news."""
        self._pump(0)
        return self.gone

    def _pump(self, timeout: float) -> None:
        """Read what the server has said within `timeout` seconds."""
        if self.gone:
            return
        ready, _, _ = select.select([self._st], [], [], max(timeout, 0.0))
        if not ready:
            return
        chunk = os.read(self._st, 1 << 16)
        if not chunk:
            self.proc.wait()
            code = self.proc.returncode
            how = f"signal {-code}" if code < 0 else f"exit code {code}"
            self.gone = f"(pid {self.pid}) died ({how})"
            return
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace")
            if text.startswith("x "):
                _, pid, code = text.split()
                self.exits[int(pid)] = int(code)
                with contextlib.suppress(ZygoteError):  # a dead server's end of file follows
                    self._send({"reap": int(pid)})
            else:
                self._answers.append(text)

    def _answer(self, timeout: float | None) -> str:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._answers:
            if self.gone:
                raise ZygoteError(f"the warm start server {self.gone}")
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise ZygoteError(f"the warm start server did not answer in {timeout:g} s")
            self._pump(min(left, 1.0))
        return self._answers.pop(0)

    def _send(self, req: dict) -> None:
        data = (json.dumps(req) + "\n").encode()
        try:
            while data:
                data = data[os.write(self._req, data) :]
        except OSError as e:
            raise ZygoteError(f"the warm start server (pid {self.pid}) is gone ({e})") from e

    def ready(self, timeout: float | None = None) -> float:
        """Wait until the server has imported its modules; seconds its imports took."""
        if self.import_s is None:
            line = self._answer(timeout)
            if not line.startswith("ready "):
                raise ZygoteError(f"the warm start server failed: {line.removeprefix('fail ')}")
            self.import_s = float(line.split()[1])
        return self.import_s

    def launch(
        self,
        argv: Sequence[str],
        log: Path,
        env: dict[str, str],
        threads: int | None = None,
        cpus: Sequence[int] | None = None,
    ) -> WarmProc:
        """Fork a trial running `argv` (in this process's cwd), output appended to `log`."""
        self.ready()
        req = {
            "argv": list(argv),
            "log": str(Path(log).absolute()),
            "env": env,
            "cwd": os.getcwd(),
            "threads": threads,
            "cpus": list(cpus) if cpus else None,
        }
        self._send(req)
        line = self._answer(60.0)
        if not line.startswith("p "):
            raise ZygoteError(f"the warm start server refused a trial: {line.removeprefix('e ')}")
        return WarmProc(self, int(line.split()[1]), list(argv))

    def close(self) -> None:
        """End the server (its end of file) and wait for it; trials still running are left to
        their parent's stop and the reaper."""
        with contextlib.suppress(OSError):
            os.close(self._req)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        with contextlib.suppress(OSError):
            os.close(self._st)
        self.gone = self.gone or f"(pid {self.pid}) was closed"


def _running(pid: int, start: int) -> bool:
    """The process `pid` (started at `start`, 0 if unknown) exists and is not a zombie."""
    from smollab.lab.reaper import start_time

    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # gone (warm starts run on Linux, which has /proc)
        return False
    if start and start_time(pid) != start:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


class WarmProc:
    """A forked trial as its parent sees it: `subprocess.Popen`'s pid, returncode, poll, wait
    and send_signal. Its exit code comes from the server; if the server died first, the trial
    is an orphan whose code nobody can read: it is 255 once the process is gone (as
    multiprocessing's forkserver says), and its run directory says how it ended."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]) -> None:
        from smollab.lab.reaper import start_time

        self.zygote = zygote
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._start = start_time(pid)

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote._pump(0)
            self._take()
        return self.returncode

    def _take(self) -> None:
        code = self.zygote.exits.pop(self.pid, None)
        if code is not None:
            self.returncode = code
        elif self.zygote.gone and not _running(self.pid, self._start):
            self.returncode = 255

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = 0.1 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            if self.zygote.gone:
                time.sleep(min(left, 0.1))
            else:
                self.zygote._pump(min(left, 0.1))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]))
