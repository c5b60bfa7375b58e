"""One GRPO run's own state and bookkeeping: a `smollab grpo` run, or one lane of a lanes worker.

A run owns its config, policy, AdamW, run directory, loss options, failure watch, step counter,
reward history and evaluations; the step (`step.py`) trains one or many of them at once. Here
is what each run does alike around its steps: open or resume its run directory, the block after
each step (the metrics row and samples, the failure rules, finite weights, the checkpoint) and the
wrap-up. So a lane writes exactly the run directory its run alone would, and sweeps, reports and
`results.csv` read both the same way. Under torchrun `run` is None off rank 0: every rank keeps
the state and takes the decisions, rank 0 alone writes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from smollab.config import GRPOConfig
from smollab.device.runtime import Runtime, make_adamw
from smollab.models.presets import count_parameters
from smollab.rewards.registry import reward_keys
from smollab.rundir.columns import GRPO as COLUMNS
from smollab.rundir.columns import ROUTING
from smollab.rundir.runs import run_path
from smollab.rundir.writer import RunDir
from smollab.train import checkpoints, distributed, scaffold
from smollab.train.distributed import SINGLE, Dist
from smollab.train.failure_rules import RLWatch
from smollab.train.grpo.loss import EntropyControl, LossOptions
from smollab.train.grpo.ranks import Whole
from smollab.train.grpo.routing import Router
from smollab.train.schedule import lr_at


def columns(cfg: GRPOConfig) -> list[str]:
    """metrics.csv's columns: COLUMNS, each reward's mean when there are several, routing's."""
    keys = _reward_keys(cfg)
    per_fn = [f"reward/{k}" for k in keys] if len(keys) > 1 else []
    return COLUMNS + per_fn + (ROUTING if cfg.grpo.routing.enabled else [])


def run_dir_for(cfg: GRPOConfig) -> Path:
    rewards = "+".join(r.name.split(":")[-1] for r in cfg.reward)
    kind = f"lora{cfg.model.lora.r}" if cfg.model.lora.enabled else "full"
    if (rc := cfg.grpo.routing).enabled:
        kind = f"route-{rc.mode}-r{rc.retain_r}-{rc.forget_r}"
    parts = [cfg.run.name or rewards, kind, f"lr{cfg.optim.lr:g}", f"beta{cfg.grpo.beta:g}"]
    return run_path(cfg.run.dir, "grpo", [*parts, f"s{cfg.run.seed}"])


@dataclass
class Update:
    """A step's first optimizer pass over its fresh batch, as the metrics row reports it."""

    loss: float
    stats: dict[str, float]
    grad_norm: float


