"""`smollab lanes grpo`: many GRPO configurations (LoRA or full) trained as lanes of one batched
model.

One iteration takes one step of every lane, top to bottom like `train.grpo`: each lane picks its
prompts (its own seed and step, as a process run would) -> one sampler call decodes every lane's
completions through `LaneLlama` (each lane's rows through its own weights) -> one reward call
scores them all -> advantages per lane -> one reference pass (the base: the starting policy) over
the rows of the lanes with a KL term -> one policy forward with grad for all lanes, each lane's GRPO
loss on its rows (its own beta, clip and loss type), their sum backpropagated (a lane's rows
reach only its own weights, so each gradient is its own) -> per lane: clip, AdamW step with its own
LR schedule, metrics row, evaluation, failure rules, checkpoint. A lane that ends (its budget, a
failure rule, a stop request) leaves the batch; the others go on, and in worker mode (`inbox`)
the next posted trial takes its place.

Each lane writes its own run directory, as `smollab grpo` does (train/lanes.py). As there, the
first policy forward of a batch replays the sampler's decode (`lanes_logprobs`) instead of
recomputing it, unless `grpo.replay=false` or the record would not fit the budget.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

import torch

from smollab.config import GRPOConfig
from smollab.config.lanes import check_supported
from smollab.config.load import flatten, load_config, to_dict
from smollab.device.runtime import setup_runtime, synchronize
from smollab.engine.lane_llama import LaneLlama
from smollab.engine.replay import lanes_logprobs
from smollab.errors import RunFailed, UserError
from smollab.rundir.inbox import (
    EXIT_ENDED,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    Inbox,
    LaneTrial,
)
from smollab.rundir.runs import LOG
from smollab.train import crash_record, distributed, scaffold
from smollab.train import lanes as ln
from smollab.train.grpo import metrics_row, run_dir_for
from smollab.train.grpo_loss import group_advantages, grpo_loss
from smollab.train.schedule import lr_at
from smollab.train.seeds import stream_seed

IDLE_S = 0.2  # worker mode: how often an empty worker looks at its inbox


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
    queue = [(run_dir_for(c).name, c, run_dir_for(c)) for c in cfgs]
    for name, cfg, _ in queue:  # the lanes given: all refused before any work, in one line
        check_supported(flatten(to_dict(cfg)), name)
        ln.check_compatible(queue[0][1], cfg, name)
    dirs = [Path(d).resolve() for _, _, d in queue]
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
    first = queue[0][1]
    if distributed.setup(torch.device("cpu"))[0].enabled:
        raise UserError("lanes run in one process: start `smollab lanes` without torchrun")
    rt = setup_runtime(first.perf)
    shared = ln.Shared(first, rt)
    max_lanes = max_lanes or len(queue)
    print(rt.describe(), flush=True)
    lanes: list[ln.Lane] = []
    summaries: list[dict[str, Any]] = []
    try:
        while True:
            if box:  # new trials, and stop requests for running ones
                queue += _posted(box, seen, threads)
                for lane in lanes:
                    if lane.ended is None and (why := box.stop_reason(lane.name)) is not None:
                        lane.ended = ("interrupted", why or f"stopped at step {lane.step}")
            while queue and len(lanes) < max_lanes:
                lane = _open(shared, *queue.pop(0), box, summaries)
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
            _step(shared, lanes)
    except KeyboardInterrupt:
        for lane in lanes:
            lane.ended = ("interrupted", f"interrupted at step {lane.step}")
            summaries.append(_end(shared, lane, box))
        raise
    except Exception as e:
        evidence = crash_record.failure_line(e)
        for lane in lanes:
            lane.run.log(f"failed: {evidence}\n{''.join(traceback.format_exception(e)).rstrip()}")
            lane.run.update_summary(status="failed", evidence=evidence, steps=lane.step)
            lane.run.close()
            if box:
                box.ended(lane.name, EXIT_FAILED)
        if not lanes:
            raise
        raise RunFailed(evidence, lanes[0].run.path / LOG) from e
    finally:
        shared.pool.close()
    return summaries


def _posted(box: Inbox, seen: set[str], threads: int | None) -> list[tuple[str, GRPOConfig, Path]]:
    """The inbox's new trials as (name, config, run dir); a trial whose config is bad input ends
    at once (exit code 1, the reason in the worker's log) without touching the other lanes."""
    out = []
    for t in box.new_trials(seen):
        seen.add(t.name)
        try:
            cfg = _config(t, threads)
            check_supported(flatten(to_dict(cfg)), t.name)
            out.append((t.name, cfg, Path(t.run_dir)))
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


def _open(shared: ln.Shared, name, cfg, run_dir, box, summaries) -> ln.Lane | None:
    """A new lane, or None when its trial could not join (refused, or finished already)."""
    try:
        ln.check_compatible(shared.cfg, cfg, name)
        lane = ln.open_lane(name, cfg, shared.base, shared.rt, run_dir)
    except UserError as e:
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
    lane.run.open_metrics(shared.columns, resume_step=lane.step if lane.run.resume_from else None)
    forward = f"computed ({shared.no_replay})" if shared.no_replay else "replayed from the decode"
    kind = f"LoRA r{cfg.model.lora.r}" if cfg.model.lora.enabled else "full fine-tuning"
    lane.run.log(
        f"lane {name} of a lanes worker: policy {cfg.model.path or cfg.model.preset}, "
        f"{kind}; policy forward {forward}; sampler lanes",
        echo=True,
    )
    lane.run.update_summary(
        status="running",
        device=str(shared.rt.device),
        sampler="lanes",
        world_size=1,
        params_trainable=sum(p.numel() for p in lane.trainable),
    )
    return lane


def _end(shared: ln.Shared, lane: ln.Lane, box: Inbox | None) -> dict[str, Any]:
    summary = ln.finish(lane, shared.tokenizer)
    if box:
        code = EXIT_INTERRUPTED if summary.get("status") == "interrupted" else EXIT_ENDED
        box.ended(lane.name, code)
    return summary


def _step(shared: ln.Shared, lanes: list[ln.Lane]) -> None:
    """One GRPO step of every lane (see the module docstring)."""
    cfg, g = shared.cfg, shared.cfg.grpo
    G, B = g.num_generations, cfg.train.batch_size
    due_base = [
        la for la in lanes if la.step == 0 and la.cfg.train.eval_interval and la.base_eval is None
    ]
    for lane, ev in zip(due_base, shared.evaluate(due_base) if due_base else [], strict=True):
        lane.base_eval = ev["reward_mean"]
        lane.run.update_summary(base_eval_reward=lane.base_eval)
        lane.run.log(f"base model: eval reward {lane.base_eval:.3f}", echo=True)
    t0 = time.perf_counter()

    # 1. rollouts: each lane's prompts (its seed and step), all lanes in one sampler call
    prompts = []
    for lane in lanes:
        lr = lr_at(lane.step, lane.cfg.optim, lane.cfg.train.max_steps)
        for group in lane.optimizer.param_groups:
            group["lr"] = lr
        picker = torch.Generator().manual_seed(stream_seed(lane.cfg.run.seed, lane.step, 0))
        pick = torch.randint(len(shared.train_prompts), (B // G,), generator=picker)
        prompts += [shared.train_prompts[i] for i in pick.tolist() for _ in range(G)]
    seeds = [stream_seed(la.cfg.run.seed, la.step, 1) for la in lanes]  # as `smollab grpo` draws
    r = shared.generate(lanes, prompts, seeds, record=shared.no_replay is None)
    t_gen = time.perf_counter()

    # 2. rewards in one call, advantages per lane
    completions, prompts_txt = (
        r.completion_texts(shared.tokenizer),
        r.prompt_texts(shared.tokenizer),
    )
    total, per_fn = shared.pool(prompts_txt, completions, r.completion_rows())
    mask = r.completion_mask.clone()
    if g.mask_truncated_completions:
        mask[r.truncated] = 0
    rows = [slice(i * B, (i + 1) * B) for i in range(len(lanes))]
    advantages = torch.cat(
        [
            group_advantages(total[s], G, la.cfg.grpo.scale_rewards)
            for la, s in zip(lanes, rows, strict=True)
        ]
    ).to(shared.rt.device)
    t_rew = time.perf_counter()

    # 3. reference log-probs: the base, in one pass over the rows of the lanes with a KL term
    need_ref = [la.cfg.grpo.beta > 0 for la in lanes]
    ref_logp = None
    if all(need_ref):
        ref_logp = shared.reference(r, g.temperature)
    elif any(need_ref):  # the other lanes' rows are never read (`loss_backward`)
        dev = r.logprobs.device
        idx = torch.cat(
            [
                torch.arange(s.start, s.stop, device=dev)
                for s, need in zip(rows, need_ref, strict=True)
                if need
            ]
        )
        ref_logp = torch.zeros_like(r.logprobs)
        ref_logp[idx] = shared.reference(r.select(idx), g.temperature)
    t_ref = time.perf_counter()

    # 4. one forward and backward for all lanes; each lane's loss on its own rows
    stats: list[dict[str, float]] = []
    losses: list[float] = []
    norms: list[float] = []
    for it in range(g.num_iterations):
        old = r.logprobs if g.num_iterations > 1 else None
        parts = loss_backward(
            shared.lanes, lanes, r, advantages, mask, old, ref_logp, rows, g.temperature
        )
        step_norms = [
            float(scaffold.optimizer_step(la.trainable, la.optimizer, None, la.cfg.optim.grad_clip))
            for la in lanes
        ]
        if it == 0:
            losses, stats, norms = [p[0] for p in parts], [p[1] for p in parts], step_norms
    synchronize(shared.rt.device)
    t_end = time.perf_counter()

    # 5. per lane: metrics, samples, evaluation, failure rules, checkpoint
    due_eval = []
    for i, (lane, s) in enumerate(zip(lanes, rows, strict=True)):
        lane.step += 1
        lane.train_seconds += t_end - t0
        t, texts = total[s], completions[s]
        lane.history.append(float(t.mean()))
        entropy = float(-(r.logprobs[s] * mask[s]).sum() / mask[s].sum().clamp(min=1))
        lane.row = metrics_row(
            lane.step,
            lane.started,
            lane.optimizer.param_groups[0]["lr"],
            losses[i],
            t,
            G,
            stats[i],
            entropy,
            r.completion_lengths[s],
            r.truncated[s],
            norms[i],
            texts,
            {k: v[s] for k, v in per_fn.items()},
            (t0, t_gen, t_rew, t_ref, t_end),
            shared.rt.device,
        )
        tc = lane.cfg.train
        if tc.eval_interval and (lane.step % tc.eval_interval == 0 or lane.step == tc.max_steps):
            due_eval.append(lane)
    for lane, ev in zip(due_eval, shared.evaluate(due_eval) if due_eval else [], strict=True):
        lane.eval_reward = ev["reward_mean"]
        lane.row.update(
            eval_reward_mean=ev["reward_mean"], eval_unique_fraction=ev["unique_fraction"]
        )
    for lane, s in zip(lanes, rows, strict=True):
        _after_step(shared, lane, lane.row, prompts_txt[s], completions[s], total[s])
    if lanes[0].step % lanes[0].cfg.train.log_interval == 0 or lanes[0].step == 1:
        rewards = " ".join(f"{la.row['reward_mean']:.2f}" for la in lanes)
        print(
            f"lanes: {len(lanes)} at steps {lanes[0].step}..{lanes[-1].step} | reward {rewards} "
            f"| {t_end - t0:.2f}s (gen {t_gen - t0:.2f} train {t_end - t_ref:.2f})",
            flush=True,
        )


def loss_backward(
    model: LaneLlama,
    lanes: list[ln.Lane],
    r,
    advantages,
    mask,
    old_logp,
    ref_logp,
    rows: list[slice],
    temperature: float,
) -> list[tuple[float, dict]]:
    """Each lane's GRPO loss on its rows (its own loss options), from one forward through all
    lanes; their sum backpropagated, so each policy's `.grad` is its own loss's gradient.
    Returns (loss, stats) per lane."""
    model.load_lanes([la.policy for la in lanes])
    # replayed while the rollout holds the decode of these very weights, else computed
    logp = lanes_logprobs(model, r, temperature)
    r.record = None  # used once: the graph keeps what the backward needs
    parts = [
        grpo_loss(
            logp[s],
            None if old_logp is None else old_logp[s],
            # a lane with beta 0 has no reference, as its run alone (no kl measured)
            None if ref_logp is None or not la.loss_options["beta"] else ref_logp[s],
            advantages[s],
            mask[s],
            **la.loss_options,
        )
        for la, s in zip(lanes, rows, strict=True)
    ]
    sum(p[0] for p in parts).backward()
    return [(p[0].item(), p[1]) for p in parts]


def _after_step(shared: ln.Shared, lane: ln.Lane, row: dict, prompts, completions, total) -> None:
    tc, run = lane.cfg.train, lane.run
    if lane.step % tc.log_interval == 0 or lane.step == tc.max_steps or lane.step == 1:
        run.metrics.append(row)
        run.append_samples(
            {
                "step": lane.step,
                "prompt": prompts[i],
                "completion": completions[i],
                "reward": float(total[i]),
            }
            for i in range(min(lane.cfg.grpo.log_samples, len(completions)))
        )
        run.log(
            f"step {lane.step} | reward {row['reward_mean']:.3f} | kl {row['kl']:.4f} | "
            f"uniq {row['unique_fraction']:.2f} | {row['step_s']:.2f}s for the lanes"
        )
    failure = lane.watch.new_failure(row, lane.history, lane.step)
    if failure is None and not ln.params_finite(lane):
        lane.ended = ("diverged", f"its weights are not finite at step {lane.step}")
        run.log(f"diverged: {lane.ended[1]}", echo=True)
        return
    if failure:
        run.log(f"{failure.status}: {failure.evidence}", echo=True)
        if lane.cfg.failure.action == "stop" or failure.status == "diverged":
            lane.ended = (failure.status, failure.evidence)
            return
    if tc.save_interval and lane.step % tc.save_interval == 0 and lane.step < tc.max_steps:
        ln.save(lane, shared.tokenizer)
