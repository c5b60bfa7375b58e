"""GRPO's loss and backward: the one place a policy's gradient is made, for `smollab grpo`, its
ranks under torchrun and the lanes of `smollab lanes grpo`.

A step's batch holds the rows of one or more runs (a process run, or each lane of a worker), each
with its own loss options. The forward runs in micro-batches (`train.grad_accum`): micro-batch k
takes every run's k-th run of whole prompt groups, one forward computes their log-probs (lanes: all
lanes at once), each run's GRPO loss is taken on its rows and weighted, and their sum is
backpropagated; the gradients add up in `.grad`, and the loop takes each run's optimizer step.
Generation, rewards, advantages and reference log-probs cover the whole batch, as without
accumulation: only the training forward and backward, whose activations grow with the batch, are
split. A run's rows reach only its own weights, so each gradient is its own run's.

Each micro-batch's loss is weighted so the sum is the one-batch loss of every `loss_type`, hence
the same gradient (tests/train/grpo/test_update.py):
- grpo, sapo, luspo (means over sequences) and dr_grpo (over N * max_completion_length): times
  the micro-batch's share of the sequences;
- bnpo (over this batch's tokens): times its share of the tokens;
- dapo, cispo, vespo (over `num_items`): `num_items` = the whole batch's tokens, weight 1.
The entropy bonus (TRL's `entropy_coef`) is each micro-batch's mean entropy times its share of the
step's rows, as TRL divides it by the accumulation steps and processes (`bonus_coef`).
Under torchrun a rank's rows are the micro-batches of the whole step across ranks (`whole`: its
token and row counts), so the ranks' weighted losses sum to the step's loss and their summed
gradients to its gradient (`ranks.sum_over_ranks`). The logged stats are the whole batch's too
(`merge_stats`). Only a single micro-batch replays the decode: the loop samples without a record
under accumulation (the record of the whole batch is the memory accumulation is there to save).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from smollab.engine.rollout import Rollout
from smollab.errors import UserError
from smollab.train.grpo.loss import LossOptions, grpo_loss

# loss types whose denominator is `num_items`, and those that average over sequences
_PER_ITEM = ("dapo", "cispo", "vespo")
_PER_SEQUENCE = ("grpo", "sapo", "luspo", "dr_grpo")

# forward(rows of the batch as a Rollout, may share prompts) -> (log-probs [n, T] with grad,
# per-token entropies [n, T] or None when the forward does not compute them)
Forward = Callable[[Rollout, bool], tuple[torch.Tensor, torch.Tensor | None]]


@dataclass(frozen=True)
class Pass:
    """One forward and backward of a micro-batch: the context around them (gradient routing's
    masks; it yields whether the forward may share prompts) and the advantages [N] of the whole
    batch its loss takes (None: the batch's own). Gradient routing's retain_advantage=penalty
    trains retain and forget on different advantages, which one forward cannot give two
    adapters, so it takes two passes; the `reported` one's loss and stats are the step's."""

    context: contextlib.AbstractContextManager
    advantages: torch.Tensor | None = None
    reported: bool = True


# train_pass(the micro-batch's rows of the batch): its passes, in order
TrainPass = Callable[[slice | torch.Tensor], list[Pass]]


@dataclass(frozen=True)
class RunRows:
    """One run's rows of the batch and how its loss is taken."""

    rows: slice  # its rows of the batch (contiguous, whole prompt groups)
    options: LossOptions
    # (unmasked tokens, rows) of the run's whole optimizer step when the batch holds only this
    # process's share of it (torchrun); None: its rows here are the whole step
    whole: tuple[float, int] | None = None
    entropy_coef: float = 0.0  # the entropy bonus's coefficient this step (TRL's entropy_coef)
    # dapo, cispo, vespo: TRL's num_items when one generated batch serves several optimizer steps
    # (its tokens / the steps); None: the step's own tokens
    items: float | None = None


@dataclass
class Batch:
    """What one update trains on: the rollouts and, per row, what the loss holds constant."""

    rollout: Rollout
    advantages: torch.Tensor  # [N] on the policy's device
    mask: torch.Tensor  # [N, T] the loss mask (truncated completions zeroed when asked)
    old_logp: torch.Tensor | None  # [N, T] the sampling policy's log-probs (num_iterations > 1)
    ref_logp: torch.Tensor | None  # [N, T] the reference's, for runs with a KL term


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


def bonus_coef(coef: float, share: float, weight: float) -> float:
    """The entropy coefficient to hand `grpo_loss` for a micro-batch whose loss is then multiplied
    by `weight`: TRL's bonus is each micro-batch's mean entropy / (accumulation steps x
    processes), whatever the loss type, i.e. weighted by the micro-batch's share of the step's
    rows, not by the loss type's `weight`."""
    return coef * share / weight if coef and weight else 0.0


def _mean(values: list[float], weights: list[float]) -> float:
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights, strict=True)) / total if total else 0.0


