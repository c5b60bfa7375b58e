"""GRPO loss math, following TRL's GRPOTrainer: pure torch on [N, T] tensors, no model.

N counts completions (prompts * num_generations, each prompt's completions consecutive), T the
completion positions. Names and semantics are TRL 1.16's (`num_generations`, `beta`, `epsilon`,
`epsilon_high`, `delta`, `loss_type`, `importance_sampling_level`, `scale_rewards`,
`sapo_temperature_pos`/`_neg`, `vespo_k_pos`/`_lambda_pos`/`_k_neg`/`_lambda_neg`,
`max_completion_length`, the `frac_reward_zero_std` metric):

- advantages: reward minus its group's mean, divided by the group's std ("group"), the whole
  batch's std ("batch", still centred on the group mean, as TRL does) or nothing ("none"); the
  std is torch.std's default, the UNBIASED one (divides by n - 1), plus 1e-4, as in TRL. A group
  whose rewards are all equal gets advantage 0 and teaches nothing.
- importance weight: w = exp(logp - old_logp) per token ("token"), or GSPO's one weight per
  sequence, exp(mean over its unmasked tokens of logp - old_logp) ("sequence").
- per token (`loss_type`): the clipped surrogate -min(w * A, clip(w, 1 - epsilon, 1 + epsilon_high)
  * A) for grpo, bnpo, dr_grpo, dapo and luspo (w capped at `delta` in the first term when set);
  CISPO's -sg(min(w, epsilon_high)) * A * logp; SAPO's soft gate -sigmoid(tau * (w - 1)) * 4 / tau
  * A; VESPO's -sg(phi(W)) * A * logp with W the product of the sequence's token ratios. Plus
  beta * k3 KL to the reference when beta > 0. Aggregation: see `grpo_loss`.

`mask_truncated_completions` is the caller's business: zero the mask rows of completions that
hit max_completion_length without EOS before calling; such rows then add nothing to the loss
(for `grpo`, `sapo` and `luspo` they still count in the mean over sequences, as in TRL).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

import torch

from smollab.errors import UserError

if TYPE_CHECKING:
    from smollab.config import GRPOSection

# The clipped surrogate's family (they differ in aggregation only), then the other surrogates.
CLIP_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
LOSS_TYPES = (*CLIP_LOSSES, "cispo", "sapo", "vespo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
SCALE_REWARDS = ("group", "batch", "none")
STD_EPS = 1e-4


def group_advantages(
    rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group"
) -> torch.Tensor:
    """Group-relative advantages [N] from rewards [N] (groups of `num_generations` in a row).

    A = r - mean(group); "group": A / (std(group) + 1e-4); "batch": A / (std(all) + 1e-4);
    "none": A. std is unbiased (n - 1), as TRL's `torch.std` default.
    """
    if scale_rewards not in SCALE_REWARDS:
        raise UserError(f"grpo.scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    if (
        isinstance(num_generations, bool)
        or not isinstance(num_generations, int)
        or num_generations < 2
    ):
        raise UserError(f"grpo.num_generations must be an integer >= 2, got {num_generations!r}")
    if rewards.dim() != 1 or rewards.numel() % num_generations:
        raise ValueError(
            f"group_advantages: rewards of shape {tuple(rewards.shape)} do not split into "
            f"groups of num_generations={num_generations}"
        )
    grouped = rewards.view(-1, num_generations)
    advantages = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    if scale_rewards == "group":
        std = grouped.std(dim=1).repeat_interleave(num_generations)
    elif scale_rewards == "batch":
        std = rewards.std().expand_as(rewards)
    else:
        return advantages
    return advantages / (std + STD_EPS)


def frac_reward_zero_std(rewards: torch.Tensor, num_generations: int) -> float:
    """Fraction of groups whose rewards are all equal (std ~ 0): they get advantage 0 and
    teach nothing, so a rising value means the batch is running out of signal (TRL's metric,
    per group; TRL's "batch" scaling logs whether the whole batch's std is 0 instead)."""
    std = rewards.detach().float().view(-1, num_generations).std(dim=1)
    return float(torch.isclose(std, torch.zeros_like(std)).float().mean())


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): exp(d) - d - 1 with d = ref - logp.

    Non-negative, zero where the log-probs agree, unbiased for the KL under samples from the policy.
    """
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def log_importance_weights(
    log_ratio: torch.Tensor, mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """log w: the per-token log ratio [N, T] ("token"), or GSPO's per-sequence mean of it over
    unmasked tokens [N, 1] ("sequence"), which keeps a long sequence's weight near 1."""
    if level == "token":
        return log_ratio
    masked = log_ratio.masked_fill(mask == 0, 0.0)  # junk in padding must not reach the mean
    return masked.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)


