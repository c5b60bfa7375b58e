"""`smollab lanes grpo`: many GRPO configurations (LoRA or full) trained as lanes of one batched
model, each writing the run directory its `smollab grpo` run would.

A lane is a GRPO run (`RunState`) whose forward runs with the others' through one `LaneLlama`
(`policies.Lanes`); every iteration takes one step of every lane (`step.step`, the same step a
run alone takes). A lane that ends (its budget, a failure rule, a stop request) leaves the batch
and the others go on; in worker mode (`inbox`) the next posted trial takes its place. The lanes
share what one batch through one base model must (`config.lanes`): a lane whose shared keys
differ from the first lane's is refused in one line, and so is what the batched model cannot do.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, NamedTuple

import torch

from smollab.config import GRPOConfig
from smollab.config.lanes import check_supported, may_differ
from smollab.config.load import flatten, load_config, to_dict
from smollab.device.runtime import setup_runtime
from smollab.errors import RunFailed, UserError
from smollab.rundir.inbox import EXIT_ENDED, EXIT_FAILED, EXIT_INTERRUPTED, Inbox, LaneTrial
from smollab.rundir.runs import LOG
from smollab.train import crash_record, distributed
from smollab.train.grpo.policies import Lanes
from smollab.train.grpo.run_state import RunState, run_dir_for
from smollab.train.grpo.setup import Shared
from smollab.train.grpo.step import step

IDLE_S = 0.2  # worker mode: how often an empty worker looks at its inbox


class Trial(NamedTuple):
    """A lane waiting to join: its name, config and run directory."""

    name: str
    cfg: GRPOConfig
    run_dir: Path


def train_lanes(
    cfgs: list[GRPOConfig],
    *,
    inbox: str | Path | None = None,
    max_lanes: int | None = None,
    threads: int | None = None,
) -> list[dict[str, Any]]:
    """Train `cfgs` as lanes (worker mode: also the trials posted to `inbox`, `max_lanes` at a
    time, until it is closed, each with perf.threads=`threads` when given). Returns each lane's
    summary, in the order they ended."""
    box = Inbox(inbox) if inbox else None
    queue = [Trial(run_dir_for(c).name, c, run_dir_for(c)) for c in cfgs]
    for t in queue:  # the lanes given: all refused before any work, in one line
        check_supported(flatten(to_dict(t.cfg)), t.name)
        check_compatible(queue[0].cfg, t.cfg, t.name)
    dirs = [Path(t.run_dir).resolve() for t in queue]
    if len(set(dirs)) < len(dirs):
        twice = next(d for d in dirs if dirs.count(d) > 1)
        raise UserError(f"two lanes would write {twice}: give each its own run.dir (or run.seed)")
    seen: set[str] = set()
    if box:  # a worker: the first acceptable trial posted sets what the lanes share
        queue += _posted(box, seen, threads)
        while not queue:
            if box.closed():
                return []
            time.sleep(IDLE_S)
            queue += _posted(box, seen, threads)
    first = queue[0].cfg
    if distributed.setup(torch.device("cpu"))[0].enabled:
        raise UserError("lanes run in one process: start `smollab lanes` without torchrun")
    rt = setup_runtime(first.perf)
    max_lanes = max_lanes or len(queue)
    lanes: list[RunState] = []
    summaries: list[dict[str, Any]] = []
    Shared.prepare(first)
    with Shared.load(first, rt) as shared, crash_record.open_runs() as opened:
        policies = Lanes(first, rt, shared.tokenizer)
        shared.open_rewards(policies)
        print(rt.describe(), flush=True)
        print(policies.decode_note, flush=True)
        try:
            while True:
                if box:  # new trials, and stop requests for running ones
                    queue += _posted(box, seen, threads)
                    for lane in lanes:
                        if lane.ended is None and (why := box.stop_reason(lane.lane)) is not None:
                            lane.ended = ("interrupted", why or f"stopped at step {lane.step}")
                while queue and len(lanes) < max_lanes:
                    lane = _open(
                        shared, policies, queue.pop(0), box=box, summaries=summaries, opened=opened
                    )
                    if lane is not None:
                        lanes.append(lane)
                for lane in [la for la in lanes if la.due_to_end]:
                    summaries.append(_end(shared, lane, box))
                    lanes.remove(lane)  # after its run is wrapped up: a failure there is recorded
                if not lanes:
                    if not box or (box.closed() and not queue):
                        break
                    time.sleep(IDLE_S)
                    continue
                step(shared, policies, lanes)
                _print_step(lanes)
        except KeyboardInterrupt:
            for lane in lanes:
                lane.ended = ("interrupted", f"interrupted at step {lane.step}")
                summaries.append(_end(shared, lane, box))
            raise
        except Exception as e:
            if not opened:
                raise
            steps = {id(lane.run): lane.step for lane in lanes}
            log = opened[0].path / LOG
            for run in list(opened):  # every lane open: the batch they share failed
                evidence = crash_record.record_failure(run, e, steps.get(id(run)))
            if box:
                for lane in lanes:
                    box.ended(lane.lane, EXIT_FAILED)
            raise RunFailed(evidence, log) from e
    return summaries


def check_compatible(first: GRPOConfig, cfg: GRPOConfig, name: str) -> None:
    """Refuse a lane whose shared keys differ from the first lane's, naming the first such key."""
    a, b = flatten(to_dict(first)), flatten(to_dict(cfg))
    for key in sorted(a.keys() | b.keys()):
        if a.get(key) != b.get(key) and not may_differ(key):
            raise UserError(
                f"lane {name}: {key}={b.get(key)} differs from the first lane's "
                f"{a.get(key)}; lanes share it (one batch through one base model)"
            )


