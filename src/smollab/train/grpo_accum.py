"""GRPO's loss and backward in micro-batches of whole prompt groups (`train.grad_accum`).

Generation, rewards, advantages and reference log-probs cover the whole batch, as without
accumulation; only the policy's training forward and backward, the part whose activations grow
with the batch, run `grad_accum` times on a slice of it. The gradients add up in `.grad` and the
loop takes one optimizer step. Each micro-batch's loss is weighted so the sum is the one-batch
loss of every `loss_type`, hence the same gradient (tests/train/test_grpo_accum.py):

- grpo, sapo, luspo (means over sequences) and dr_grpo (over N * max_completion_length): times
  the micro-batch's share of the sequences;
- bnpo (over this batch's tokens): times its share of the tokens;
- dapo, cispo, vespo (over `num_items`): `num_items` = the whole batch's tokens, weight 1.

Under torchrun a rank's rows are the micro-batches of the whole step across ranks (`whole`: its
token and row counts), so the ranks' weighted losses sum to the step's loss and their summed
gradients to its gradient (train/grpo_ranks.py). The logged stats are the whole batch's too
(`merge_stats`). Micro-batches never replay the
decode: the loop samples without a record under accumulation (the record of the whole batch
is the memory accumulation is there to save).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import torch
from torch import nn

from smollab.engine.policy import policy_logprobs
from smollab.engine.rollout import Rollout
from smollab.errors import UserError
from smollab.train.grpo_loss import grpo_loss

# loss types whose denominator is `num_items`, and those that average over sequences
_PER_ITEM = ("dapo", "cispo", "vespo")
_PER_SEQUENCE = ("grpo", "sapo", "luspo", "dr_grpo")


def micro_batches(batch_size: int, num_generations: int, grad_accum: int) -> list[slice]:
    """The rows of each micro-batch: `grad_accum` equal runs of whole prompt groups."""
    groups = batch_size // num_generations
    if grad_accum < 1 or groups % grad_accum:
        raise UserError(
            f"train.grad_accum={grad_accum} must divide the {groups} prompt groups of "
            f"a batch (train.batch_size={batch_size} / grpo.num_generations="
            f"{num_generations}) into micro-batches of whole groups"
        )
    rows = groups // grad_accum * num_generations
    return [slice(i * rows, (i + 1) * rows) for i in range(grad_accum)]


def rollout_rows(r: Rollout, rows: slice) -> Rollout:
    """The completions `rows` of a rollout (without its decode record: it covers every row)."""
    return dataclasses.replace(
        r,
        prompt_ids=r.prompt_ids[rows],
        prompt_mask=r.prompt_mask[rows],
        completion_ids=r.completion_ids[rows],
        completion_mask=r.completion_mask[rows],
        logprobs=r.logprobs[rows],
        truncated=r.truncated[rows],
        record=None,
    )


def micro_weight(
    loss_type: str, mask: torch.Tensor, whole: tuple[float, int]
) -> tuple[float, float]:
    """(weight of a micro-batch's loss, its `num_items`) that make the micro-batches' weighted
    losses sum to the one-batch loss. mask: the micro-batch's [n, T]; whole: the batch's
    (unmasked tokens, rows)."""
    tokens, rows = whole
    if loss_type in _PER_ITEM:
        return 1.0, tokens
    if loss_type == "bnpo":
        return float(mask.sum()) / max(tokens, 1.0), tokens
    if loss_type in _PER_SEQUENCE:
        return mask.shape[0] / rows, tokens
    raise ValueError(f"micro_weight: no rule for loss_type {loss_type!r}")


def _mean(values: list[float], weights: list[float]) -> float:
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights, strict=True)) / total if total else 0.0


def merge_stats(
    parts: list[dict], masks: list[torch.Tensor], weights: list[float], level: str = "token"
) -> dict[str, float]:
    """The whole batch's `grpo_loss` stats from its micro-batches' (the means weighted by what
    each counts: tokens, sequences with tokens, rows; policy_loss by the micro weights)."""
    tokens = [float(m.sum()) for m in masks]
    seqs = [float((m.sum(-1) > 0).sum()) for m in masks]
    counted = tokens if level == "token" else seqs
    out: dict[str, float] = {}
    for key in parts[0]:
        vals = [p[key] for p in parts]
        if key == "policy_loss":
            out[key] = sum(v * w for v, w in zip(vals, weights, strict=True))
        elif key == "num_tokens":
            out[key] = sum(vals)
        elif key in ("ratio_min", "ratio_max"):
            live = [v for v, c in zip(vals, counted, strict=True) if c > 0]
            out[key] = (min if key == "ratio_min" else max)(live) if live else 1.0
        elif key == "kl":
            out[key] = _mean(vals, tokens)
        elif key == "advantage_mean":
            out[key] = _mean(vals, [float(m.shape[0]) for m in masks])
        elif key == "vespo_phi_mean":
            out[key] = _mean(vals, seqs)
        else:  # clip_low, clip_high, clip_region, ratio_mean: over what a weight belongs to
            out[key] = _mean(vals, counted)
    return out


def loss_backward(
    policy: nn.Module,
    rollout: Rollout,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    micro: list[slice],
    *,
    temperature: float,
    loss_options: dict,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    scaler=None,
    train_pass: Callable[[slice], contextlib.AbstractContextManager] | None = None,
    whole: tuple[float, int] | None = None,
) -> tuple[float, dict[str, float]]:
    """The GRPO loss's backward over the micro-batches `micro` (gradients add up in `.grad`);
    returns the whole batch's loss and stats. One micro-batch is the batch itself (its decode
    record, if any, replays). train_pass(rows): the context around a micro-batch's forward and
    backward (routing's masks of those rows); it yields whether the forward may share prompts.
    loss_options: `grpo_loss`'s keyword arguments, `loss_type` included, `num_items` not.
    whole: (unmasked tokens, rows) of the whole optimizer step when `rollout` is one rank's share
    of it (then loss and policy_loss are this share's part of the step's); None: `mask`'s."""
    loss_type = loss_options.get("loss_type", "dapo")
    level = loss_options.get("importance_sampling_level", "token")
    parts, masks, weights, total = [], [], [], 0.0
    whole = whole or (float(mask.sum()), mask.shape[0])
    for rows in micro:
        part = rollout if len(micro) == 1 else rollout_rows(rollout, rows)
        m = mask[rows]
        weight, num_items = micro_weight(loss_type, m, whole)
        ctx = train_pass(rows) if train_pass else contextlib.nullcontext(True)
        with ctx as share:
            with autocast():
                logp = policy_logprobs(policy, part, temperature, share_prompts=share)
            loss, stats = grpo_loss(
                logp,
                None if old_logp is None else old_logp[rows],
                None if ref_logp is None else ref_logp[rows],
                advantages[rows],
                m,
                num_items=num_items,
                **loss_options,
            )
            loss = loss * weight
            (scaler.scale(loss) if scaler else loss).backward()
        total += float(loss.detach())
        parts.append(stats)
        masks.append(m)
        weights.append(weight)
    if len(micro) == 1 and weights[0] == 1.0:
        return total, parts[0]
    return total, merge_stats(parts, masks, weights, level)