@dataclass
class RunState:
    cfg: GRPOConfig
    run: RunDir | None  # None off rank 0 under torchrun
    policy: nn.Module
    trainable: list[torch.Tensor]
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None  # fp16's, the process's
    options: LossOptions
    watch: RLWatch
    entropy: EntropyControl  # the entropy bonus's coefficient (adaptive: it moves, and is saved)
    started: float  # time.time() when it started: the rows' wall_s
    max_steps: int  # train.max_steps, or the steps its train.epochs take
    router: Router | None = None
    lane: str | None = None  # its name as a lane of a lanes worker
    echo: bool = False  # its log lines on stdout too
    step: int = 0
    history: list[float] = field(default_factory=list)  # each step's mean batch reward
    train_seconds: float = 0.0  # the steps' time, for train.max_time (kept in checkpoints)
    base_eval: float | None = None
    eval_reward: float | None = None
    ended: tuple[str, str | None] | None = None  # (status, evidence) once it stops early
    update: Update | None = None  # this step's
    frac_zero_std: float = 0.0  # this step's frac_reward_zero_std (TRL's)
    # the batch generated for several optimizer steps (grpo.steps_per_generation; step.Generation)
    generation: Any = None
    row: dict[str, Any] = field(default_factory=dict)  # this step's metrics row
    columns: dict[str, list[Any]] = field(default_factory=dict)  # this step's, for samples

    @classmethod
    def open(
        cls,
        cfg: GRPOConfig,
        policy: nn.Module,
        *,
        rt: Runtime,
        sampler: str,
        no_replay: str | None,
        max_steps: int,
        prompts_note: str = "",
        path: Path | None = None,
        lane: str | None = None,
        router: Router | None = None,
        started: float | None = None,
        d: Dist = SINGLE,
    ) -> RunState | dict[str, Any]:
        """The run's optimizer and directory (`path`, default from the config), resumed from its
        newest checkpoint; a run that had already finished comes back as its summary instead.
        sampler, no_replay: what samples it and why its forward is computed (None: replayed),
        for its log; max_steps: its length (`Shared.max_steps`); prompts_note: where its prompts
        come from, for its log; lane: its name as a lane of a lanes worker."""
        oc = cfg.optim
        trainable = [p for p in policy.parameters() if p.requires_grad]
        optimizer = make_adamw(
            [{"params": trainable, "weight_decay": oc.weight_decay}],
            rt,
            oc.lr,
            (oc.beta1, oc.beta2),
            oc.eps,
        )
        run, finished = scaffold.open_run(path or run_dir_for(cfg), cfg, "grpo", d)
        if finished is not None:
            return finished
        if run:
            run.log(rt.describe(), echo=lane is None)
        saved = checkpoints.resume(
            run, policy, optimizer, rt.scaler, cfg.model.lora.enabled, dist=d
        )
        watch = RLWatch(cfg.failure, saved.get("flags"))
        watch.streak = int(saved.get("rl_streak", 0))
        entropy = EntropyControl.from_config(cfg.grpo)
        if "entropy_coef" in saved:  # the adaptive controller's, where it left off
            entropy.coef, entropy.last = saved["entropy_coef"], saved["entropy_last"]
        state = cls(
            cfg=cfg,
            run=run,
            policy=policy,
            trainable=trainable,
            optimizer=optimizer,
            scaler=rt.scaler,
            options=LossOptions.from_config(cfg.grpo),
            watch=watch,
            entropy=entropy,
            started=started or time.time(),
            max_steps=max_steps,
            router=router,
            lane=lane,
            step=int(saved.get("step", 0)),
            history=list(saved.get("reward_history", [])),
            train_seconds=float(saved.get("train_seconds", 0.0)),
        )
        if run:
            state.base_eval = run.read_summary().get("base_eval_reward")
            run.open_metrics(columns(cfg), resume_step=state.step if run.resume_from else None)
            total, _ = count_parameters(policy)
            n_trainable = sum(p.numel() for p in trainable)
            forward = "replayed from the decode" if no_replay is None else f"computed ({no_replay})"
            where = f"lane {lane} of a lanes worker: " if lane else ""
            run.log(
                f"{where}policy {cfg.model.path or cfg.model.preset}: {total:,} parameters, "
                f"{n_trainable:,} trainable ({_kind(cfg)}); sampler {sampler}; rewards "
                f"{', '.join(_reward_keys(cfg))}; policy forward {forward}",
                echo=True,
            )
            if prompts_note:
                run.log(prompts_note, echo=lane is None)
            if cfg.train.epochs:
                run.log(f"train.epochs={cfg.train.epochs:g}: {max_steps} steps", echo=lane is None)
            run.update_summary(
                status="running",
                params_total=total,
                params_trainable=n_trainable,
                device=str(rt.device),
                sampler=sampler,
                world_size=d.world,
            )
        return state

    # ---- the step's own -------------------------------------------------------------------
    def set_lr(self) -> None:
        lr = lr_at(self.step, self.cfg.optim, self.max_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    @property
    def out_of_time(self) -> bool:
        return bool(self.cfg.train.max_time) and self.train_seconds >= self.cfg.train.max_time

    @property
    def due_to_end(self) -> bool:
        return self.ended is not None or self.step >= self.max_steps or self.out_of_time

    def due(self, interval: int) -> bool:
        """Whether a `train.*_interval` falls on this step (or the last one)."""
        return bool(interval) and (self.step % interval == 0 or self.step == self.max_steps)

    @property
    def base_eval_due(self) -> bool:
        """The base model's evaluation, once, before the first step."""
        tc = self.cfg.train
        return (
            self.run is not None
            and self.step == 0
            and bool(tc.eval_interval)
            and self.base_eval is None
        )

    def record_base_eval(self, reward: float) -> None:
        self.base_eval = reward
        self.run.update_summary(base_eval_reward=reward)
        self.run.log(f"base model: eval reward {reward:.3f}", echo=True)

    def after_step(self, batch: Whole, rows: slice, tokenizer, d: Dist = SINGLE) -> None:
        """The metrics row and samples (at log steps), the failure rules, finite weights, the
        periodic checkpoint."""
        tc, run, row = self.cfg.train, self.run, self.row
        if run and (self.due(tc.log_interval) or self.step == 1):
            run.metrics.append(row)
            prompts, completions = batch.prompts[rows], batch.completions[rows]
            run.append_samples(
                {
                    "step": self.step,
                    "prompt": prompts[i],
                    "completion": completions[i],
                    "reward": float(batch.total[rows][i]),
                    **{k: v[i] for k, v in self.columns.items()},  # those a reward reads
                }
                for i in range(min(self.cfg.grpo.log_samples, len(completions)))
            )
            run.log(_line(row), echo=self.echo)
        failure = distributed.broadcast_object(
            self.watch.new_failure(row, self.history, self.step), d
        )
        if failure:
            self._log(f"{failure.status}: {failure.evidence}")
            if self.cfg.failure.action == "stop" or failure.status == "diverged":
                self.ended = (failure.status, failure.evidence)
                return
        if not _finite(self.trainable):  # NaN weights would poison every later draw
            self.ended = ("diverged", f"its weights are not finite at step {self.step}")
            self._log(f"diverged: {self.ended[1]}")
            return
        if run and self.due(tc.save_interval) and self.step < self.max_steps:
            self.save(tokenizer)

    def save(self, tokenizer) -> None:
        checkpoints.save_state(
            self.run,
            self.step,
            self.policy,
            tokenizer,
            self.optimizer,
            self.scaler,
            self.cfg.train.keep_last,
            reward_history=self.history,
            flags=self.watch.flags,
            rl_streak=self.watch.streak,
            train_seconds=self.train_seconds,
            **(
                {"entropy_coef": self.entropy.coef, "entropy_last": self.entropy.last}
                if self.entropy.adaptive
                else {}
            ),
        )

    def finish(self, tokenizer) -> dict[str, Any]:
        """Final weights (and `final_merged/` with grpo.export_merged), summary, plots; {} off
        rank 0."""
        if self.run is None:
            return {}
        status, evidence = self.ended or ("completed", None)
        tail = self.history[-self.cfg.failure.baseline_steps :]
        base = self.history[0] if self.history else None
        final = sum(tail) / len(tail) if tail else None
        return scaffold.finish(
            self.run,
            status,
            self.policy,
            tokenizer,
            f"{status}: {self.step} steps; reward {base} -> {final}",
            plots=self.cfg.run.plots,
            merged=self.cfg.model.lora.enabled and self.cfg.grpo.export_merged,
            evidence=evidence,
            flags=self.watch.flags,
            steps=self.step,
            base_reward=base,
            final_reward=final,
            base_eval_reward=self.base_eval,
            final_eval_reward=self.eval_reward,
            train_seconds=self.train_seconds,
            wall_seconds=time.time() - self.started,
            seconds_per_step=self.train_seconds / max(self.step, 1),
        )

    def _log(self, line: str) -> None:
        if self.run:
            self.run.log(line, echo=True)


def _reward_keys(cfg: GRPOConfig) -> list[str]:
    return reward_keys(r.name for r in cfg.reward)


def _kind(cfg: GRPOConfig) -> str:
    if (rc := cfg.grpo.routing).enabled:
        return f"routing {rc.mode}, r{rc.retain_r} retain + r{rc.forget_r} forget"
    return f"LoRA r{cfg.model.lora.r}" if cfg.model.lora.enabled else "full fine-tuning"


def _finite(params: list[torch.Tensor]) -> bool:
    """Whether every weight is finite: a NaN or inf makes its tensor's sum non-finite (one
    reduction per tensor, no copy of the weights, one device-to-host copy)."""
    return bool(torch.stack([p.detach().sum(dtype=torch.float32) for p in params]).isfinite().all())


def _line(row: dict) -> str:
    return (
        f"step {row['step']} | reward {row['reward_mean']:.3f} | kl {row['kl']:.4f} | "
        f"uniq {row['unique_fraction']:.2f} | len {row['completion_len']:.0f} | "
        f"{row['step_s']:.2f}s (gen {row['gen_s']:.2f} train {row['train_s']:.2f})"
    )
