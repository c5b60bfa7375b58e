"""One GRPO step of every run a process trains: `smollab grpo` (one run; under torchrun this
rank's share of it) and `smollab lanes grpo` (every lane at once), top to bottom.

sample each run's prompts -> roll out `num_generations` completions each (one sampler call) ->
score them (one reward call) -> group-relative advantages per run over its whole batch ->
reference log-probs (no grad) of the runs with a KL term -> the policy update(s): each run's loss
and backward (`update.loss_backward`, `num_iterations` passes, PPO-clipped, in `train.grad_accum`
micro-batches), each run's optimizer step -> per run: metrics, evaluation, the after-step block.
With `grpo.steps_per_generation` = k x `train.grad_accum` (one run, one process) the first
three happen every k steps for k steps' completions, and each step trains on its own slice.
Prompts and samples are seeded by each run's (seed, step) (prompts: each epoch's permutation of
them, `prompts.PromptOrder`), so a resumed run replays the same batches, mid-epoch too, and a lane
draws exactly what its run alone would: prompts are picked on the CPU,
completions drawn on the policy's device by generators the sampler makes there from the seeds.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

from smollab.device.runtime import peak_memory_mb, synchronize
from smollab.engine.rollout import Rollout
from smollab.train import scaffold
from smollab.train.diversity import mean_pairwise_jaccard, repetition, unique_fraction
from smollab.train.grpo import ranks
from smollab.train.grpo.loss import (
    frac_reward_zero_std,
    group_advantages,
    multi_objective_advantages,
)
from smollab.train.grpo.policies import Policies
from smollab.train.grpo.routing import eval_line
from smollab.train.grpo.run_state import RunState, Update
from smollab.train.grpo.setup import Shared
from smollab.train.grpo.update import Batch, RunRows, loss_backward
from smollab.train.seeds import stream_seed  # salts: prompts 0, rollouts 1, evaluation 2


@dataclass(frozen=True)
class StepTimes:
    """perf_counter marks of a step's phases."""

    start: float
    generated: float
    rewarded: float
    referenced: float
    trained: float


@dataclass
class Generation:
    """What a generated batch holds for its optimizer step(s): each run's rows of it here
    (`rows`) and of the whole batch across ranks (`whole`), and when it was made (`times`)."""

    r: Rollout
    mask: torch.Tensor  # [N, T] the loss mask
    batch: ranks.Whole
    advantages: torch.Tensor  # [N] this process's rows, on the device
    ref_logp: torch.Tensor | None
    rows: list[slice]
    whole: list[slice]
    times: tuple[float, float, float, float]  # start, generated, rewarded, referenced

    def part(self, j: int, size: int) -> Generation:
        """The rows of its j-th optimizer step of `size` completions (one run, one process:
        `steps_per_generation` > `train.grad_accum`), timed as generated at no cost."""
        s = slice(j * size, (j + 1) * size)
        idx = torch.arange(s.start, s.stop, device=self.mask.device)
        now = time.perf_counter()
        return Generation(
            r=self.r.select(idx),
            mask=self.mask[s],
            batch=self.batch.select(s),
            advantages=self.advantages[s],
            ref_logp=None if self.ref_logp is None else self.ref_logp[s],
            rows=[slice(0, size)],
            whole=[slice(0, size)],
            times=(now, now, now, now),
        )