def _posted(box: Inbox, seen: set[str], threads: int | None) -> list[Trial]:
    """The inbox's new trials as (name, config, run dir); a trial whose config is bad input ends
    at once (exit code 1, the reason in the worker's log) without touching the other lanes."""
    out = []
    for t in box.new_trials(seen):
        seen.add(t.name)
        try:
            cfg = _config(t, threads)
            check_supported(flatten(to_dict(cfg)), t.name)
            out.append(Trial(t.name, cfg, Path(t.run_dir)))
        except UserError as e:
            print(f"trial {t.name}: {e}", flush=True)
            box.ended(t.name, EXIT_FAILED)
    return out


def _config(t: LaneTrial, threads: int | None) -> GRPOConfig:
    if not t.argv or t.argv[0] != "grpo":
        raise UserError(f"lanes train grpo trials, not {' '.join(t.argv[:1]) or 'nothing'}")
    rest = t.argv[1:]
    base = rest[0] if rest and "=" not in rest[0] else None
    overrides = rest[1:] if base else rest
    extra = [f"run.dir={t.run_dir}", *([f"perf.threads={threads}"] if threads else [])]
    return load_config("grpo", base, [*overrides, *extra])


def _open(
    shared: Shared,
    policies: Lanes,
    trial: Trial,
    *,
    box: Inbox | None,
    summaries: list[dict[str, Any]],
    opened: list,
) -> RunState | None:
    """A new lane, or None when its trial could not join (refused, or finished already)."""
    name, cfg, before = trial.name, trial.cfg, len(opened)
    try:
        check_compatible(shared.cfg, cfg, name)
        lane = RunState.open(
            cfg,
            policies.new_policy(cfg),
            rt=shared.rt,
            sampler=policies.name,
            no_replay=policies.no_replay,
            max_steps=shared.max_steps(cfg),
            prompts_note=shared.prompts.note,
            path=trial.run_dir,
            lane=name,
        )
    except UserError as e:  # a changed config, an unusable checkpoint: recorded, never running
        for run in list(opened[before:]):
            crash_record.record_failure(run, e)
        if not box:
            raise
        print(f"trial {name}: {e}", flush=True)
        box.ended(name, EXIT_FAILED)
        return None
    if isinstance(lane, dict):  # already finished: nothing to do
        summaries.append(lane)
        if box:
            box.ended(name, EXIT_ENDED)
        return None
    if box and (why := box.stop_reason(name)) is not None:  # stopped while it waited
        lane.ended = ("interrupted", why or "stopped before its first step")
    return lane


def _end(shared: Shared, lane: RunState, box: Inbox | None) -> dict[str, Any]:
    summary = lane.finish(shared.tokenizer)
    if box:
        code = EXIT_INTERRUPTED if summary.get("status") == "interrupted" else EXIT_ENDED
        box.ended(lane.lane, code)
    return summary


def _print_step(lanes: list[RunState]) -> None:
    """The worker's own line: every lane's reward and the shared step's time, at log steps."""
    first = lanes[0]
    if first.step % first.cfg.train.log_interval == 0 or first.step == 1:
        rewards = " ".join(f"{la.row['reward_mean']:.2f}" for la in lanes)
        row = first.row
        print(
            f"lanes: {len(lanes)} at steps {first.step}..{lanes[-1].step} | reward {rewards} "
            f"| {row['step_s']:.2f}s (gen {row['gen_s']:.2f} train {row['train_s']:.2f})",
            flush=True,
        )
