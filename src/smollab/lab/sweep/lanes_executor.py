"""`executor: lanes`: a sweep's GRPO trials (LoRA or full) trained as lanes of one batched model.

One worker process (`smollab lanes grpo --inbox DIR --max-lanes N`, `train.grpo.lanes`) trains
up to N trials at once as lanes of one model (one base; N adapters, or N full copies); a lane
that ends is refilled with the next trial posted. With `lane_workers: W`, W such workers run at once, each
on the sweep's threads / W (a CPU's cores may do more as W single-thread processes than as one
process on all of them), and a trial goes to the worker with the most free lanes. The executor
talks to a worker only through its inbox's files (`smollab.rundir.inbox`, under
`<sweep_dir>/lanes/`, or `lanes/w<i>/` for W > 1), so either side can die without the other
waiting on a pipe. `LaneChild` is the scheduler's handle on one lane, with the interface
of `children.Child`, so pruning, timeouts, retries, resume and results.csv work as they do for
processes: each trial still has its own run directory, written by the worker as `smollab grpo`
writes it.

What differs from a process, and why:
- interrupt() posts `<name>.stop`; the worker ends the lane at its next step boundary, as a
  SIGINT ends a child (status interrupted, exit 130).
- kill() gives the lane up (poll returns -9) without killing the worker, whose other lanes are
  live trials. The worker still ends that lane at its next step boundary and writes its run
  directory then (status interrupted); the sweep has recorded its own verdict by then. A worker all of whose remaining lanes were given up is SIGKILLed: nothing the
  sweep follows runs in it, and a wedged worker would hold the CPU and the lanes' slots.
- A worker that dies ends every lane it had not ended (its own; other workers go on): each one's
  poll returns the worker's exit code (1 for a clean exit that left it open), and its child.log
  names the worker's last words. A launch that needs that slot starts a fresh worker on a
  cleared inbox.
- A worker is started at the first launch that needs it (process group, PDEATHSIG, the reaper, as
  `children.launch`), and ended by close(): `close` posted, then SIGINT and SIGKILL if it lingers.
  A worker a previous sweep process left (with any W) is stopped before this one's start.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smollab.errors import UserError
from smollab.lab import children as ch
from smollab.lab.sweep.spec import SweepSpec
from smollab.rundir.inbox import CLOSE, EXIT, STOP, TRIAL, WORKER_LOG, Inbox, LaneTrial
from smollab.rundir.runs import CHILD_LOG

GIVEN_UP = -9  # the exit code of a lane the sweep gave up on (as SIGKILL reads for a process)
INBOX = "lanes"  # the inbox's directory under the sweep dir


class Worker:
    """One lanes worker process and the lanes posted to it."""

    def __init__(self, child: ch.Child, inbox: Inbox, say: Any = print):
        self.child, self.inbox, self.say = child, inbox, say
        self.lanes: list[LaneChild] = []

    @property
    def pid(self) -> int:
        return self.child.pid

    def exit_code(self) -> int | None:
        return self.child.poll()

    def open_lanes(self) -> list[LaneChild]:
        """Lanes posted to this worker that it has not ended (given-up ones included)."""
        return [lane for lane in self.lanes if self.inbox.exit_code(lane.name) is None]

    def last_words(self) -> str:
        return ch.last_log_line(self.inbox.path, WORKER_LOG)

    def end_if_abandoned(self) -> None:
        """SIGKILL the worker once every lane it still runs was given up by the sweep."""
        still = self.open_lanes()
        if self.exit_code() is None and still and all(lane.kill_sent for lane in still):
            self.say(f"lanes: every lane left in worker pid {self.pid} was given up; SIGKILL")
            self.child.kill()


@dataclass(eq=False)
class LaneChild:
    """A trial running as a lane of a `Worker`: what the scheduler uses of a `children.Child`."""

    name: str
    run_dir: Path
    argv: list[str]
    worker: Worker
    threads: int | None = None  # the worker's threads are the sweep's, not a trial's
    started: float = field(default_factory=time.time)
    stop_reason: str | None = None
    stop_sent: float | None = None
    kill_sent: float | None = None
    code: int | None = None

    @property
    def pid(self) -> int:
        return self.worker.pid

    def poll(self) -> int | None:
        """The lane's exit code (from the worker's `<name>.exit`), or the worker's own once it
        has died without ending the lane; None while the lane runs (or waits for one)."""
        if self.code is not None:
            return self.code
        code = self.worker.inbox.exit_code(self.name)
        if code is None:
            rc = self.worker.exit_code()
            if rc is None:
                return None
            code = self.worker.inbox.exit_code(self.name)  # written just before it exited
            if code is None:
                code = rc or 1
                self._note(
                    f"smollab: error: the lanes worker (pid {self.pid}) exited with code "
                    f"{rc} before this lane ended: {self.worker.last_words()}"
                )
        self.code = code
        return code

    def interrupt(self, reason: str | None = None) -> None:
        """Ask the worker to end this lane cleanly (status interrupted), as SIGINT asks a child."""
        if self.stop_sent is None:
            self.stop_reason = reason
            self.stop_sent = time.time()
            if self.code is None:
                self.worker.inbox.stop(self.name, reason or "")

    def kill(self) -> None:
        """Give the lane up; the worker and its other lanes go on."""
        if self.kill_sent is None:
            self.kill_sent = time.time()
        if self.poll() is None:
            if self.stop_sent is None:
                self.worker.inbox.stop(self.name, "given up")
            self.code = GIVEN_UP
            self._note(
                f"smollab: error: given up: lanes worker pid {self.pid} did not end this "
                f"lane when asked; its other lanes go on"
            )
            self.worker.end_if_abandoned()

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = time.time() + (timeout if timeout is not None else math.inf)
        while (code := self.poll()) is None and time.time() < deadline:
            time.sleep(0.05)
        return code

    def peak_rss_mb(self) -> float | None:
        """The worker's (every lane's) peak resident memory."""
        return self.worker.child.peak_rss_mb()

    def last_output(self) -> float:
        return ch.Child.last_output(self)  # type: ignore[arg-type]  # reads run_dir and started

    def _note(self, line: str) -> None:
        """The parent's words in the trial's child.log (its last line is the failure reason)."""
        with contextlib.suppress(OSError):
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with open(self.run_dir / CHILD_LOG, "a") as f:
                f.write(line + "\n")


@dataclass(eq=False)
class Slot:
    """A place for one worker: its inbox and its share of the sweep's threads."""

    inbox: Inbox
    threads: int
    worker: Worker | None = None

    def live(self) -> Worker | None:
        w = self.worker
        return w if w is not None and w.exit_code() is None else None