@torch.no_grad()
def vespo_weights(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> torch.Tensor:
    """VESPO's per-sequence gamma weight phi(W) = exp(lambda) * W^k * exp(-lambda * W) [N, 1].

    W = exp(sum of the sequence's token log ratios, each clamped to [-20, 20]), clamped to
    [1e-8, e^20]; (k, lambda) are the _pos pair where A >= 0, else the _neg pair; lambda is at
    least 1e-4. phi(1) = 1 and phi falls off on both sides of its peak; computed in log space,
    a non-finite result becomes 0. A constant (no gradient): it scales -A * logp.
    """
    lo = math.log(1e-8)
    seq = log_ratio.clamp(-20.0, 20.0).masked_fill(mask == 0, 0.0).sum(-1, keepdim=True)
    log_w = seq.clamp(lo, 20.0)
    nonneg = advantages >= 0
    k = torch.where(nonneg, k_pos, k_neg).to(log_w.dtype)
    lam = torch.where(nonneg, lambda_pos, lambda_neg).to(log_w.dtype).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w))
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@dataclass(frozen=True)
class LossOptions:
    """How one run's GRPO loss is taken: the loss keys of its `grpo` section, typed (TRL's names).

    Built once per run from its config (`from_config`); lanes of one process each carry their
    own. Checked here too, so a direct caller of `grpo_loss` gets the config's one-line errors."""

    loss_type: str = "dapo"
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float | None = None
    delta: float | None = None
    importance_sampling_level: str = "token"
    max_completion_length: int | None = None
    sapo_temperature_pos: float = 1.0
    sapo_temperature_neg: float = 1.05
    vespo_k_pos: float = 2.0
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0
    vespo_lambda_neg: float = 2.0

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise UserError(f"grpo.loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise UserError(
                f"grpo.importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, "
                f"got {self.importance_sampling_level!r}"
            )

    @classmethod
    def from_config(cls, g: GRPOSection) -> LossOptions:
        return cls(**{f.name: getattr(g, f.name) for f in fields(cls)})


