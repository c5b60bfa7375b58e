"""`smollab grpo`: GRPO for small causal LMs, full fine-tuning or LoRA, top to bottom.

One step: sample prompts -> roll out `num_generations` completions each with the lean sampler ->
score them -> group-relative advantages -> reference log-probs (lean, no grad) -> policy
forward/backward (`num_iterations` times, PPO-clipped; in `train.grad_accum` micro-batches of
whole groups, `grpo_accum`, each pass one optimizer step) -> metrics and failure rules.
Prompts and sampling are seeded by (seed, step), so a resumed run replays the same batches:
prompts are picked on the CPU, completions drawn on the policy's device by a generator the sampler
makes there from the seed (`Sampler.generate(seed=)`). `train.max_time` counts training time (the
sum of step times, kept in the checkpoint), like pretraining's: loading and evaluation are free.
Under torchrun each rank takes whole prompt groups of the step and the ranks sum their gradients
(train/grpo_ranks.py); rank 0 writes the run directory, evaluates and decides the failure rules.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import torch

from smollab.config import GRPOConfig
from smollab.data.prepare import ensure_prepared
from smollab.device.runtime import (
    make_adamw,
    peak_memory_mb,
    release_cache,
    setup_runtime,
    synchronize,
)
from smollab.engine.policy import replay_blocker
from smollab.engine.reference import build_reference
from smollab.engine.sampler import Sampler
from smollab.errors import UserError
from smollab.models.autocast_attention import fit_attention
from smollab.models.loading import align_special_tokens, apply_lora, build_model, check_model_source
from smollab.models.presets import count_parameters
from smollab.models.quantized import check_load_in
from smollab.models.routing import apply_routing
from smollab.rewards.pool import RewardPool
from smollab.rewards.registry import validate_specs
from smollab.rundir.runs import default_run_dir
from smollab.train import (
    checkpoints,
    distributed,
    grpo_accum,
    grpo_loss,
    grpo_ranks,
    routing,
    scaffold,
)
from smollab.train.crash_record import records_failure
from smollab.train.diversity import mean_pairwise_jaccard, repetition, unique_fraction
from smollab.train.failure_rules import RLWatch
from smollab.train.grpo_loss import frac_reward_zero_std, group_advantages
from smollab.train.progress import Progress
from smollab.train.prompts import grpo_prompts
from smollab.train.schedule import lr_at
from smollab.train.seeds import stream_seed  # salts: prompts 0, rollouts 1, evaluation 2

COLUMNS = [
    "step",
    "wall_s",
    "lr",
    "loss",
    "reward_mean",
    "reward_std",
    "frac_reward_zero_std",
    "kl",
    "entropy",
    "completion_len",
    "truncated_frac",
    "clip_frac",
    "grad_norm",
    "unique_fraction",
    "jaccard",
    "repetition",
    "eval_reward_mean",
    "eval_unique_fraction",
    "gen_s",
    "reward_s",
    "ref_s",
    "train_s",
    "step_s",
    "peak_mem_mb",
]


# A reward function that raises, hangs or returns NaN on any input fails here, as bad input.
REWARD_CHECK = 4


def metrics_row(
    step: int,
    started: float,
    lr: float,
    loss: float,
    total: torch.Tensor,
    num_generations: int,
    stats: dict,
    entropy: float,
    lengths: torch.Tensor,
    truncated: torch.Tensor,
    grad_norm,
    completions: list[str],
    per_fn: dict[str, torch.Tensor],
    marks: tuple[float, ...],
    device: torch.device,
) -> dict:
    """One step's metrics row (COLUMNS, then `reward/<fn>` with several reward functions), built
    here for `smollab grpo` and its lanes alike so a lane's metrics.jsonl reads as a run's does.
    `stats`: the first pass's loss stats; `marks`: the step's perf-counter times (start,
    generated, rewarded, referenced, trained); `entropy` comes from the caller (its own parts)."""
    t0, t_gen, t_rew, t_ref, t_end = marks
    row = dict(
        step=step,
        wall_s=time.time() - started,
        lr=lr,
        loss=loss,
        reward_mean=float(total.mean()),
        reward_std=float(total.std()),
        frac_reward_zero_std=frac_reward_zero_std(total, num_generations),
        kl=stats.get("kl", 0.0),
        entropy=entropy,
        completion_len=float(lengths.float().mean()),
        truncated_frac=float(truncated.float().mean()),
        clip_frac=stats["clip_region"],
        grad_norm=float(grad_norm),
        unique_fraction=unique_fraction(completions),
        jaccard=mean_pairwise_jaccard(completions),
        repetition=repetition(completions),
        gen_s=t_gen - t0,
        reward_s=t_rew - t_gen,
        ref_s=t_ref - t_rew,
        train_s=t_end - t_ref,
        step_s=t_end - t0,
        peak_mem_mb=peak_memory_mb(device),
    )
    if len(per_fn) > 1:
        row.update({f"reward/{k}": float(v.mean()) for k, v in per_fn.items()})
    return row


def run_dir_for(cfg: GRPOConfig) -> Path:
    if cfg.run.dir:
        return Path(cfg.run.dir)
    rewards = "+".join(r.name.split(":")[-1] for r in cfg.reward)
    kind = f"lora{cfg.model.lora.r}" if cfg.model.lora.enabled else "full"
    if (rc := cfg.grpo.routing).enabled:
        kind = f"route-{rc.mode}-r{rc.retain_r}-{rc.forget_r}"
    return default_run_dir(
        "grpo",
        [
            cfg.run.name or rewards,
            kind,
            f"lr{cfg.optim.lr:g}",
            f"beta{cfg.grpo.beta:g}",
            f"s{cfg.run.seed}",
        ],
    )


@records_failure
def train(cfg: GRPOConfig) -> dict:
    t_start = time.time()
    g, tc, oc = cfg.grpo, cfg.train, cfg.optim
    lora, routed = cfg.model.lora.enabled, g.routing.enabled
    rewards = validate_specs(cfg.reward)  # bad reward names or params fail before any work
    weights = {r.key: r.weight for r in rewards}
    router = routing.Router(g.routing, cfg.run.seed, weights) if routed else None
    check_model_source(cfg.model)  # before any data is prepared
    grpo_ranks.check(cfg)  # a batch torchrun's ranks cannot split into whole groups
    rt = setup_runtime(cfg.perf)
    d, rt.device = distributed.setup(rt.device)
    quantized = cfg.model.load_in != "none"
    check_load_in(cfg.model.load_in, rt.device)  # CUDA and bitsandbytes, before any data too

    # ---- tokenizer and prompts (rank 0 prepares the data directory first) ------------------
    def load_tokenizer():
        if not g.prompts_file:  # the prompts are stories of the data directory
            ensure_prepared(cfg.data, exact=False)
        return scaffold.load_tokenizer_for(cfg.model, cfg.data, data_tokens=False)

    tokenizer = distributed.rank0_first(load_tokenizer, d)
    train_prompts, eval_prompts = grpo_prompts(g, cfg.data.dir, tokenizer)
    if router:
        router.load_eval_prompts(g, cfg.data.dir, tokenizer)

    # ---- policy, reference, sampler, optimizer --------------------------------------------
    torch.manual_seed(cfg.run.seed)
    policy = build_model(
        cfg.model,
        vocab_size=len(tokenizer),
        attn_implementation=cfg.perf.attn_implementation,
        device=rt.device,
        compute_dtype=rt.autocast_dtype,
    )
    if len(tokenizer) > policy.config.vocab_size:
        raise UserError(
            f"tokenizer has {len(tokenizer)} entries, the model only {policy.config.vocab_size}"
        )
    align_special_tokens(policy, tokenizer)
    if note := fit_attention(policy, rt.device, rt.autocast_dtype):
        rt.chosen.append(note)
    if lora:
        policy = apply_lora(policy, cfg.model.lora)
    elif routed:  # retain and forget adapters, both trained
        policy = apply_routing(policy, g.routing)
    if not quantized:  # a quantized base was loaded onto the device (bitsandbytes cannot move)
        policy.to(rt.device)
    # as DDP starts: rank 0's weights on every rank (a quantized base is the same file on each)
    grpo_ranks.broadcast_weights(policy, d, trainable_only=quantized)
    if cfg.perf.grad_checkpointing:
        policy.activation_checkpointing_enable()  # the name since transformers 5
    eos = tokenizer.eos_token_id
    sampler = Sampler(policy, eos_token_id=eos, pad_token_id=eos)
    no_replay = replay_blocker(
        policy,
        sampler,
        enabled=g.replay,
        autocast=rt.autocast_dtype is not None,
        batch_size=tc.batch_size,
        max_new_tokens=g.max_completion_length,
    )
    no_replay = no_replay or (router.replay_blocker() if router else None)
    micro = grpo_accum.micro_batches(tc.batch_size // d.world, g.num_generations, tc.grad_accum)
    if len(micro) > 1 and no_replay is None:  # the record holds the whole batch's activations
        no_replay = f"train.grad_accum={tc.grad_accum} (micro-batches)"
    reference = build_reference(policy, lora or routed, g.ref_on_cpu) if g.beta > 0 else None
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = make_adamw(
        [{"params": trainable, "weight_decay": oc.weight_decay}],
        rt,
        oc.lr,
        (oc.beta1, oc.beta2),
        oc.eps,
    )
    loss_options = grpo_loss.options(g)
    total_params, _ = count_parameters(policy)
    n_trainable = sum(p.numel() for p in trainable)
    pool = RewardPool(cfg.reward, workers=g.reward_workers, timeout_s=g.reward_timeout_s)
    try:  # the rewards, tried on a few base-model completions before anything is written
        distributed.rank0_decides(
            lambda: _evaluate(
                sampler, policy, eval_prompts[:REWARD_CHECK], g, pool, tokenizer, cfg.run.seed
            ),
            d,
        )
    except BaseException:
        pool.close()
        raise

    # ---- run directory and resume (rank 0 writes it; every rank resumes alike) -------------
    run, finished = scaffold.open_run(run_dir_for(cfg), cfg, "grpo", d)
    if finished is not None:
        pool.close()
        distributed.teardown(d)
        return finished
    log = run.log if run else (lambda *a, **k: None)
    log(rt.describe(), echo=True)
    state = checkpoints.resume(run, policy, optimizer, rt.scaler, lora, dist=d)
    step, history = int(state.get("step", 0)), list(state.get("reward_history", []))
    train_seconds = float(state.get("train_seconds", 0.0))  # the steps' time, for max_time
    watch = RLWatch(cfg.failure, state.get("flags"))
    watch.streak = int(state.get("rl_streak", 0))
    per_fn_cols = [f"reward/{r.key}" for r in rewards] if len(rewards) > 1 else []
    route_cols = routing.COLUMNS if routed else []
    kind = "LoRA r" + str(cfg.model.lora.r) if lora else "full"
    if routed:
        kind = (
            f"routing {g.routing.mode}, r{g.routing.retain_r} retain + r{g.routing.forget_r} forget"
        )
    if run:
        run.open_metrics(
            COLUMNS + per_fn_cols + route_cols, resume_step=step if run.resume_from else None
        )
        run.log(
            f"policy {cfg.model.path or cfg.model.preset}: {total_params:,} parameters, "
            f"{n_trainable:,} trainable ({kind}); "
            f"sampler {sampler.backend}; rewards {', '.join(r.key for r in rewards)}; policy "
            f"forward {'replayed from the decode' if no_replay is None else f'computed ({no_replay})'}",
            echo=True,
        )
        run.update_summary(
            status="running",
            params_total=total_params,
            params_trainable=n_trainable,
            device=str(rt.device),
            sampler=sampler.backend,
            world_size=d.world,
        )

    prompts_per_step = tc.batch_size // g.num_generations
    progress = Progress(tc.max_steps, enabled=d.main, start=step, label="grpo")
    status, evidence = "completed", None
    eval_reward = base_eval = None
    interrupts = grpo_ranks.Interrupts(d)  # torchrun: SIGINT sets a flag, see `leave`
    try:
        if run and step == 0 and tc.eval_interval:
            base_eval = _evaluate(sampler, policy, eval_prompts, g, pool, tokenizer, cfg.run.seed)
            run.update_summary(base_eval_reward=base_eval["reward_mean"])
            run.log(f"base model: eval reward {base_eval['reward_mean']:.3f}", echo=True)
        if router and step == 0 and router.due(0, tc.max_steps):
            _route_eval(run, router, 0, sampler, policy, g, pool, tokenizer)
        while step < tc.max_steps:
            out_of_time = bool(tc.max_time) and train_seconds >= tc.max_time
            if why := grpo_ranks.leave(out_of_time, interrupts.flag, d):  # all ranks together
                if why == "interrupted":
                    status, evidence = "interrupted", f"interrupted at step {step}"
                break
            t0 = time.perf_counter()
            lr = lr_at(step, oc, tc.max_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr

            # 1. rollouts (this rank's prompt groups)
            picker = torch.Generator(device="cpu").manual_seed(stream_seed(cfg.run.seed, step, 0))
            pick = torch.randint(
                len(train_prompts), (prompts_per_step,), generator=picker, device="cpu"
            )
            mine = grpo_ranks.my_prompts(pick.tolist(), d)
            prompt_ids = [train_prompts[i] for i in mine for _ in range(g.num_generations)]
            policy.eval()
            sampler.load_weights(policy)
            r = sampler.generate(
                prompt_ids,
                g.max_completion_length,
                temperature=g.temperature,
                top_p=g.top_p,
                top_k=g.top_k,
                seed=grpo_ranks.rollout_seed(cfg.run.seed, step, d),
                record=no_replay is None,
            )
            t_gen = time.perf_counter()

            # 2. rewards, then advantages over the whole batch (all ranks' groups)
            completions, prompts_txt = r.completion_texts(tokenizer), r.prompt_texts(tokenizer)
            total, per_fn = pool(prompts_txt, completions, r.completion_rows())
            if router:  # eligibility (before advantages), detector flags, this step's routes
                picked = [i for i in mine for _ in range(g.num_generations)]
                total = router.score(
                    step, picked, total, per_fn, prompts_txt, completions, r.completion_rows()
                )
            mask = r.completion_mask.clone()
            if g.mask_truncated_completions:
                mask[r.truncated] = 0
            batch = grpo_ranks.gather(total, per_fn, prompts_txt, completions, r, mask, d)
            advantages = group_advantages(batch.total, g.num_generations, g.scale_rewards)
            advantages = advantages[batch.rows].to(rt.device)
            release_cache(rt.device)  # MPS: the decode's temporaries, before the training pass
            t_rew = time.perf_counter()

            # 3. reference log-probs (no grad)
            ref_logp = reference(r, g.temperature) if reference else None
            t_ref = time.perf_counter()

            # 4. policy update(s): the first pass replays the decode when it can
            policy.train()
            for it in range(g.num_iterations):  # loss and backward per micro-batch, one step
                loss, stats = grpo_ranks.loss_backward(
                    policy,
                    r,
                    advantages,
                    mask,
                    r.logprobs if g.num_iterations > 1 else None,
                    ref_logp,
                    micro,
                    d,
                    trainable,
                    temperature=g.temperature,
                    loss_options=loss_options,
                    autocast=rt.autocast,
                    scaler=rt.scaler,
                    train_pass=functools.partial(
                        routing.train_pass, router, policy, step, advantages
                    ),
                )
                grad_norm = scaffold.optimizer_step(trainable, optimizer, rt.scaler, oc.grad_clip)
                if it == 0:
                    first_stats = stats
            synchronize(rt.device)
            t_end = time.perf_counter()
            step += 1
            train_seconds += t_end - t0

            # 5. metrics (of the whole batch), samples, evaluation, failure rules (rank 0's)
            total, completions = batch.total, batch.completions
            reward_mean = float(total.mean())
            history.append(reward_mean)
            # sampled -log p: unbiased
            entropy = -batch.logp_sum / batch.tokens if batch.tokens else 0.0
            row = metrics_row(
                step,
                t_start,
                lr,
                loss,
                total,
                g.num_generations,
                first_stats,
                entropy,
                batch.lengths,
                batch.truncated,
                grad_norm,
                completions,
                batch.per_fn,
                (t0, t_gen, t_rew, t_ref, t_end),
                rt.device,
            )
            if router:
                row.update(router.row)
            due = tc.eval_interval and (step % tc.eval_interval == 0 or step == tc.max_steps)
            if run and due:
                ev = _evaluate(sampler, policy, eval_prompts, g, pool, tokenizer, cfg.run.seed)
                eval_reward = ev["reward_mean"]
                row.update(eval_reward_mean=eval_reward, eval_unique_fraction=ev["unique_fraction"])
            if router and router.due(step, tc.max_steps):
                _route_eval(run, router, step, sampler, policy, g, pool, tokenizer)
            if run and (step % tc.log_interval == 0 or step == tc.max_steps or step == 1):
                run.metrics.append(row)
                run.append_samples(
                    {
                        "step": step,
                        "prompt": batch.prompts[i],
                        "completion": completions[i],
                        "reward": float(total[i]),
                    }
                    for i in range(min(g.log_samples, len(completions)))
                )
                progress.update(step, reward=reward_mean, kl=row["kl"], uniq=row["unique_fraction"])
                run.log(_line(row), echo=not progress.live)

            failure = distributed.broadcast_object(watch.new_failure(row, history, step), d)
            if failure:
                log(f"{failure.status}: {failure.evidence}", echo=True)
                if cfg.failure.action == "stop" or failure.status == "diverged":
                    status, evidence = failure.status, failure.evidence
                    break

            if run and tc.save_interval and step % tc.save_interval == 0 and step < tc.max_steps:
                checkpoints.save_state(
                    run,
                    step,
                    policy,
                    tokenizer,
                    optimizer,
                    rt.scaler,
                    tc.keep_last,
                    reward_history=history,
                    flags=watch.flags,
                    rl_streak=watch.streak,
                    train_seconds=train_seconds,
                )
        scaffold.check_replicas(run, d, policy, optimizer, rt.scaler)
    except KeyboardInterrupt:
        status, evidence = "interrupted", f"interrupted at step {step}"
    finally:
        interrupts.restore()
        progress.close()
        pool.close()

    # ---- wrap up (rank 0) ------------------------------------------------------------------
    tail = history[-cfg.failure.baseline_steps :]
    base, final = (history[0] if history else None), (sum(tail) / len(tail) if tail else None)
    summary = run and scaffold.finish(
        run,
        status,
        policy,
        tokenizer,
        f"{status}: {step} steps; reward {base} -> {final}",
        plots=cfg.run.plots,
        merged=lora and g.export_merged,
        evidence=evidence,
        flags=watch.flags,
        steps=step,
        base_reward=base,
        final_reward=final,
        base_eval_reward=base_eval["reward_mean"]
        if base_eval
        else run.read_summary().get("base_eval_reward"),
        final_eval_reward=eval_reward,
        train_seconds=train_seconds,
        wall_seconds=time.time() - t_start,
        seconds_per_step=train_seconds / max(step, 1),
    )
    distributed.teardown(d)
    if status == "interrupted":
        raise KeyboardInterrupt
    return summary or {}


@torch.no_grad()
def _evaluate(sampler, policy, prompts, g, pool, tokenizer, seed) -> dict:
    """Mean reward and diversity of one completion per held-out prompt (fixed seed)."""
    policy.eval()
    sampler.load_weights(policy)
    r = sampler.generate(
        prompts,
        g.max_completion_length,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        seed=stream_seed(seed, -1, 2),
    )
    release_cache(sampler.device)
    texts = r.completion_texts(tokenizer)
    total, _ = pool(r.prompt_texts(tokenizer), texts, r.completion_rows())
    return {
        "reward_mean": float(total.mean()),
        "unique_fraction": unique_fraction(texts),
        "samples": texts,
    }


def _route_eval(run, router, step, sampler, policy, g, pool, tokenizer) -> None:
    """Gradient routing's three adapter modes on fixed prompts, into routing_eval.jsonl."""
    rows = router.evaluate(step, sampler, policy, g, pool, tokenizer)
    run.append_routing_eval(rows)
    run.log(routing.eval_line(rows), echo=True)


def _line(row: dict) -> str:
    return (
        f"step {row['step']} | reward {row['reward_mean']:.3f} | kl {row['kl']:.4f} | "
        f"uniq {row['unique_fraction']:.2f} | len {row['completion_len']:.0f} | "
        f"{row['step_s']:.2f}s (gen {row['gen_s']:.2f} train {row['train_s']:.2f})"
    )