class LanesExecutor:
    """Posts the sweep's trials to `lane_workers` lanes workers of up to `lanes` lanes each (one
    inbox and a share of the threads each), a trial to the worker with the most free lanes;
    starts each worker, and restarts one that died, as a trial needs it."""

    trial_threads = None  # the scheduler adds no perf.threads: a lane's threads are the worker's

    def __init__(self, spec: SweepSpec, concurrency: int, sweep_dir: Path, say: Any = print):
        n = int(spec.lane_workers or 1)  # a number by now (resolve_lanes)
        self.max_lanes = concurrency // n
        self.threads = spec.threads or ch.cpu_count()
        self.grace = spec.stop_timeout_s
        root = Path(sweep_dir).absolute() / INBOX
        paths = [root] if n == 1 else [root / f"w{i}" for i in range(n)]
        self.slots = [
            Slot(Inbox(p), t) for p, t in zip(paths, ch.split_threads(self.threads, n), strict=True)
        ]
        self.say = say
        for p in [root, *sorted(root.glob("w*"))]:  # whatever worker count the last process had
            if ch.reap_stale(p, self.grace):
                say(f"lanes: stopped a worker left by the previous sweep process ({p})")
        for slot in self.slots:
            self._clear(slot.inbox)

    def cpu_threads(self, concurrency: int) -> int:
        """CPU threads the workers use together (the sweep's log and sweep.json)."""
        return self.threads

    def at_once(self) -> str:
        """The sweep's start line: how many trials run at once, and where."""
        if len(self.slots) == 1:
            return f"{self.max_lanes} lanes in one worker on {self.threads} CPU threads"
        per = "/".join(str(t) for t in sorted({s.threads for s in self.slots}, reverse=True))
        return (
            f"{len(self.slots)} workers x {self.max_lanes} lanes on {self.threads} CPU "
            f"threads ({per} each)"
        )

    def _free(self, slot: Slot) -> int:
        """Lanes free in the slot: a lane given up but not yet ended by the worker holds its
        place, so a trial posted now would wait in the inbox with its clocks running."""
        w = slot.live()
        return self.max_lanes - (len(w.open_lanes()) if w else 0)

    def can_launch(self, running: int) -> bool:
        return any(self._free(slot) > 0 for slot in self.slots)

    def launch(
        self,
        name: str,
        argv: list[str],
        run_dir: Path,
        threads: int | None = None,
        env: dict[str, str] | None = None,
        grace: float = 60.0,
    ) -> LaneChild:
        """Post the trial whose child argv is `[python, -m, smollab, grpo, ...]` as a lane of the
        worker with the most free lanes (the first such, so one worker fills evenly with the next)."""
        run_dir = Path(run_dir).absolute()
        slot = max(self.slots, key=self._free)
        if slot.live() is None:
            self._start_worker(slot, env, grace)
        worker = slot.worker
        run_dir.mkdir(parents=True, exist_ok=True)
        posted = list(argv[3:])  # ["grpo", BASE?, key=value, ...]
        lane = LaneChild(name=name, run_dir=run_dir, argv=list(argv), worker=worker)
        lane._note(f"\n$ lane of worker pid {worker.pid}: {' '.join(posted)}")
        worker.inbox.post(LaneTrial(name, posted, str(run_dir)))
        worker.lanes.append(lane)
        return lane

    def _start_worker(self, slot: Slot, env: dict[str, str] | None, grace: float) -> None:
        old = slot.worker
        if old is not None:
            for lane in old.lanes:  # their codes read before the inbox is cleared
                lane.poll()
            self.say(
                f"lanes: worker pid {old.pid} exited with code {old.exit_code()} "
                f"({old.last_words()}); a fresh worker takes the next trials"
            )
        inbox = slot.inbox
        self._clear(inbox)
        args = [
            "grpo",
            "--inbox",
            str(inbox.path),
            "--max-lanes",
            str(self.max_lanes),
            "--threads",
            str(slot.threads),
        ]
        child = ch.launch(
            "lanes",
            ch.lanes_argv(args),
            inbox.path,
            threads=slot.threads,
            env=env,
            grace=grace,
            log_name=WORKER_LOG,
        )
        slot.worker = Worker(child, inbox, self.say)
        self.say(
            f"lanes: worker pid {child.pid} started, up to {self.max_lanes} lanes on "
            f"{slot.threads} CPU threads; inbox {inbox.path}"
        )

    @staticmethod
    def _clear(inbox: Inbox) -> None:
        """An inbox with no trial, stop, exit or close file of an earlier worker (its log stays)."""
        inbox.path.mkdir(parents=True, exist_ok=True)
        for p in inbox.path.iterdir():
            if p.name == CLOSE or p.name.endswith((TRIAL, STOP, EXIT)):
                with contextlib.suppress(OSError):
                    p.unlink()

    def close(self) -> None:
        """No more trials: each worker exits once its lanes have ended (SIGINT, then SIGKILL, if
        it lingers past the sweep's stop_timeout_s)."""
        live = [w for slot in self.slots if (w := slot.live())]
        for w in live:
            w.inbox.close()
        deadline = time.time() + self.grace
        for w in live:
            if w.child.wait(max(0.0, deadline - time.time())) is None:
                self.say(
                    f"lanes: worker pid {w.pid} still running {self.grace:g} s after "
                    f"close; stopping it"
                )
                ch.stop_all([w.child], timeout=10.0)


