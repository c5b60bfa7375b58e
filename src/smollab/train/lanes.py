"""One lane of `smollab lanes grpo` (a GRPO run, LoRA or full, that shares its batch with
others), and `Shared`, what all lanes of a worker use.

A lane is everything a `smollab grpo` run owns (config, policy, AdamW, run directory, failure
rules, step counter and reward history) except the model's forward, which `LaneLlama` runs for
all lanes at once. So a lane writes the same run directory as a process run (config.json,
metrics.csv, summary.json, checkpoints/ with a standard PEFT adapter or the full model, plots),
resumes from it, and sweeps, reports and `results.csv` read it unchanged.

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
from smollab.config.lanes import may_differ
from smollab.config.load import flatten, to_dict
from smollab.data.prepare import ensure_prepared
from smollab.device.runtime import make_adamw, release_cache
from smollab.engine.lane_llama import LaneLlama
from smollab.engine.policy import replay_blocker
from smollab.engine.reference import build_reference
from smollab.engine.sampler import Sampler
from smollab.errors import UserError
from smollab.models.loading import align_special_tokens, apply_lora, build_model, check_model_source
from smollab.rewards.pool import RewardPool
from smollab.rewards.registry import validate_specs
from smollab.rundir.writer import RunDir
from smollab.train import checkpoints, crash_record, grpo_loss, scaffold
from smollab.train.diversity import unique_fraction
from smollab.train.failure_rules import RLWatch
from smollab.train.grpo import COLUMNS, REWARD_CHECK
from smollab.train.prompts import grpo_prompts
from smollab.train.seeds import stream_seed


@dataclass
class Lane:
    name: str
    cfg: GRPOConfig
    policy: torch.nn.Module  # a PEFT model of the shared base (its adapter), or a full copy
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
        return (
            self.ended is not None
            or self.step >= tc.max_steps
            or bool(tc.max_time)
            and self.train_seconds >= tc.max_time
        )


def check_compatible(first: GRPOConfig, cfg: GRPOConfig, name: str) -> None:
    """Refuse a lane whose shared keys differ from the first lane's, naming the first such key."""
    a, b = flatten(to_dict(first)), flatten(to_dict(cfg))
    for key in sorted(a.keys() | b.keys()):
        if a.get(key) != b.get(key) and not may_differ(key):
            raise UserError(
                f"lane {name}: {key}={b.get(key)} differs from the first lane's "
                f"{a.get(key)}; lanes share it (one batch through one base model)"
            )


def open_lane(name: str, cfg: GRPOConfig, base: torch.nn.Module, rt, run_dir) -> Lane | dict:
    """The lane's policy (the base with its own adapter, seeded by its run.seed; or, without
    LoRA, its own trainable copy of the base), optimizer and run directory, resumed from its
    newest checkpoint. A run that had already finished comes back as its summary instead."""
    torch.manual_seed(cfg.run.seed)  # as `smollab grpo` seeds before its adapter's init
    lora = cfg.model.lora.enabled
    if lora:
        frozen = {id(t): t for t in (*base.parameters(), *base.buffers())}  # shared, not copied
        policy = apply_lora(copy.deepcopy(base, memo=frozen), cfg.model.lora)
    else:
        policy = copy.deepcopy(base).requires_grad_(True)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    oc = cfg.optim
    optimizer = make_adamw(
        [{"params": trainable, "weight_decay": oc.weight_decay}],
        rt,
        oc.lr,
        (oc.beta1, oc.beta2),
        oc.eps,
    )
    run, finished = scaffold.open_run(run_dir, cfg, "grpo")
    if finished is not None:
        return finished
    lane = Lane(
        name,
        cfg,
        policy,
        trainable,
        optimizer,
        run,
        RLWatch(cfg.failure),
        grpo_loss.options(cfg.grpo),
    )
    try:  # resume restores the process's RNG too: harmless, every lane draws from its own seeds
        state = checkpoints.resume(run, policy, optimizer, None, lora)
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
    """Whether its weights are still finite: a lane whose weights blew up must not sample again
    (NaN logits would poison the shared batch's draws)."""
    return bool(torch.stack([p.detach().abs().max() for p in lane.trainable]).isfinite().all())


def save(lane: Lane, tokenizer) -> None:
    tc = lane.cfg.train
    checkpoints.save_state(
        lane.run,
        lane.step,
        lane.policy,
        tokenizer,
        lane.optimizer,
        None,
        tc.keep_last,
        reward_history=lane.history,
        flags=lane.watch.flags,
        rl_streak=lane.watch.streak,
        train_seconds=lane.train_seconds,
    )


