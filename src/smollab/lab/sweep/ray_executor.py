"""`executor: ray`: a sweep's trials on a Ray cluster, each the same `smollab` child as locally.

One Ray actor per concurrency slot is started once per sweep with a trial's resources (`ray.cpu`,
`ray.gpu`) and reused for every trial of that slot: Ray's start-up cost (an actor takes seconds)
is paid `concurrency` times, not once per trial. The actor launches the trial with
`children.launch`, on its node, in the driver's working directory and with the actor's own
environment (where Ray has set CUDA_VISIBLE_DEVICES) plus the driver's `SMOLLAB_*` variables, and
answers poll, interrupt (SIGINT), kill (SIGKILL) and peak RSS from there. `RayChild` is the
parent's handle with the interface of `children.Child`, so the scheduler prunes, times out,
retries and resumes exactly as it does locally.

Every node must see the sweep dir at the same path (a shared file system): the parent reads each
trial's metrics.csv and summary.json from it, as it does locally, and the trial's run directory is
its identity. Every node needs the same smollab installed (the actor's Python runs the child).
A parent that dies takes its actors with it (Ray kills a driver's actors); each actor's children
then get SIGINT from the kernel (PR_SET_PDEATHSIG) and SIGKILL from its reaper after
`stop_timeout_s`, so a rerun of the sweep settles and resumes them as it does locally.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smollab.errors import UserError
from smollab.lab import children as ch
from smollab.lab.sweep.spec import RayOptions, SweepSpec
from smollab.runs import CHILD_LOG

START_TIMEOUT_S = 300.0  # slots that Ray cannot place in this long (too few CPUs or GPUs): give up
CALL_TIMEOUT_S = 30.0  # an actor that answers no call in this long counts as still running
LOST = -1000  # the exit code of a trial whose actor (or node) died


class TrialSlot:
    """The Ray actor of one concurrency slot: runs one child process at a time on its node."""

    def __init__(self, cwd: str, env: dict[str, str], driver_python: str):
        os.chdir(cwd)  # relative paths in the spec mean what they mean to the driver
        os.environ.update(env)
        self.driver_python = driver_python
        self.child: ch.Child | None = None

    def ready(self) -> dict[str, Any]:
        import ray

        node = f"{socket.gethostname()}:{ray.get_runtime_context().get_node_id()[:8]}"
        return {"node": node, "pid": os.getpid(), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def launch(self, name: str, argv: list[str], run_dir: str, threads: int | None,
               grace: float) -> int:  # fmt: skip
        if argv and argv[0] == self.driver_python:  # this node's interpreter, same smollab
            argv = [sys.executable, *argv[1:]]
        # Ray's worker blocks SIGINT and a child inherits the mask: unblocked for the fork, or the
        # child would never see the SIGINT that stops it cleanly (pruning, a stopping sweep)
        mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        try:
            self.child = ch.launch(name, argv, Path(run_dir), threads=threads, grace=grace)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return self.child.pid

    def poll(self) -> int | None:
        return self.child.poll() if self.child else 0

    def interrupt(self, reason: str | None) -> None:
        if self.child:
            self.child.interrupt(reason)

    def kill(self) -> None:
        if self.child:
            self.child.kill()

    def peak_rss_mb(self) -> float | None:
        return self.child.peak_rss_mb() if self.child else None


@dataclass(eq=False)
class RayChild:
    """A trial running in a `TrialSlot`: what the scheduler uses of a `children.Child`."""

    name: str
    run_dir: Path
    threads: int | None
    pid: int
    slot: Slot
    started: float = field(default_factory=time.time)
    stop_reason: str | None = None
    stop_sent: float | None = None
    kill_sent: float | None = None
    code: int | None = None

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self.slot.actor, method).remote(*args), timeout=CALL_TIMEOUT_S)

    def poll(self) -> int | None:
        if self.code is not None:
            return self.code
        import ray

        try:
            code = self._call("poll")
        except ray.exceptions.GetTimeoutError:
            return None
        except ray.exceptions.RayActorError as e:
            self.slot.dead = True
            self._note(f"smollab: error: the Ray actor running this trial on {self.slot.node} "
                       f"died ({type(e).__name__})")  # fmt: skip
            code = LOST
        if code is not None:
            self.code = code
            self.slot.busy = False
        return code

    def _note(self, line: str) -> None:
        """The parent's words in the trial's child.log (its last line is the failure reason)."""
        with contextlib.suppress(OSError), open(self.run_dir / CHILD_LOG, "a") as f:
            f.write(line + "\n")

    def interrupt(self, reason: str | None = None) -> None:
        if self.stop_sent is None:
            self.stop_reason = reason
            self.stop_sent = time.time()
        self.slot.actor.interrupt.remote(reason)

    def kill(self) -> None:
        if self.kill_sent is None:
            self.kill_sent = time.time()
        self.slot.actor.kill.remote()

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = time.time() + (timeout if timeout is not None else math.inf)
        while (code := self.poll()) is None and time.time() < deadline:
            time.sleep(0.1)
        return code

    def peak_rss_mb(self) -> float | None:
        with contextlib.suppress(Exception):
            return self._call("peak_rss_mb")
        return None

    def last_output(self) -> float:
        return ch.Child.last_output(self)  # type: ignore[arg-type]  # reads run_dir and started


@dataclass(eq=False)
class Slot:
    actor: Any
    node: str = "?"
    busy: bool = False
    dead: bool = False
    child: RayChild | None = None


def trial_gpus(spec: SweepSpec, concurrency: int, device: str) -> float:
    """`ray.gpu`, or by default an equal share of one GPU per trial on CUDA (none elsewhere)."""
    if spec.ray is not None and spec.ray.gpu is not None:
        return spec.ray.gpu
    return 1.0 / concurrency if device == "cuda" else 0.0


class RayExecutor:
    """Connects to the cluster and starts the sweep's slots; `launch` runs a trial in a free one."""

    def __init__(self, spec: SweepSpec, concurrency: int, device: str, say=print):
        try:
            import ray
        except ImportError:
            raise UserError(
                "sweep key executor: ray needs the ray package: pip install 'smollab[ray]'"
            ) from None
        opts = spec.ray or RayOptions()
        self.cpu, self.gpu = opts.cpu, trial_gpus(spec, concurrency, device)
        self.say = say
        self.owns = not ray.is_initialized()
        t0 = time.time()
        if self.owns:
            try:
                ray.init(address=opts.address, logging_level=logging.WARNING)
            except (ConnectionError, ValueError, RuntimeError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise UserError(f"sweep key ray.address: no Ray cluster at {opts.address} "
                                f"({first[:200]}); start one with `ray start --head`") from None  # fmt: skip
        self.init_s = time.time() - t0
        env = {k: v for k, v in os.environ.items() if k.startswith("SMOLLAB_")}
        self._remote = ray.remote(TrialSlot).options(num_cpus=self.cpu, num_gpus=self.gpu)
        self._args = (os.getcwd(), env, sys.executable)
        t0 = time.time()
        self.slots = [Slot(self._remote.remote(*self._args)) for _ in range(concurrency)]
        self._wait_ready(self.slots)
        self.actors_s = time.time() - t0
        nodes = sorted({s.node for s in self.slots})
        say(f"ray: {len(self.slots)} trial slot(s) of {self.cpu:g} CPU, {self.gpu:g} GPU on "
            f"{', '.join(nodes)} (connect {self.init_s:.1f} s, actors {self.actors_s:.1f} s)")  # fmt: skip

    def _wait_ready(self, slots: list[Slot]) -> None:
        import ray

        try:
            infos = ray.get([s.actor.ready.remote() for s in slots], timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            have = ray.available_resources()
            self.close()
            raise UserError(f"sweep key ray: {len(slots)} trial slot(s) of cpu={self.cpu:g}, "
                            f"gpu={self.gpu:g} not placed in {START_TIMEOUT_S:g} s; the cluster "
                            f"has CPU {have.get('CPU', 0):g}, GPU {have.get('GPU', 0):g} "
                            f"free") from None  # fmt: skip
        for s, info in zip(slots, infos, strict=True):
            s.node = info["node"]

    @property
    def trial_threads(self) -> int:
        """A trial's CPU threads, however many others run: what its slot reserves."""
        return max(1, math.ceil(self.cpu))

    def cpu_threads(self, concurrency: int) -> int:
        """CPU threads all the trials use (the sweep's log and sweep.json)."""
        return self.trial_threads * concurrency

    def _free_slot(self) -> Slot:
        import ray

        for s in self.slots:
            if not s.busy and not s.dead:
                return s
        # A slot whose actor died, or whose child survived SIGKILL and was given up on (the
        # scheduler launches only into a free slot): a fresh actor in its place.
        given_up = [s for s in self.slots if s.child and s.child.kill_sent is not None]
        old = next((s for s in self.slots if s.dead), None) or (given_up or self.slots)[0]
        with contextlib.suppress(Exception):
            ray.kill(old.actor)
        new = Slot(self._remote.remote(*self._args))
        self._wait_ready([new])
        self.slots[self.slots.index(old)] = new
        return new

    def launch(self, name: str, argv: list[str], run_dir: Path, threads: int | None = None,
               env: dict[str, str] | None = None, grace: float = 60.0) -> RayChild:  # fmt: skip
        """`children.launch` on a free slot's node. `env` (the local executor's) is not used:
        a trial gets its node's environment."""
        import ray

        slot = self._free_slot()
        run_dir = Path(run_dir).absolute()
        pid = ray.get(slot.actor.launch.remote(name, argv, str(run_dir), threads, grace),
                      timeout=CALL_TIMEOUT_S)  # fmt: skip
        slot.busy = True
        slot.child = RayChild(name=name, run_dir=run_dir, threads=threads, pid=pid, slot=slot)
        return slot.child

    def close(self) -> None:
        """Ends the slots (each one's child first, by its reaper) and leaves the cluster."""
        import ray

        for s in self.slots if hasattr(self, "slots") else []:
            with contextlib.suppress(Exception):
                ray.kill(s.actor)
        if self.owns and ray.is_initialized():
            ray.shutdown()