def merge_stats(
    parts: list[dict], masks: list[torch.Tensor], weights: list[float], level: str = "token"
) -> dict[str, float]:
    """The whole batch's `grpo_loss` stats from its micro-batches' (the means weighted by what
    each counts: tokens, or rows at the sequence level, as TRL counts; policy_loss by the micro
    weights; the least and most clipped sequence over all)."""
    tokens = [float(m.sum()) for m in masks]
    rows = [float(m.shape[0]) for m in masks]
    counted = tokens if level == "token" else rows
    out: dict[str, float] = {}
    for key in parts[0]:
        vals = [p[key] for p in parts]
        if key == "policy_loss":
            out[key] = sum(v * w for v, w in zip(vals, weights, strict=True))
        elif key in ("num_tokens", "entropy_sum", "entropy_tokens"):
            out[key] = sum(vals)
        elif key in ("ratio_min", "ratio_max"):
            live = [v for v, c in zip(vals, counted, strict=True) if c > 0]
            out[key] = (min if key == "ratio_min" else max)(live) if live else 1.0
        elif key in ("clip_low_min", "clip_high_max"):
            live = [v for v in vals if not math.isnan(v)]
            out[key] = (min if key == "clip_low_min" else max)(live) if live else math.nan
        elif key in ("kl", "entropy"):
            out[key] = _mean(vals, tokens)
        elif key in ("advantage_mean", "vespo_phi_mean"):
            out[key] = _mean(vals, rows)
        else:  # clip_low, clip_high, clip_region, ratio_mean: over what a weight belongs to
            out[key] = _mean(vals, counted)
    return out


def _chunks(runs: list[RunRows], num_generations: int, grad_accum: int) -> list[list[slice]]:
    """Per micro-batch, each run's rows of the batch in it (its k-th run of whole groups)."""
    per_run = []
    for run in runs:
        start, n = run.rows.start or 0, run.rows.stop - (run.rows.start or 0)
        micro = micro_batches(n, num_generations, grad_accum)
        per_run.append([slice(start + m.start, start + m.stop) for m in micro])
    return [list(chunks) for chunks in zip(*per_run, strict=True)]


@dataclass
class _RunParts:
    """One run's micro-batch results, merged once its last micro-batch is done."""

    loss: float = 0.0
    stats: list[dict[str, float]] = field(default_factory=list)
    masks: list[torch.Tensor] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)

    def merged(self, level: str) -> tuple[float, dict[str, float]]:
        if len(self.stats) == 1 and self.weights[0] == 1.0:
            return self.loss, self.stats[0]
        return self.loss, merge_stats(self.stats, self.masks, self.weights, level)


def loss_backward(
    forward: Forward,
    batch: Batch,
    runs: list[RunRows],
    *,
    num_generations: int,
    grad_accum: int = 1,
    scaler=None,
    train_pass: TrainPass | None = None,
) -> list[tuple[float, dict[str, float]]]:
    """Each run's GRPO loss on its rows, backpropagated micro-batch by micro-batch (gradients add
    up in `.grad`); returns each run's (loss, stats) over its whole rows. Each micro-batch runs
    the passes `train_pass` gives it (one without gradient routing's penalty mode): a forward,
    the loss on the pass's advantages, a backward. With one micro-batch
    the forward sees the batch itself, so a rollout that holds its decode record replays it.
    A run without a KL term (beta 0) gets no reference log-probs, so it measures no KL."""
    micro = _chunks(runs, num_generations, grad_accum)
    done = [_RunParts() for _ in runs]
    for chunks in micro:
        if len(micro) == 1:  # every row: the batch itself
            rows: slice | torch.Tensor = slice(None)
            part, local = batch.rollout, chunks
        else:  # the runs' k-th groups, run after run, as the batched forward takes them
            rows = chunks[0]
            if len(chunks) > 1:
                dev = batch.mask.device
                rows = torch.cat([torch.arange(c.start, c.stop, device=dev) for c in chunks])
            part, local, at = batch.rollout.select(rows), [], 0
            for c in chunks:
                local.append(slice(at, at + c.stop - c.start))
                at += c.stop - c.start
        for p in train_pass(rows) if train_pass else [Pass(contextlib.nullcontext(True))]:
            advantages = batch.advantages if p.advantages is None else p.advantages
            with p.context as share:
                logp, entropies = forward(part, share)
                losses = []
                for run, c, here, parts in zip(runs, chunks, local, done, strict=True):
                    m = batch.mask[c]
                    n = run.rows.stop - (run.rows.start or 0)
                    whole = run.whole or (float(batch.mask[run.rows].sum()), n)
                    weight, num_items = micro_weight(run.options.loss_type, m, whole)
                    if run.items is not None and run.options.loss_type in _PER_ITEM:
                        num_items = run.items
                    ref = None if not run.options.beta else batch.ref_logp
                    loss, stats = grpo_loss(
                        logp[here],
                        None if batch.old_logp is None else batch.old_logp[c],
                        None if ref is None else ref[c],
                        advantages[c],
                        m,
                        run.options,
                        num_items=num_items,
                        entropies=None if entropies is None else entropies[here],
                        entropy_coef=bonus_coef(run.entropy_coef, m.shape[0] / whole[1], weight),
                    )
                    losses.append(loss * weight)
                    if p.reported:
                        parts.stats.append(stats)
                        parts.masks.append(m)
                        parts.weights.append(weight)
                loss = sum(losses)
                (scaler.scale(loss) if scaler else loss).backward()
            for parts, weighted in zip(done, losses, strict=True):
                if p.reported:
                    parts.loss += float(weighted.detach())
    return [
        parts.merged(run.options.importance_sampling_level)
        for run, parts in zip(runs, done, strict=True)
    ]
