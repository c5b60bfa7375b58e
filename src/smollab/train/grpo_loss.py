"""GRPO loss math, following TRL's GRPOTrainer: pure torch on [N, T] tensors, no model.

N counts completions (prompts * num_generations, each prompt's completions consecutive), T the
completion positions. Names and semantics are TRL's (`num_generations`, `beta`, `epsilon`,
`epsilon_high`, `loss_type`, `scale_rewards`, `max_completion_length`):

- advantages: reward minus its group's mean, divided by the group's std ("group"), the whole
  batch's std ("batch", still centred on the group mean, as TRL does) or nothing ("none"); the
  std is torch.std's default, the UNBIASED one (divides by n - 1), plus 1e-4, as in TRL. A group
  whose rewards are all equal gets advantage 0 and teaches nothing.
- per token: ratio = exp(logp - old_logp); loss = -min(ratio * A, clip(ratio, 1 - epsilon,
  1 + epsilon_high) * A), plus beta * k3 KL to the reference when beta > 0.
- aggregation (`loss_type`): see `grpo_loss`.

`mask_truncated_completions` is the caller's business: zero the mask rows of completions that
hit max_completion_length without EOS before calling; such rows then add nothing to the loss
(for `grpo` they still count in the mean over sequences, as in TRL).
"""

from __future__ import annotations

import torch

from smollab.errors import UserError

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
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


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): exp(d) - d - 1 with d = ref - logp.

    Non-negative, zero where the log-probs agree, unbiased for the KL under samples from the policy.
    """
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor | None,
    ref_logp: torch.Tensor | None,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.0,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    loss_type: str = "dapo",
    max_completion_length: int | None = None,
    num_items: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped GRPO loss (scalar, differentiable in `logp`) and logging stats (floats).

    Computed in float32 at least (half-precision inputs are upcast; the loss is float32).

    logp, old_logp, ref_logp, mask: [N, T]; advantages: [N]. `old_logp` None means the batch
    is fresh (num_iterations = 1): ratio 1, as TRL's `logp.detach()`. `ref_logp` is needed when
    beta > 0. `old_logp`, `ref_logp` and `advantages` are treated as constants (detached).
    `epsilon_high` None means `epsilon` (symmetric clipping). Aggregation of masked per-token
    losses L:
      grpo:    mean over sequences of (sum of the sequence's L / its unmasked tokens)
      bnpo:    sum L / unmasked tokens in this batch
      dr_grpo: sum L / (N * max_completion_length); max_completion_length None means T
      dapo:    sum L / `num_items`: the unmasked tokens of the whole optimizer step (all its
               gradient accumulation micro-batches), divided by the number of DDP processes
               when their gradients are averaged (TRL's num_items_in_batch / num_processes).
               None means this call's tokens: for one process and one micro-batch, bnpo.
    Stats: kl (masked mean, when ref_logp is given), clip_low / clip_high / clip_region
    (fraction of unmasked tokens clipped: ratio < 1 - eps with A < 0, ratio > 1 + eps_high with
    A > 0, either), ratio_mean / ratio_min / ratio_max, policy_loss (the loss without the KL
    term), advantage_mean, num_tokens.
    """
    if loss_type not in LOSS_TYPES:
        raise UserError(f"grpo.loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
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
    eps_low = epsilon
    eps_high = epsilon if epsilon_high is None else epsilon_high

    # float32 at least: bf16 cannot even count a few hundred tokens exactly
    dtype = torch.promote_types(logp.dtype, torch.float32)
    logp = logp.to(dtype)
    mask = mask.to(dtype)
    old = logp.detach() if old_logp is None else old_logp.detach().to(dtype)
    adv = advantages.detach().to(dtype).unsqueeze(1)
    ratio = torch.exp(logp - old)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = -torch.min(ratio * adv, clipped * adv)
    policy_per_token = per_token
    kl = None
    if ref_logp is not None:
        kl = kl_k3(logp, ref_logp.detach().to(dtype))
        if beta > 0:
            per_token = per_token + beta * kl

    def aggregate(x: torch.Tensor) -> torch.Tensor:
        masked = x * mask
        if loss_type == "grpo":
            return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
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
        denom = tokens.clamp(min=1.0)
        on = mask > 0

        def mmean(x: torch.Tensor) -> torch.Tensor:
            return (x * mask).sum() / denom

        low = ((ratio < 1 - eps_low) & (adv < 0)).to(mask.dtype)
        high = ((ratio > 1 + eps_high) & (adv > 0)).to(mask.dtype)
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
            named["kl"] = mmean(kl)
        values = torch.stack([v.detach().float().reshape(()) for v in named.values()]).tolist()
        stats = dict(zip(named, values, strict=True))
        if stats["num_tokens"] == 0:
            stats["ratio_min"] = stats["ratio_max"] = 1.0
    return loss, stats