def check_spec(spec: SweepSpec) -> None:
    """The spec of `executor: lanes`: GRPO trials (LoRA or full) that differ only in
    what each lane of one batched model may have of its own (`config.lanes.may_differ`)."""
    from smollab.config.lanes import may_differ

    if spec.command != "grpo":
        raise UserError(
            f"sweep key executor: lanes trains grpo trials only, not "
            f"{spec.command} (use executor: local)"
        )
    if spec.lanes is None:
        raise UserError(
            "sweep key lanes: executor lanes needs lanes: N (trials at once, as lanes "
            "of one worker) or auto (from a probe of lane counts)"
        )
    if "concurrency" in spec.model_fields_set:
        raise UserError(
            "sweep key concurrency: not with executor: lanes (the trials at once are "
            "its lanes: N, times lane_workers: W)"
        )
    if spec.mps:
        raise UserError("sweep key mps: not with executor: lanes (the lanes are one process)")
    if spec.routing_baseline:
        raise UserError(
            "sweep key routing_baseline: not with executor: lanes (a baseline differs "
            "from its trial in grpo.routing.mode, which lanes share)"
        )
    swept = [("space", k) for k in spec.space]  # pbt: a perturbed key differs between lanes
    swept += [("pbt.perturb", k) for k in (spec.pbt.perturb if spec.pbt else {})]
    for section, key in swept:
        if not may_differ(key):
            raise UserError(
                f"sweep key {section}.{key}: executor lanes: {key} cannot differ between "
                f"lanes (they are rows of one batch through one base model)"
            )
    if "perf.threads" in spec.overrides:
        raise UserError(
            "sweep key overrides.perf.threads: not with executor: lanes (the lanes "
            "share the worker's threads: the sweep key threads)"
        )
    w = spec.lane_workers or 1
    fixed = isinstance(spec.lanes, int) and isinstance(w, int)
    spec.concurrency = spec.lanes * w if fixed else "auto"  # resolve_lanes makes it a number


