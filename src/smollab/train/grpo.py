"""`smollab grpo`: GRPO for small causal LMs, full fine-tuning or LoRA, top to bottom.

One step: sample prompts -> roll out `num_generations` completions each with the lean sampler ->
score them -> group-relative advantages -> reference log-probs (lean, no grad) -> policy
forward/backward (`num_iterations` times, PPO-clipped) -> metrics and failure rules.
Prompts and sampling are seeded by (seed, step), so a resumed run replays the same batches.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from smollab.config import GRPOConfig, to_dict
from smollab.device import make_adamw, peak_memory_mb, setup_runtime, synchronize
from smollab.errors import UserError
from smollab.failures import degenerate, diverged_rl, stuck
from smollab.models.attention import fit_attention
from smollab.models.decode_record import DecodeRecord
from smollab.models.loading import (
    align_special_tokens,
    apply_lora,
    build_model,
    load_tokenizer_near,
    resolve_model_dir,
)
from smollab.models.presets import count_parameters
from smollab.rewards.pool import RewardPool
from smollab.rewards.registry import validate_specs
from smollab.runs import RunDir, default_run_dir, load_trainer_state
from smollab.train.diversity import mean_pairwise_jaccard, repetition, unique_fraction
from smollab.train.grpo_loss import group_advantages, grpo_loss
from smollab.train.progress import Progress
from smollab.train.prompts import file_prompts, story_prompts
from smollab.train.replay import RECORD_BUDGET_ELEMS, replay_logprobs, replay_unsupported
from smollab.train.rollout import Rollout, Sampler
from smollab.train.schedule import lr_at
from smollab.train.token_logprobs import logprobs, policy_logprobs

COLUMNS = ["step", "wall_s", "lr", "loss", "reward_mean", "reward_std", "kl", "entropy",
           "completion_len", "truncated_frac", "clip_frac", "grad_norm", "unique_fraction",
           "jaccard", "repetition", "eval_reward_mean", "eval_unique_fraction", "gen_s", "reward_s", "ref_s",
           "train_s", "step_s", "peak_mem_mb"]  # fmt: skip


def run_dir_for(cfg: GRPOConfig) -> Path:
    if cfg.run.dir:
        return Path(cfg.run.dir)
    rewards = "+".join(r.name.split(":")[-1] for r in cfg.reward)
    kind = f"lora{cfg.model.lora.r}" if cfg.model.lora.enabled else "full"
    return default_run_dir("grpo", [cfg.run.name or rewards, kind, f"lr{cfg.optim.lr:g}",
                                    f"beta{cfg.grpo.beta:g}", f"s{cfg.run.seed}"])  # fmt: skip


def _seeded(seed: int, step: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(hash((seed, step, salt)) & 0x7FFF_FFFF_FFFF)


def make_reference(policy, lora: bool, on_cpu: bool):
    """`fn(rollout, temperature) -> ref log-probs`, for the KL penalty.

    LoRA: the base with adapters off (no second model: the lean copy reads the base weights).
    Full FT: a frozen lean copy of the starting policy, optionally on the CPU. Models the lean
    forward does not cover use a frozen HF copy (full FT) or the PEFT model with adapters off.
    """
    import copy

    from smollab.models.hf_weights import unwrap_hf
    from smollab.models.lean_llama import LeanLlama, check_lean_compatible

    try:
        check_lean_compatible(unwrap_hf(policy).config)
        frozen = LeanLlama.from_hf(policy, adapters=False, device="cpu" if on_cpu else None)
    except (TypeError, NotImplementedError):
        frozen = None if lora else copy.deepcopy(policy).requires_grad_(False).eval()
        if frozen is not None and on_cpu:
            frozen.to("cpu")

    def ref_logprobs(r: Rollout, temperature: float) -> torch.Tensor:
        P = r.prompt_ids.shape[1]
        with torch.inference_mode():
            if frozen is None:
                with policy.disable_adapter():
                    out = logprobs(policy, r.input_ids, r.attention_mask, P, temperature)
            else:
                dev = next(frozen.parameters()).device
                out = logprobs(
                    frozen, r.input_ids.to(dev), r.attention_mask.to(dev), P, temperature
                )
        return out.to(r.completion_ids.device).clone()

    return ref_logprobs


def _no_replay(policy, sampler: Sampler, g, batch_size: int, rt) -> str | None:
    """Why each batch's first policy forward is computed rather than replayed (None: replayed)."""
    if not g.replay:
        return "grpo.replay=false"
    if sampler.lean is None:
        return "HF sampler"
    if rt.autocast_dtype is not None:
        return "autocast"
    n = DecodeRecord.elements(sampler.lean, batch_size, g.max_completion_length)
    if n > RECORD_BUDGET_ELEMS:
        return f"a decode record of {n:,} numbers is over the budget"
    return replay_unsupported(policy)