def step(shared: Shared, policies: Policies, runs: list[RunState]) -> None:
    """One step of every run in `runs` (see the module docstring)."""
    cfg, rt, d, tok = shared.cfg, shared.rt, shared.d, shared.tokenizer
    g, tc = cfg.grpo, cfg.train
    G = g.num_generations
    _before_first_step(shared, policies, runs)
    for run in runs:
        run.set_lr()
    # TRL's steps_per_generation: micro-batches per generated batch; k optimizer steps each
    # (one run in one process: the rules refuse k > 1 elsewhere)
    k = (g.steps_per_generation or tc.grad_accum) // tc.grad_accum
    if k == 1:
        gen = _generate(shared, policies, runs, tc.batch_size)
    else:
        (run,) = runs
        if run.generation is None or run.step % k == 0:  # a resume starts a new one
            run.generation = _generate(shared, policies, runs, k * tc.batch_size)
            gen = run.generation.part(run.step % k, tc.batch_size)
            gen.times = run.generation.times
        else:
            gen = run.generation.part(run.step % k, tc.batch_size)
    r, mask, batch, advantages, ref_logp = gen.r, gen.mask, gen.batch, gen.advantages, gen.ref_logp
    rows, whole = gen.rows, gen.whole
    t0, t_gen, t_rew, t_ref = gen.times  # a step that generated nothing: all when it began

    # 4. policy update(s): the first pass replays the decode when it can; every pass is one
    # optimizer step of each run
    forward = policies.forward(runs)
    router = runs[0].router  # gradient routing trains one run (lanes refuse it)
    train_pass = router and functools.partial(
        router.passes, runs[0].policy, runs[0].step, advantages
    )
    totals = [ranks.step_totals(mask[s], d) for s in rows]
    # TRL's num_items under steps_per_generation: the generated batch's tokens per optimizer step
    items = None if k == 1 else float(run.generation.mask.sum()) / k
    for it in range(g.num_iterations):
        old_logp = r.logprobs if g.num_iterations > 1 or k > 1 else None
        loss_rows = [  # the entropy bonus's coefficient as it stands before this pass
            RunRows(s, run.options, t, run.entropy.applied(), items)
            for run, s, t in zip(runs, rows, totals, strict=True)
        ]
        parts = loss_backward(
            forward,
            Batch(r, advantages, mask, old_logp, ref_logp),
            loss_rows,
            num_generations=G,
            grad_accum=tc.grad_accum,
            scaler=rt.scaler,
            train_pass=train_pass,
        )
        for run, s, (loss, stats) in zip(runs, rows, parts, strict=True):
            level = run.options.importance_sampling_level
            loss, stats = ranks.sum_over_ranks(loss, stats, mask[s], level, run.trainable, d)
            norm = scaffold.optimizer_step(
                run.trainable, run.optimizer, rt.scaler, run.cfg.optim.grad_clip
            )
            if "entropy_sum" in stats:  # the controller sees the step's tokens, all ranks'
                run.entropy.update(stats["entropy_sum"] / max(stats["entropy_tokens"], 1.0))
            if it == 0:  # the fresh batch's pass is the one reported
                run.update = Update(loss, stats, float(norm))
    synchronize(rt.device)
    t_end = time.perf_counter()

    # 5. per run: metrics (of its whole batch), evaluation, the after-step block
    times = StepTimes(t0, t_gen, t_rew, t_ref, t_end)
    for run, w in zip(runs, whole, strict=True):
        run.step += 1
        run.train_seconds += t_end - t0
        run.history.append(float(batch.total[w].mean()))
        run.row = metrics_row(run, batch, w, times, rt.device)
        if run.router:
            run.row.update(run.router.row)
    due = [run for run in runs if run.run is not None and run.due(run.cfg.train.eval_interval)]
    for run, ev in zip(due, evaluate(shared, policies, due) if due else [], strict=True):
        run.eval_reward = ev["reward_mean"]
        run.run.append_eval_prompts(run.step, ev["rewards"])
        run.row.update(
            eval_reward_mean=ev["reward_mean"], eval_unique_fraction=ev["unique_fraction"]
        )
    for run in runs:
        if run.router and run.router.due(run.step, run.max_steps):
            _route_eval(shared, policies, run)
    for run, w in zip(runs, whole, strict=True):
        run.after_step(batch, w, tok, d)