def check_lanes(spec: SweepSpec) -> None:
    """Every trial's base (and so every lane's) must be a config lanes can train (the worker's
    own rules, `config.lanes.check_supported`); run after the points validate."""
    from smollab.config.lanes import check_supported
    from smollab.config.load import flatten, to_dict
    from smollab.lab.sweep.spec import resolve_config

    cfg = resolve_config(spec, {}, spec.seeds[0])
    try:
        check_supported(flatten(to_dict(cfg)), "of this sweep")
    except UserError as e:
        raise UserError(f"sweep key executor: lanes: {e}") from None


def resolve_lanes(spec: SweepSpec, device_kind: str, say: Any = print) -> int:
    """The trials at once, `lanes` x `lane_workers`, both set on the spec as numbers. `auto`
    reads the last probe of lane counts of this workload on this device (a UserError when it has
    none: a probe of lanes takes minutes, too long to run unasked before a sweep): the best of
    its levels with the other key's value. `lane_workers` left out is 1, or with `lanes: auto`
    the probe's (so `lanes: auto` alone takes its best workers x lanes)."""
    workers = spec.lane_workers
    if workers is None:
        workers = "auto" if spec.lanes == "auto" else 1
    lanes = spec.lanes
    if "auto" in (lanes, workers):
        lanes, workers = _from_probe(spec, device_kind, lanes, workers, say)
    threads = spec.threads or ch.cpu_count()
    if device_kind == "cpu" and workers > threads:
        raise UserError(
            f"sweep key lane_workers: {workers} workers need at least {workers} CPU "
            f"threads (one each), the sweep has {threads}"
        )
    spec.lanes, spec.lane_workers = int(lanes), int(workers)
    return spec.lanes * spec.lane_workers


def _from_probe(
    spec: SweepSpec, device_kind: str, lanes: int | str, workers: int | str, say: Any
) -> tuple[int, int]:
    from smollab.lab.probe.cache import (
        cache_lookup,
        cache_path,
        device_info,
        device_key,
        lanes_signature,
        workload_signature,
    )
    from smollab.lab.probe.lanes import pick_best
    from smollab.lab.sweep.spec import resolve_config

    point = spec.grid_points()[0] if spec.sampler == "grid" else {}
    cfg = resolve_config(spec, point, spec.seeds[0])
    device = device_info(device_kind, spec.threads or ch.cpu_count())
    signature = lanes_signature(workload_signature(spec.command, cfg))
    hit = cache_lookup(device, signature) or {}
    levels = [
        lv
        for lv in hit.get("lanes") or []
        if lanes in ("auto", lv["lanes"]) and workers in ("auto", lv.get("workers", 1))
    ]
    best = pick_best(levels)
    auto = [
        k for k, v in (("lanes", spec.lanes), ("lane_workers", spec.lane_workers)) if v == "auto"
    ]
    if not best:
        with_ = [
            f"lanes={lanes}" if lanes != "auto" else "",
            f"{workers} worker(s)" if workers != "auto" else "",
        ]
        cond = " and ".join(x for x in with_ if x)
        hint = "lanes=[1,2,4,8]" + (" lane_workers=[1,2]" if workers == "auto" else "")
        raise UserError(
            f"sweep key {auto[0]}: auto needs a probe of lane counts of this workload "
            f"on {device_key(device)}"
            + (f" that measured {cond}" if cond else "")
            + f", and none is cached; run `smollab probe {spec.base or 'BASE'} {hint}` "
            f"first, or give {auto[0]}: N"
        )
    n, w = int(best["lanes"]), int(best.get("workers", 1))
    what = f"{n} lanes in one worker" if w == 1 else f"{w} workers x {n} lanes"
    say(
        f"{' and '.join(f'{k} auto' for k in auto)}: {what} (the best of the probe of "
        f"{hit.get('created')} on {device_key(device)}; {cache_path(device, signature)})"
    )
    return n, w