def _texts(tokenizer, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    rows = [row[: int(m.sum())].tolist() for row, m in zip(ids, mask, strict=True)]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


def train(cfg: GRPOConfig) -> dict:
    t_start = time.time()
    g, fc, tc, oc = cfg.grpo, cfg.failure, cfg.train, cfg.optim
    rewards = validate_specs(cfg.reward)  # bad reward names or params fail before any work
    rt = setup_runtime(cfg.perf)

    # ---- tokenizer and prompts ----------------------------------------------------------
    tok_dir = resolve_model_dir(cfg.model.path) if cfg.model.path else None
    if tok_dir is not None and Path(str(tok_dir)).joinpath("tokenizer_config.json").exists():
        tokenizer = load_tokenizer_near(tok_dir)
    else:
        from smollab.data.prepare import load_meta, prepare

        if (Path(cfg.data.dir) / "meta.json").exists():
            load_meta(cfg.data.dir)  # checks the prepared directory
        else:
            prepare(cfg.data)
        tokenizer = load_tokenizer_near(Path(cfg.data.dir) / "tokenizer")
    if g.prompts_file:
        train_prompts = eval_prompts = file_prompts(g.prompts_file, tokenizer)
    else:
        train_prompts = story_prompts(cfg.data.dir, "train", tokenizer, g.prompt_tokens, 20_000)
        eval_prompts = story_prompts(
            cfg.data.dir, "test", tokenizer, g.prompt_tokens, g.eval_prompts
        )
    eval_prompts = eval_prompts[: g.eval_prompts]

    # ---- policy, reference, sampler, optimizer --------------------------------------------
    torch.manual_seed(cfg.run.seed)
    policy = build_model(cfg.model, vocab_size=len(tokenizer),
                         attn_implementation=cfg.perf.attn_implementation)  # fmt: skip
    if len(tokenizer) > policy.config.vocab_size:
        raise UserError(
            f"tokenizer has {len(tokenizer)} entries, the model only {policy.config.vocab_size}"
        )
    align_special_tokens(policy, tokenizer)
    if note := fit_attention(policy, rt.device, rt.autocast_dtype):
        rt.chosen.append(note)
    if cfg.model.lora.enabled:
        policy = apply_lora(policy, cfg.model.lora)
    policy.to(rt.device)
    if cfg.perf.grad_checkpointing:
        policy.gradient_checkpointing_enable()
    eos = tokenizer.eos_token_id
    sampler = Sampler(policy, eos_token_id=eos, pad_token_id=eos)
    no_replay = _no_replay(policy, sampler, g, tc.batch_size, rt)
    reference = make_reference(policy, cfg.model.lora.enabled, g.ref_on_cpu) if g.beta > 0 else None
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = make_adamw([{"params": trainable, "weight_decay": oc.weight_decay}], rt, oc.lr,
                           (oc.beta1, oc.beta2), oc.eps)  # fmt: skip
    total_params, _ = count_parameters(policy)
    n_trainable = sum(p.numel() for p in trainable)
    pool = RewardPool(cfg.reward, workers=g.reward_workers)

    # ---- run directory and resume ---------------------------------------------------------
    run = RunDir.start(run_dir_for(cfg), to_dict(cfg), cfg.run.resume, "grpo")
    if run.already_done:
        summary = run.read_summary()
        print(f"run {run.path} already {summary['status']}; nothing to do", flush=True)
        run.close()
        pool.close()
        return summary
    run.log(rt.describe(), echo=True)
    step, history, flags = 0, [], {}
    if run.resume_from:
        state = load_trainer_state(run.resume_from)
        _load_weights(policy, run.resume_from, cfg.model.lora.enabled)
        optimizer.load_state_dict(state["optimizer"])
        step, history = int(state["step"]), list(state["reward_history"])
        flags = json.loads(state.get("flags", "{}"))
        run.log(f"resumed from {run.resume_from.name} at step {step}", echo=True)
    per_fn_cols = [f"reward/{r.key}" for r in rewards] if len(rewards) > 1 else []
    run.open_metrics(COLUMNS + per_fn_cols, resume_step=step if run.resume_from else None)
    run.log(f"policy {cfg.model.path or cfg.model.preset}: {total_params:,} parameters, "
            f"{n_trainable:,} trainable ({'LoRA r' + str(cfg.model.lora.r) if cfg.model.lora.enabled else 'full'}); "
            f"sampler {sampler.backend}; rewards {', '.join(r.key for r in rewards)}; policy forward "
            f"{'replayed from the decode' if no_replay is None else f'computed ({no_replay})'}",
            echo=True)  # fmt: skip
    run.update_summary(status="running", params_total=total_params, params_trainable=n_trainable,
                       device=str(rt.device), sampler=sampler.backend)  # fmt: skip

    prompts_per_step = tc.batch_size // g.num_generations
    progress = Progress(tc.max_steps, start=step, label="grpo")
    samples_file = open(run.path / "samples.jsonl", "a")
    status, evidence, streak = "completed", None, 0
    eval_reward = base_eval = None
    try:
        if step == 0 and tc.eval_interval:
            base_eval = _evaluate(sampler, policy, eval_prompts, g, pool, tokenizer, cfg.run.seed)
            run.update_summary(base_eval_reward=base_eval["reward_mean"])
            run.log(f"base model: eval reward {base_eval['reward_mean']:.3f}", echo=True)
        while step < tc.max_steps:
            if tc.max_time and time.time() - t_start >= tc.max_time:
                break
            t0 = time.perf_counter()
            lr = lr_at(step, oc, tc.max_steps)
            for group in optimizer.param_groups:
                group["lr"] = lr

            # 1. rollouts
            pick = torch.randint(
                len(train_prompts), (prompts_per_step,), generator=_seeded(cfg.run.seed, step, 0)
            )
            prompt_ids = [train_prompts[i] for i in pick.tolist() for _ in range(g.num_generations)]
            policy.eval()
            sampler.load_weights(policy)
            r = sampler.generate(prompt_ids, g.max_completion_length, temperature=g.temperature,
                                 top_p=g.top_p, top_k=g.top_k,
                                 generator=_seeded(cfg.run.seed, step, 1),
                                 record=no_replay is None)  # fmt: skip
            t_gen = time.perf_counter()

            # 2. rewards and advantages
            completions = _texts(tokenizer, r.completion_ids, r.completion_mask)
            prompts_txt = _texts(tokenizer, r.prompt_ids, r.prompt_mask)
            comp_ids = [
                row[: int(m.sum())].tolist()
                for row, m in zip(r.completion_ids, r.completion_mask, strict=True)
            ]
            total, per_fn = pool(prompts_txt, completions, comp_ids)
            advantages = group_advantages(total, g.num_generations, g.scale_rewards).to(rt.device)
            mask = r.completion_mask.clone()
            if g.mask_truncated_completions:
                mask[r.truncated] = 0
            t_rew = time.perf_counter()

            # 3. reference log-probs (no grad)
            ref_logp = reference(r, g.temperature) if reference else None
            t_ref = time.perf_counter()

            # 4. policy update(s)
            policy.train()
            for it in range(g.num_iterations):
                with rt.autocast():
                    if it == 0 and r.record is not None:  # the weights that sampled r
                        logp = replay_logprobs(policy, r, g.temperature)
                    else:
                        logp = policy_logprobs(policy, r, g.temperature)
                loss, stats = grpo_loss(logp, r.logprobs if g.num_iterations > 1 else None, ref_logp,
                                        advantages, mask, beta=g.beta, epsilon=g.epsilon,
                                        epsilon_high=g.epsilon_high, loss_type=g.loss_type,
                                        max_completion_length=g.max_completion_length)  # fmt: skip
                (rt.scaler.scale(loss) if rt.scaler else loss).backward()
                if rt.scaler:
                    rt.scaler.unscale_(optimizer)
                grad_norm = torch.nn.utils.clip_grad_norm_(trainable, oc.grad_clip or math.inf)
                if rt.scaler:
                    rt.scaler.step(optimizer)
                    rt.scaler.update()
                else:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if it == 0:
                    first_stats = stats
            r.record = None  # ~70 MB at the 1.25M recipe's shape: free before the next batch
            synchronize(rt.device)
            t_end = time.perf_counter()
            step += 1

            # 5. metrics, samples, evaluation, failure rules
            m = mask.bool()
            reward_mean = float(total.mean())
            history.append(reward_mean)
            row = dict(step=step, wall_s=time.time() - t_start, lr=lr, loss=loss.item(),
                       reward_mean=reward_mean, reward_std=float(total.std()),
                       kl=first_stats.get("kl", 0.0),
                       entropy=float(-r.logprobs[m].mean()) if m.any() else 0.0,  # sampled -log p: unbiased
                       completion_len=float(r.completion_lengths.float().mean()),
                       truncated_frac=float(r.truncated.float().mean()),
                       clip_frac=first_stats["clip_region"], grad_norm=float(grad_norm),
                       unique_fraction=unique_fraction(completions),
                       jaccard=mean_pairwise_jaccard(completions),
                       repetition=repetition(completions),
                       gen_s=t_gen - t0, reward_s=t_rew - t_gen, ref_s=t_ref - t_rew,
                       train_s=t_end - t_ref, step_s=t_end - t0,
                       peak_mem_mb=peak_memory_mb(rt.device))  # fmt: skip
            if len(per_fn) > 1:
                row.update({f"reward/{k}": float(v.mean()) for k, v in per_fn.items()})
            if tc.eval_interval and (step % tc.eval_interval == 0 or step == tc.max_steps):
                ev = _evaluate(sampler, policy, eval_prompts, g, pool, tokenizer, cfg.run.seed)
                eval_reward = ev["reward_mean"]
                row.update(eval_reward_mean=eval_reward, eval_unique_fraction=ev["unique_fraction"])
            if step % tc.log_interval == 0 or step == tc.max_steps or step == 1:
                run.metrics.append(row)
                for i in range(min(g.log_samples, len(completions))):
                    samples_file.write(json.dumps({"step": step, "prompt": prompts_txt[i],
                                                   "completion": completions[i],
                                                   "reward": float(total[i])}) + "\n")  # fmt: skip
                samples_file.flush()
                progress.update(step, reward=reward_mean, kl=row["kl"], uniq=row["unique_fraction"])
                run.log(_line(row), echo=not progress.live)

            failure = diverged_rl(row["kl"], row["loss"], fc.max_kl, step)
            deg = degenerate(row["unique_fraction"], row["jaccard"], row["repetition"], fc, step)
            streak = streak + 1 if deg else 0
            if failure is None and deg and streak >= fc.patience:
                failure = deg
            failure = failure or stuck(
                history, fc.baseline_steps, fc.stuck_grace_steps, fc.stuck_margin, step
            )
            if failure and failure.status not in flags:
                flags[failure.status] = failure.evidence
                run.log(f"{failure.status}: {failure.evidence}", echo=True)
                if fc.action == "stop" or failure.status == "diverged":
                    status, evidence = failure.status, failure.evidence
                    break

            if step % tc.save_interval == 0 and step < tc.max_steps:
                state = dict(optimizer=optimizer.state_dict(), step=step,
                             reward_history=history, flags=json.dumps(flags))  # fmt: skip
                run.save_checkpoint(f"step_{step}", policy, tokenizer, state, tc.keep_last)
    except KeyboardInterrupt:
        status, evidence = "interrupted", f"interrupted at step {step}"
    finally:
        progress.close()
        samples_file.close()
        pool.close()

    # ---- wrap up ------------------------------------------------------------------------
    if status != "interrupted":
        run.save_checkpoint("final", policy, tokenizer)
        if cfg.model.lora.enabled and g.export_merged:
            run.save_checkpoint("final_merged", policy.merge_and_unload(), tokenizer)
    tail = history[-fc.baseline_steps :]
    summary = run.update_summary(
        status=status, evidence=evidence, flags=flags, steps=step,
        base_reward=history[0] if history else None,
        final_reward=sum(tail) / len(tail) if tail else None,
        base_eval_reward=base_eval["reward_mean"] if base_eval else run.read_summary().get("base_eval_reward"),
        final_eval_reward=eval_reward, wall_seconds=time.time() - t_start,
        seconds_per_step=(time.time() - t_start) / max(step, 1),
    )  # fmt: skip
    run.log(f"{status}: {step} steps; reward {summary['base_reward']} -> {summary['final_reward']}",
            echo=True)  # fmt: skip
    from smollab.report.plots import plot_run

    plot_run(run.path)
    run.close()
    print(f"run directory: {run.path}", flush=True)
    if status == "interrupted":
        raise KeyboardInterrupt
    return summary


@torch.no_grad()
def _evaluate(sampler, policy, prompts, g, pool, tokenizer, seed) -> dict:
    """Mean reward and diversity of one completion per held-out prompt (fixed seed)."""
    policy.eval()
    sampler.load_weights(policy)
    r = sampler.generate(prompts, g.max_completion_length, temperature=g.temperature,
                         top_p=g.top_p, top_k=g.top_k, generator=_seeded(seed, -1, 2))  # fmt: skip
    texts = _texts(tokenizer, r.completion_ids, r.completion_mask)
    ids = [
        row[: int(m.sum())].tolist()
        for row, m in zip(r.completion_ids, r.completion_mask, strict=True)
    ]
    total, _ = pool(_texts(tokenizer, r.prompt_ids, r.prompt_mask), texts, ids)
    return {"reward_mean": float(total.mean()), "unique_fraction": unique_fraction(texts),
            "samples": texts}  # fmt: skip


def _load_weights(policy, ckpt: Path, lora: bool) -> None:
    from safetensors.torch import load_file, load_model

    if lora:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(policy, load_file(ckpt / "adapter_model.safetensors"))
    else:
        load_model(policy, ckpt / "model.safetensors", strict=False)


def _line(row: dict) -> str:
    return (f"step {row['step']} | reward {row['reward_mean']:.3f} | kl {row['kl']:.4f} | "
            f"uniq {row['unique_fraction']:.2f} | len {row['completion_len']:.0f} | "
            f"{row['step_s']:.2f}s (gen {row['gen_s']:.2f} train {row['train_s']:.2f})")  # fmt: skip