def _generate(shared: Shared, policies: Policies, runs: list[RunState], size: int) -> Generation:
    """Steps 1-3: `size` completions per run (whole prompt groups, torchrun: this rank's share),
    their rewards, advantages over each run's whole batch, reference log-probs."""
    cfg, rt, d, tok = shared.cfg, shared.rt, shared.d, shared.tokenizer
    g = cfg.grpo
    G = g.num_generations
    t0 = time.perf_counter()

    # 1. rollouts: each run's prompt groups (torchrun: this rank's share), one sampler call
    prompts, picked = [], []
    for run in runs:
        groups, steps = cfg.train.batch_size // G, size // cfg.train.batch_size
        pick = shared.order.pick(run.cfg.run.seed, run.step, groups, steps)
        mine = ranks.my_prompts(pick, d)
        run.columns = shared.sample_columns([i for i in pick for _ in range(G)])  # samples.jsonl
        picked += [i for i in mine for _ in range(G)]
        prompts += [shared.train_prompts[i] for i in mine for _ in range(G)]
    seeds = [ranks.rollout_seed(run.cfg.run.seed, run.step, d) for run in runs]
    r = policies.generate(runs, prompts, seeds, record=policies.no_replay is None)
    # each phase's time in its own column: an accelerator's queued kernels finish before the mark
    synchronize(rt.device)
    t_gen = time.perf_counter()

    # 2. rewards in one call (routing: eligibility, flags, routes), advantages per run over its
    # whole batch (every rank's groups)
    completions, prompt_texts = r.completion_texts(tok), r.prompt_texts(tok)
    token_rows = r.completion_rows()
    total, per_fn = shared.pool(prompt_texts, completions, token_rows, shared.rows(picked))
    n = len(prompts) // len(runs)
    rows = [slice(i * n, (i + 1) * n) for i in range(len(runs))]  # each run's rows here
    for run, s in zip(runs, rows, strict=True):
        if run.router:
            total[s] = run.router.score(
                run.step,
                picked=picked[s],
                total=total[s],
                per_fn={k: v[s] for k, v in per_fn.items()},
                prompts=prompt_texts[s],
                completions=completions[s],
                rows=token_rows[s],
            )
    mask = r.completion_mask.clone()
    if g.mask_truncated_completions:
        mask[r.truncated] = 0
    batch = ranks.gather(
        r, mask, d, total=total, per_fn=per_fn, prompts=prompt_texts, completions=completions
    )
    whole = [slice(i * size, (i + 1) * size) for i in range(len(runs))]
    advantages = torch.cat(
        [
            _advantages(run, batch, w, shared.pool.weights)
            for run, w in zip(runs, whole, strict=True)
        ]
    )
    advantages = advantages[batch.rows].to(rt.device)
    synchronize(rt.device)
    t_rew = time.perf_counter()

    # 3. reference log-probs (no grad) of the rows of the runs with a KL term
    ref_logp = _reference_logprobs(policies, r, runs, rows, g.temperature)
    synchronize(rt.device)
    t_ref = time.perf_counter()
    return Generation(r, mask, batch, advantages, ref_logp, rows, whole, (t0, t_gen, t_rew, t_ref))


def metrics_row(
    run: RunState, batch: ranks.Whole, rows: slice, times: StepTimes, device: torch.device
) -> dict:
    """One step's metrics row of a run (COLUMNS, then `reward/<fn>` with several reward
    functions): its whole batch's rewards and completions, its first pass's loss and stats."""
    total, completions, up = batch.total[rows], batch.completions[rows], run.update
    row = dict(
        step=run.step,
        wall_s=time.time() - run.started,
        lr=run.optimizer.param_groups[0]["lr"],
        loss=up.loss,
        reward_mean=float(total.mean()),
        reward_std=float(total.std()),
        frac_reward_zero_std=run.frac_zero_std,
        kl=up.stats.get("kl", 0.0),
        entropy=up.stats["entropy"] if "entropy" in up.stats else batch.entropy(rows),
        completion_len=float(batch.lengths[rows].float().mean()),
        truncated_frac=float(batch.truncated[rows].float().mean()),
        clip_frac=up.stats["clip_region"],
        clip_low=up.stats["clip_low"],
        clip_high=up.stats["clip_high"],
        clip_low_min=up.stats["clip_low_min"],
        clip_high_max=up.stats["clip_high_max"],
        entropy_coef=run.entropy.coef,
        grad_norm=up.grad_norm,
        unique_fraction=unique_fraction(completions),
        jaccard=mean_pairwise_jaccard(completions),
        repetition=repetition(completions),
        gen_s=times.generated - times.start,
        reward_s=times.rewarded - times.generated,
        ref_s=times.referenced - times.rewarded,
        train_s=times.trained - times.referenced,
        step_s=times.trained - times.start,
        peak_mem_mb=peak_memory_mb(device),
    )
    if len(batch.per_fn) > 1:
        row.update({f"reward/{k}": float(v[rows].mean()) for k, v in batch.per_fn.items()})
    return row


