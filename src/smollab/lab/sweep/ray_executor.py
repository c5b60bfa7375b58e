"""`executor: ray`: a sweep's trials on a Ray cluster, each the same `smollab` child as locally.

Without `ray.address` the sweep starts a Ray of its own on this machine (as Ray Tune's
`ray.init()` does when no cluster is given) and stops it when it ends, so `executor: ray` runs on
one machine with nothing started by hand; `address: auto` joins the cluster running here (`ray
start --head`), `host:port` or `ray://...` a remote one, and RAY_ADDRESS, when set, names it.

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

Nothing waits on Ray mid-sweep: a dead slot gets a fresh actor that takes trials once Ray places
it (`can_launch`), so a lost node on a full cluster means fewer trials at once, not a stall; a
trial whose slot fails to launch it goes to another slot.
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
from smollab.rundir.runs import CHILD_LOG

START_TIMEOUT_S = 300.0  # slots that Ray cannot place in this long (too few CPUs or GPUs): give up
CALL_TIMEOUT_S = 30.0  # an actor that answers no call in this long counts as still running
POLL_WAIT_S = 1.0  # a poll waits this long for its actor's answer (a lost node answers nothing)
LOST = -1000  # the exit code of a trial whose actor (or node) died


class TrialSlot:
    """The Ray actor of one concurrency slot: runs one child process at a time on its node."""

    def __init__(self, cwd: str, env: dict[str, str], driver_python: str):
        self.error: str | None = None  # told by ready(), with the node, not as a raw traceback
        try:
            os.chdir(cwd)  # relative paths in the spec mean what they mean to the driver
        except OSError as e:
            self.error = f"has no directory {cwd} ({e.strerror})"
        os.environ.update(env)
        self.driver_python = driver_python
        self.child: ch.Child | None = None

    def ready(self) -> dict[str, Any]:
        import ray

        node = f"{socket.gethostname()}:{ray.get_runtime_context().get_node_id()[:8]}"
        return {
            "node": node,
            "pid": os.getpid(),
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "error": self.error,
        }

    def launch(
        self, name: str, argv: list[str], run_dir: str, threads: int | None, grace: float
    ) -> int:
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
    slot: Slot | None  # None: no slot could start it (`code` is LOST)
    started: float = field(default_factory=time.time)
    stop_reason: str | None = None
    stop_sent: float | None = None
    kill_sent: float | None = None
    code: int | None = None
    _poll: Any = None  # the poll call the actor has not answered yet

    def _call(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self.slot.actor, method).remote(*args), timeout=CALL_TIMEOUT_S)

    def poll(self) -> int | None:
        """The exit code, or None while it runs; waits at most POLL_WAIT_S for the actor."""
        if self.code is not None:
            return self.code
        import ray

        if self._poll is None:
            self._poll = self.slot.actor.poll.remote()
        if not ray.wait([self._poll], timeout=POLL_WAIT_S)[0]:
            return None  # asked again next time (a lost node's actor dies in Ray's eyes soon)
        ref, self._poll = self._poll, None
        try:
            code = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            self.slot.dead = True
            self._note(
                f"smollab: error: the Ray actor running this trial on {self.slot.node} "
                f"died ({type(e).__name__})"
            )
            code = LOST
        if code is not None:
            self.code = code
            self.slot.busy = False
        return code

    def _note(self, line: str) -> None:
        """The parent's words in the trial's child.log (its last line is the failure reason)."""
        with contextlib.suppress(OSError):
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with open(self.run_dir / CHILD_LOG, "a") as f:
                f.write(line + "\n")

    def interrupt(self, reason: str | None = None) -> None:
        if self.stop_sent is None:
            self.stop_reason = reason
            self.stop_sent = time.time()
        if self.code is None:
            self.slot.actor.interrupt.remote(reason)

    def kill(self) -> None:
        if self.kill_sent is None:
            self.kill_sent = time.time()
        if self.code is None:
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
    ready: Any = None  # the actor's ready() call, until Ray answers it: the actor is not placed
    since: float = field(default_factory=time.time)
    node: str = "?"
    busy: bool = False
    dead: bool = False
    child: RayChild | None = None

    @property
    def free(self) -> bool:
        return not (self.busy or self.dead or self.ready is not None)


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
        self.slots: list[Slot] = []
        self.owns = not ray.is_initialized()  # else the caller's Ray, left connected
        self.local = False
        t0 = time.time()
        if self.owns:
            # Ray replaces builtins.print in the driver once a tqdm_ray bar reaches it: keep this
            # process's print (the sweep's own output, and the user's in API use) untouched
            os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")
            self.local = opts.address is None and not os.environ.get("RAY_ADDRESS")
            try:
                if self.local:  # this machine alone: a Ray of its own, ended with the sweep
                    ray.init(
                        address="local", include_dashboard=False, logging_level=logging.WARNING
                    )
                else:  # a cluster someone started: joined, and left as it was
                    ray.init(address=opts.address, logging_level=logging.WARNING)
            except (ConnectionError, ValueError, RuntimeError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                if self.local:
                    raise UserError(
                        f"sweep key executor: ray: could not start a local Ray ({first[:200]})"
                    ) from None
                where = opts.address or f"RAY_ADDRESS={os.environ['RAY_ADDRESS']}"
                raise UserError(
                    f"sweep key ray.address: no Ray cluster at {where} ({first[:200]}); "
                    "start one with `ray start --head`, or leave ray.address out for a local "
                    "Ray started with the sweep"
                ) from None
        try:  # whatever goes wrong from here (Ctrl-C too) leaves no actor and no connection
            self.init_s = time.time() - t0
            gpus = ray.cluster_resources().get("GPU", 0)
            if opts.gpu is None and device != "cuda" and gpus > 0:
                raise UserError(
                    f"sweep key ray.gpu: the cluster has {gpus:g} GPU(s) but this "
                    f"machine no CUDA, so no default share; set ray.gpu (a trial's "
                    f"GPUs, e.g. 1 or 0.5)"
                )
            env = {k: v for k, v in os.environ.items() if k.startswith("SMOLLAB_")}
            self._remote = ray.remote(TrialSlot).options(num_cpus=self.cpu, num_gpus=self.gpu)
            self._args = (os.getcwd(), env, sys.executable)
            t0 = time.time()
            self.slots = [self._new_slot() for _ in range(concurrency)]
            self._wait_ready(self.slots)
            self.actors_s = time.time() - t0
        except BaseException:
            self.close()
            raise
        nodes = sorted({s.node for s in self.slots})
        how = "started a local Ray" if self.local else "connect"
        say(
            f"ray: {len(self.slots)} trial slot(s) of {self.cpu:g} CPU, {self.gpu:g} GPU on "
            f"{', '.join(nodes)} ({how} {self.init_s:.1f} s, actors {self.actors_s:.1f} s)"
        )

    def _new_slot(self) -> Slot:
        actor = self._remote.remote(*self._args)
        return Slot(actor, ready=actor.ready.remote())

    def _not_placed(self, n: int) -> UserError:
        import ray

        have = ray.available_resources()
        return UserError(
            f"sweep key ray: {n} trial slot(s) of cpu={self.cpu:g}, gpu={self.gpu:g} "
            f"not placed in {START_TIMEOUT_S:g} s; the cluster has CPU "
            f"{have.get('CPU', 0):g}, GPU {have.get('GPU', 0):g} free"
        )

    def _wait_ready(self, slots: list[Slot]) -> None:
        """The sweep's first slots: placed within START_TIMEOUT_S, or a UserError."""
        import ray

        try:
            infos = ray.get([s.ready for s in slots], timeout=START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise self._not_placed(len(slots)) from None
        except ray.exceptions.RayActorError as e:
            raise _start_failed(e) from None
        for s, info in zip(slots, infos, strict=True):
            self._placed(s, info)

    def _placed(self, slot: Slot, info: dict[str, Any]) -> None:
        if info.get("error"):
            raise UserError(
                f"sweep key executor: ray: node {info['node']} {info['error']}; "
                f"every node must see the sweep at the driver's path (a shared "
                f"file system)"
            )
        slot.node, slot.ready = info["node"], None

    def _settle(self) -> None:
        """Slots whose actor Ray placed since the last look take trials; never waits."""
        import ray

        for s in self.slots:
            if s.ready is None or not ray.wait([s.ready], timeout=0)[0]:
                continue
            try:
                info = ray.get(s.ready)
            except ray.exceptions.RayActorError as e:
                if e.actor_init_failed:  # it would fail the same way again and again
                    raise _start_failed(e) from None
                s.dead, s.ready = True, None
                continue
            self._placed(s, info)

    def _replace(self, old: Slot, why: str) -> None:
        """A fresh actor in `old`'s place, not waited for: it takes trials once Ray places it."""
        import ray

        with contextlib.suppress(Exception):
            ray.kill(old.actor)
        self.slots[self.slots.index(old)] = self._new_slot()
        self.say(
            f"ray: the slot on {old.node} {why}; a fresh actor takes its place once Ray "
            f"can place it"
        )

    def can_launch(self, running: int) -> bool:
        """Whether a slot is free for a trial now (`running`: trials the sweep follows). Dead
        slots, and those whose child the sweep gave up on, get fresh actors; while Ray cannot
        place them (a node lost, the rest full) the sweep runs fewer trials at once. A UserError
        once none has been placed for START_TIMEOUT_S with no trial running."""
        self._settle()
        if any(s.free for s in self.slots):
            return True
        for s in [s for s in self.slots if s.dead]:
            self._replace(s, "died")
        busy = [s for s in self.slots if s.busy]
        given_up = sorted(
            (s for s in busy if s.child and s.child.kill_sent is not None),
            key=lambda s: s.child.kill_sent,
        )
        for s in given_up[: max(0, len(busy) - running)]:  # the oldest SIGKILLs were given up on
            self._replace(s, "has a child that survived SIGKILL")
        pending = [s for s in self.slots if s.ready is not None]
        if (
            pending
            and not running
            and time.time() - min(s.since for s in pending) > START_TIMEOUT_S
        ):
            raise self._not_placed(len(pending))
        return False

    @property
    def trial_threads(self) -> int:
        """A trial's CPU threads, however many others run: what its slot reserves."""
        return max(1, math.ceil(self.cpu))

    def cpu_threads(self, concurrency: int) -> int:
        """CPU threads all the trials use (the sweep's log and sweep.json)."""
        return self.trial_threads * concurrency

    def launch(
        self,
        name: str,
        argv: list[str],
        run_dir: Path,
        threads: int | None = None,
        env: dict[str, str] | None = None,
        grace: float = 60.0,
    ) -> RayChild:
        """`children.launch` on a free slot's node (`can_launch` said one is free). A slot whose
        actor died, or that does not answer in CALL_TIMEOUT_S (killed, and a child it may have
        started stopped), is dead: the trial goes to another slot, or a fresh one; after
        CALL_TIMEOUT_S without one it is lost (recorded failed). `env` (the local executor's) is
        not used: a trial gets its node's environment."""
        import ray

        run_dir = Path(run_dir).absolute()
        deadline = time.time() + CALL_TIMEOUT_S
        while time.time() < deadline:
            slot = next((s for s in self.slots if s.free), None)
            if slot is None:  # every free slot failed: wait a little for a fresh one
                self._settle()
                for s in [s for s in self.slots if s.dead]:
                    self._replace(s, "died")
                time.sleep(0.2)
                continue
            try:
                pid = ray.get(
                    slot.actor.launch.remote(name, argv, str(run_dir), threads, grace),
                    timeout=CALL_TIMEOUT_S,
                )
            except ray.exceptions.RayActorError as e:
                slot.dead = True
                self.say(
                    f"ray: the actor of the slot on {slot.node} died ({type(e).__name__}) "
                    f"before trial {name} started; trying another"
                )
                continue
            except ray.exceptions.GetTimeoutError:
                slot.dead = True
                self.say(
                    f"ray: the slot on {slot.node} did not start trial {name} in "
                    f"{CALL_TIMEOUT_S:g} s; killed, trying another"
                )
                with contextlib.suppress(Exception):
                    ray.kill(slot.actor)
                ch.reap_stale(run_dir, grace, time.time())  # a child it started goes first
                continue
            slot.busy = True
            slot.child = RayChild(name=name, run_dir=run_dir, threads=threads, pid=pid, slot=slot)
            return slot.child
        lost = RayChild(name=name, run_dir=run_dir, threads=threads, pid=0, slot=None, code=LOST)
        lost._note(f"smollab: error: no Ray actor could start this trial in {CALL_TIMEOUT_S:g} s")
        return lost

    def close(self) -> None:
        """Ends the slots (each one's child first, by its reaper) and leaves the cluster; a
        local Ray the sweep started stops with it (`ray.shutdown` ends what `ray.init` began)."""
        import ray

        for s in self.slots:
            with contextlib.suppress(Exception):
                ray.kill(s.actor)
        if self.owns and ray.is_initialized():
            ray.shutdown()


def _start_failed(e: Exception) -> UserError:
    """A slot's actor that died starting (its node lacks smollab, or its constructor failed)."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    last = lines[-1][:200] if lines else type(e).__name__
    return UserError(
        f"sweep key executor: ray: a trial slot's actor failed to start ({last}); "
        f"every node needs the same smollab and the sweep's files at the same path"
    )
