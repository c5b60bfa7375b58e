"""One lane of `smollab lanes grpo`: a GRPO LoRA run that shares its batch with others.

A lane is everything a `smollab grpo` run owns (config, PEFT policy, AdamW, run directory, failure
rules, step counter and reward history) except the model's forward, which `LaneLlama` runs for
all lanes at once. So a lane writes the same run directory as a process run (config.json,
metrics.csv, summary.json, checkpoints/ with a standard PEFT adapter, plots), resumes from it,
and sweeps, reports and `results.csv` read it unchanged.

What may differ between lanes is `lane_inbox.may_differ`; the rest must equal the first lane's
(`check_compatible`), because it is shared: the base model, the prompts, the batch and
completion shapes, sampling, the rewards and the precision.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from smollab.config import GRPOConfig
from smollab.config_load import flatten, to_dict
from smollab.device import make_adamw
from smollab.errors import UserError
from smollab.models.loading import apply_lora
from smollab.runs import RunDir
from smollab.train import checkpoints, crash_record, grpo_loss, scaffold
from smollab.train.failure_rules import RLWatch
from smollab.train.lane_inbox import may_differ


@dataclass
class Lane:
    name: str
    cfg: GRPOConfig
    policy: torch.nn.Module  # a PEFT model of the shared base: its adapter is the lane's
    trainable: list[torch.Tensor]
    optimizer: Any
    run: RunDir
    watch: RLWatch
    loss_options: dict[str, Any]
    step: int = 0
    history: list[float] = field(default_factory=list)
    train_seconds: float = 0.0
    started: float = field(default_factory=time.time)
    base_eval: float | None = None
    eval_reward: float | None = None
    ended: tuple[str, str | None] | None = None  # (status, evidence) once it stops
    row: dict[str, Any] = field(default_factory=dict)  # this step's metrics row

    @property
    def due_to_end(self) -> bool:
        tc = self.cfg.train
        return (self.ended is not None or self.step >= tc.max_steps
                or bool(tc.max_time) and self.train_seconds >= tc.max_time)  # fmt: skip


def check_compatible(first: GRPOConfig, cfg: GRPOConfig, name: str) -> None:
    """Refuse a lane whose shared keys differ from the first lane's, naming the first such key."""
    a, b = flatten(to_dict(first)), flatten(to_dict(cfg))
    for key in sorted(a.keys() | b.keys()):
        if a.get(key) != b.get(key) and not may_differ(key):
            raise UserError(f"lane {name}: {key}={b.get(key)} differs from the first lane's "
                            f"{a.get(key)}; lanes share it (one batch through one base model)")  # fmt: skip


def open_lane(name: str, cfg: GRPOConfig, base: torch.nn.Module, rt, run_dir) -> Lane | dict:
    """The lane's policy (the base with its own adapter, seeded by its run.seed), optimizer and
    run directory, resumed from its newest checkpoint. A run that had already finished comes
    back as its summary instead."""
    torch.manual_seed(cfg.run.seed)  # as `smollab grpo` seeds before its adapter's init
    frozen = {id(t): t for t in (*base.parameters(), *base.buffers())}  # shared, not copied
    policy = apply_lora(copy.deepcopy(base, memo=frozen), cfg.model.lora)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    oc = cfg.optim
    optimizer = make_adamw([{"params": trainable, "weight_decay": oc.weight_decay}], rt, oc.lr,
                           (oc.beta1, oc.beta2), oc.eps)  # fmt: skip
    run, finished = scaffold.open_run(run_dir, cfg, "grpo")
    if finished is not None:
        return finished
    lane = Lane(name, cfg, policy, trainable, optimizer, run, RLWatch(cfg.failure),
                grpo_loss.options(cfg.grpo))  # fmt: skip
    try:  # resume restores the process's RNG too: harmless, every lane draws from its own seeds
        state = checkpoints.resume(run, policy, optimizer, None, True)
    except Exception as e:  # recorded, never left running
        run.update_summary(status="failed", evidence=crash_record.failure_line(e))
        run.close()
        raise
    lane.step, lane.history = int(state.get("step", 0)), list(state.get("reward_history", []))
    lane.train_seconds = float(state.get("train_seconds", 0.0))
    lane.watch = RLWatch(cfg.failure, state.get("flags"))
    lane.watch.streak = int(state.get("rl_streak", 0))
    lane.base_eval = run.read_summary().get("base_eval_reward")
    return lane


def params_finite(lane: Lane) -> bool:
    """Whether the adapter is still finite: a lane whose weights blew up must not sample again
    (NaN logits would poison the shared batch's draws)."""
    return bool(torch.stack([p.detach().abs().max() for p in lane.trainable]).isfinite().all())


def save(lane: Lane, tokenizer) -> None:
    tc = lane.cfg.train
    checkpoints.save_state(lane.run, lane.step, lane.policy, tokenizer, lane.optimizer, None,
                           tc.keep_last, reward_history=lane.history, flags=lane.watch.flags,
                           rl_streak=lane.watch.streak, train_seconds=lane.train_seconds)  # fmt: skip


def finish(lane: Lane, tokenizer) -> dict[str, Any]:
    """Wrap the lane's run up as `smollab grpo` does: final adapter, summary, plots."""
    status, evidence = lane.ended or ("completed", None)
    tail = lane.history[-lane.cfg.failure.baseline_steps :]
    base = lane.history[0] if lane.history else None
    final = sum(tail) / len(tail) if tail else None
    return scaffold.finish(
        lane.run, status, lane.policy, tokenizer,
        f"{status}: {lane.step} steps; reward {base} -> {final}",
        plots=lane.cfg.run.plots, merged=lane.cfg.grpo.export_merged, evidence=evidence,
        flags=lane.watch.flags,
        steps=lane.step, base_reward=base, final_reward=final, base_eval_reward=lane.base_eval,
        final_eval_reward=lane.eval_reward, train_seconds=lane.train_seconds,
        wall_seconds=time.time() - lane.started,
        seconds_per_step=lane.train_seconds / max(lane.step, 1),
    )  # fmt: skip