@torch.no_grad()
def evaluate(shared: Shared, policies: Policies, runs: list[RunState]) -> list[dict]:
    """Each run's mean reward and diversity on the held-out prompts (one completion each), and
    each prompt's reward, in one sampler call, each run drawing from its own fixed evaluation
    stream."""
    n, tok = len(shared.eval_prompts), shared.tokenizer
    seeds = [stream_seed(run.cfg.run.seed, -1, 2) for run in runs]
    r = policies.generate(runs, shared.eval_prompts * len(runs), seeds)
    texts = r.completion_texts(tok)
    total, _ = shared.pool(
        r.prompt_texts(tok), texts, r.completion_rows(), shared.eval_rows(len(runs))
    )
    return [
        {
            "reward_mean": float(total[i * n : (i + 1) * n].mean()),
            "rewards": total[i * n : (i + 1) * n].tolist(),
            "unique_fraction": unique_fraction(texts[i * n : (i + 1) * n]),
        }
        for i in range(len(runs))
    ]


def _advantages(
    run: RunState, batch: ranks.Whole, rows: slice, weights: dict[str, float]
) -> torch.Tensor:
    """A run's advantages over its whole batch (and its `frac_reward_zero_std`, kept for its row):
    from the weighted total (as gradient routing's retain_advantage reshapes them), or with
    `normalize_then_sum` from each reward's own values."""
    g = run.cfg.grpo
    G, total = g.num_generations, batch.total[rows]
    if g.multi_objective_aggregation == "normalize_then_sum":
        per_fn = torch.stack([batch.per_fn[k][rows] for k in weights], 1)
        advantages, run.frac_zero_std = multi_objective_advantages(
            per_fn, torch.tensor(list(weights.values())), G, g.scale_rewards, "normalize_then_sum"
        )
        return advantages
    run.frac_zero_std = frac_reward_zero_std(total, G, g.scale_rewards)
    advantages = group_advantages(total, G, g.scale_rewards)
    return (
        run.router.advantages(total, advantages, G, g.scale_rewards) if run.router else advantages
    )


def _before_first_step(shared: Shared, policies: Policies, runs: list[RunState]) -> None:
    """The base model's evaluation and (gradient routing) its adapter modes', once per run."""
    fresh = [run for run in runs if run.base_eval_due]
    for run, ev in zip(fresh, evaluate(shared, policies, fresh) if fresh else [], strict=True):
        run.record_base_eval(ev["reward_mean"])
        run.run.append_eval_prompts(0, ev["rewards"])
    for run in runs:
        if run.router and run.step == 0 and run.router.due(0, run.max_steps):
            _route_eval(shared, policies, run)


def _route_eval(shared: Shared, policies: Policies, run: RunState) -> None:
    """Gradient routing's three adapter modes on fixed prompts, into routing_eval.jsonl."""
    rows = run.router.evaluate(
        run.step, policies.sampler, run.policy, shared.cfg.grpo, shared.pool, shared.tokenizer
    )
    run.run.append_routing_eval(rows)
    run.run.log(eval_line(rows), echo=True)


def _reference_logprobs(
    policies: Policies, r: Rollout, runs: list[RunState], rows: list[slice], temperature: float
) -> torch.Tensor | None:
    """The reference's log-probs of the rows of the runs with a KL term (the others' rows stay
    0 and are never read), or None when no run has one."""
    need = [run.options.beta > 0 for run in runs]
    if not any(need):
        return None
    reference = policies.reference()
    if all(need):
        return reference(r, temperature)
    dev = r.logprobs.device
    idx = torch.cat(
        [torch.arange(s.start, s.stop, device=dev) for s, n in zip(rows, need, strict=True) if n]
    )
    out = torch.zeros_like(r.logprobs)
    out[idx] = reference(r.select(idx), temperature)
    return out