DEFAULT_OPTIONS = LossOptions()


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    options: LossOptions = DEFAULT_OPTIONS,
    num_items: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO-family loss (scalar, differentiable in `logp`) and logging stats (floats).

    Computed in float32 at least (half-precision inputs are upcast; the loss is float32).

    logp, old_logp, ref_logp, mask: [N, T]; advantages: [N]. `old_logp` None means the batch
    is fresh (num_iterations = 1): ratio 1, as TRL's `logp.detach()`. `ref_logp` is needed when
    beta > 0. `old_logp`, `ref_logp` and `advantages` are treated as constants (detached).
    `epsilon_high` None means `epsilon` (symmetric clipping; for cispo the weight cap, as TRL).
    `importance_sampling_level` "sequence" gives each sequence one weight (GSPO; vespo ignores it:
    its weight is per sequence already). Surrogates per token: see the module docstring; cispo's
    and vespo's VALUE is -w * A * logp (only its gradient w * A * grad logp means something).
    Aggregation of masked per-token losses L:
      grpo, sapo: mean over sequences of (sum of the sequence's L / its unmasked tokens)
      luspo:   mean over sequences of the sum of the sequence's L (each weighted by its length)
      bnpo:    sum L / unmasked tokens in this batch
      dr_grpo: sum L / (N * max_completion_length); max_completion_length None means T
      dapo, cispo, vespo: sum L / `num_items`: the unmasked tokens of the whole optimizer step
               (all its gradient accumulation micro-batches), divided by the number of DDP
               processes when their gradients are averaged (TRL's num_items_in_batch /
               num_processes). None means this call's tokens: for one process and one
               micro-batch, bnpo.
    Stats: kl (masked mean, when ref_logp is given), clip_low / clip_high / clip_region
    (fraction clipped: w < 1 - eps with A < 0, w > 1 + eps_high with A > 0, either; cispo: w >
    its cap with A > 0, TRL's cispo_clip_ratio, as clip_high and clip_region; 0 for sapo and
    vespo), ratio_mean / ratio_min / ratio_max, policy_loss (the loss without the KL term),
    advantage_mean, num_tokens, and for vespo vespo_phi_mean. The weight and clip stats are over
    unmasked tokens, or at the sequence level over the sequences that have any.
    """
    o = options
    loss_type, beta, max_completion_length = o.loss_type, o.beta, o.max_completion_length
    if logp.dim() != 2:
        raise ValueError(f"grpo_loss: logp must be [N, T], got shape {tuple(logp.shape)}")
    n, t = logp.shape
    for name, x in (("old_logp", old_logp), ("ref_logp", ref_logp), ("mask", mask)):
        if x is not None and x.shape != logp.shape:
            raise ValueError(f"grpo_loss: {name} shape {tuple(x.shape)} != logp {(n, t)}")
    if advantages.shape != (n,):
        raise ValueError(f"grpo_loss: advantages shape {tuple(advantages.shape)} != ({n},)")
    if beta > 0 and ref_logp is None:
        raise ValueError("grpo_loss: beta > 0 needs ref_logp")
    eps_low = o.epsilon
    eps_high = o.epsilon if o.epsilon_high is None else o.epsilon_high

    # float32 at least: bf16 cannot even count a few hundred tokens exactly
    dtype = torch.promote_types(logp.dtype, torch.float32)
    logp = logp.to(dtype)
    mask = mask.to(dtype)
    old = logp.detach() if old_logp is None else old_logp.detach().to(dtype)
    adv = advantages.detach().to(dtype).unsqueeze(1)
    log_ratio = logp - old
    # [N, T] per token, [N, 1] per sequence; broadcast against [N, 1] advantages
    ratio = torch.exp(log_importance_weights(log_ratio, mask, o.importance_sampling_level))
    phi = None
    if loss_type in CLIP_LOSSES:
        clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
        capped = ratio if o.delta is None else torch.clamp(ratio, max=o.delta)  # two-sided clipping
        per_token = -torch.min(capped * adv, clipped * adv)
    elif loss_type == "cispo":
        per_token = -torch.clamp(ratio, max=eps_high).detach() * adv * logp
    elif loss_type == "sapo":
        tau = torch.where(adv > 0, o.sapo_temperature_pos, o.sapo_temperature_neg).to(dtype)
        per_token = -torch.sigmoid(tau * (ratio - 1)) * 4 / tau * adv
    else:  # vespo
        phi = vespo_weights(
            log_ratio,
            adv,
            mask,
            k_pos=o.vespo_k_pos,
            lambda_pos=o.vespo_lambda_pos,
            k_neg=o.vespo_k_neg,
            lambda_neg=o.vespo_lambda_neg,
        )
        per_token = -phi * adv * logp
    policy_per_token = per_token.expand(n, t)
    per_token = policy_per_token
    kl = None
    if ref_logp is not None:
        kl = kl_k3(logp, ref_logp.detach().to(dtype))
        if beta > 0:
            per_token = per_token + beta * kl

    def aggregate(x: torch.Tensor) -> torch.Tensor:
        masked = x * mask
        if loss_type in ("grpo", "sapo"):
            return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
        if loss_type == "luspo":
            return masked.sum(-1).mean()
        if loss_type == "bnpo":
            return masked.sum() / mask.sum().clamp(min=1.0)
        if loss_type == "dr_grpo":
            return masked.sum() / (
                n * (t if max_completion_length is None else max_completion_length)
            )
        denom = mask.sum().clamp(min=1.0) if num_items is None else max(float(num_items), 1.0)
        return masked.sum() / denom

    loss = aggregate(per_token)

    with torch.no_grad():  # one device-to-host copy for all stats
        tokens = mask.sum()
        # the weight stats count what a weight belongs to: tokens, or sequences with tokens
        counted = mask if ratio.shape[1] == t else (mask.sum(-1, keepdim=True) > 0).to(dtype)
        on = counted > 0

        def mmean(x: torch.Tensor) -> torch.Tensor:
            return (x * counted).sum() / counted.sum().clamp(min=1.0)

        zero = torch.zeros_like(ratio)
        if loss_type in CLIP_LOSSES:
            low = ((ratio < 1 - eps_low) & (adv < 0)).to(dtype)
            high = ((ratio > 1 + eps_high) & (adv > 0)).to(dtype)
        elif loss_type == "cispo":
            low, high = zero, ((ratio > eps_high) & (adv > 0)).to(dtype)
        else:
            low = high = zero
        named = {
            "policy_loss": aggregate(policy_per_token),
            "clip_low": mmean(low),
            "clip_high": mmean(high),
            "clip_region": mmean(torch.maximum(low, high)),
            "ratio_mean": mmean(ratio),
            "ratio_min": ratio.masked_fill(~on, float("inf")).min(),
            "ratio_max": ratio.masked_fill(~on, float("-inf")).max(),
            "advantage_mean": adv.mean(),
            "num_tokens": tokens,
        }
        if kl is not None:
            named["kl"] = (kl * mask).sum() / tokens.clamp(min=1.0)
        if phi is not None:
            rows = (mask.sum(-1, keepdim=True) > 0).to(dtype)
            named["vespo_phi_mean"] = (phi * rows).sum() / rows.sum().clamp(min=1.0)
        values = torch.stack([v.detach().float().reshape(()) for v in named.values()]).tolist()
        stats = dict(zip(named, values, strict=True))
        if stats["num_tokens"] == 0:
            stats["ratio_min"] = stats["ratio_max"] = 1.0
    return loss, stats