def finish(lane: Lane, tokenizer) -> dict[str, Any]:
    """Wrap the lane's run up as `smollab grpo` does: final adapter or model, summary, plots."""
    status, evidence = lane.ended or ("completed", None)
    tail = lane.history[-lane.cfg.failure.baseline_steps :]
    base = lane.history[0] if lane.history else None
    final = sum(tail) / len(tail) if tail else None
    return scaffold.finish(
        lane.run,
        status,
        lane.policy,
        tokenizer,
        f"{status}: {lane.step} steps; reward {base} -> {final}",
        plots=lane.cfg.run.plots,
        evidence=evidence,
        merged=lane.cfg.model.lora.enabled and lane.cfg.grpo.export_merged,
        flags=lane.watch.flags,
        steps=lane.step,
        base_reward=base,
        final_reward=final,
        base_eval_reward=lane.base_eval,
        final_eval_reward=lane.eval_reward,
        train_seconds=lane.train_seconds,
        wall_seconds=time.time() - lane.started,
        seconds_per_step=lane.train_seconds / max(lane.step, 1),
    )


class Shared:
    """What every lane uses: the base model, tokenizer, prompts, sampler, reference and rewards,
    set up from the first lane's config (the others must agree with it on every shared key)."""

    def __init__(self, cfg: GRPOConfig, rt):
        g = cfg.grpo
        self.cfg, self.rt = cfg, rt
        self.rewards = validate_specs(cfg.reward)
        check_model_source(cfg.model)
        if not g.prompts_file:
            ensure_prepared(cfg.data, exact=False)
        self.tokenizer = scaffold.load_tokenizer_for(cfg.model, cfg.data, data_tokens=False)
        self.train_prompts, self.eval_prompts = grpo_prompts(g, cfg.data.dir, self.tokenizer)
        torch.manual_seed(cfg.run.seed)
        base = build_model(
            cfg.model,
            vocab_size=len(self.tokenizer),
            attn_implementation=cfg.perf.attn_implementation,
            device=rt.device,
        )
        if len(self.tokenizer) > base.config.vocab_size:
            raise UserError(
                f"tokenizer has {len(self.tokenizer)} entries, the model only "
                f"{base.config.vocab_size}"
            )
        align_special_tokens(base, self.tokenizer)
        self.base = base.to(rt.device).requires_grad_(False)
        try:
            self.lanes = LaneLlama.from_hf(self.base, adapters=False)
        except (TypeError, NotImplementedError) as e:
            raise UserError(
                f"model {cfg.model.path or cfg.model.preset}: lanes need a "
                f"Llama-shaped model the lean engine reads ({e})"
            ) from None
        eos = self.tokenizer.eos_token_id
        self.sampler = Sampler(self.lanes, eos_token_id=eos, pad_token_id=eos)
        self.reference = build_reference(self.base, True, g.ref_on_cpu)
        # per lane, the budget its run alone has (lanes stand for that many processes): its
        # share of the decode record and of the lane-major copy the replay reads
        self.no_replay = replay_blocker(
            self.base,
            self.sampler,
            enabled=g.replay,
            autocast=False,
            batch_size=cfg.train.batch_size,
            max_new_tokens=g.max_completion_length,
            layer_copies=2,
        )
        self.pool = RewardPool(cfg.reward, workers=g.reward_workers, timeout_s=g.reward_timeout_s)
        try:  # the rewards, tried on a few base-model completions before anything is written
            r = Sampler(self.base, eos_token_id=eos, pad_token_id=eos).generate(
                self.eval_prompts[:REWARD_CHECK], g.max_completion_length, seed=cfg.run.seed
            )
            self.pool(
                r.prompt_texts(self.tokenizer),
                r.completion_texts(self.tokenizer),
                r.completion_rows(),
            )
        except BaseException:
            self.pool.close()
            raise
        cols = [f"reward/{r.key}" for r in self.rewards] if len(self.rewards) > 1 else []
        self.columns = COLUMNS + cols

    def generate(
        self, lanes: list[Lane], prompts: list[list[int]], seeds: list[int], record: bool = False
    ):
        """Completions of `prompts` (lane-major) through the lanes' policies, each lane's rows
        drawn from a generator of its own seed (`record`: keep the decode for the replay)."""
        g = self.cfg.grpo
        with torch.no_grad():
            self.lanes.load_lanes([lane.policy for lane in lanes])
        r = self.sampler.generate(
            prompts,
            g.max_completion_length,
            temperature=g.temperature,
            top_p=g.top_p,
            top_k=g.top_k,
            seed=seeds,
            record=record,
        )
        release_cache(self.rt.device)
        return r

    def evaluate(self, lanes: list[Lane]) -> list[dict[str, Any]]:
        """Each lane's mean reward and diversity on the held-out prompts, in one sampler call,
        each lane drawing from its own evaluation stream, as its run alone would."""
        n = len(self.eval_prompts)
        seeds = [stream_seed(la.cfg.run.seed, -1, 2) for la in lanes]  # as `smollab grpo` draws
        r = self.generate(lanes, self.eval_prompts * len(lanes), seeds)
        texts = r.completion_texts(self.tokenizer)
        total, _ = self.pool(r.prompt_texts(self.tokenizer), texts, r.completion_rows())
        return [
            {
                "reward_mean": float(total[i * n : (i + 1) * n].mean()),
                "unique_fraction": unique_fraction(texts[i * n : (i + 1) * n]),
            }
            for i in range(len(lanes))
        ]
