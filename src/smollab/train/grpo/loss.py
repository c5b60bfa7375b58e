"""GRPO loss math, following TRL's GRPOTrainer: pure torch on [N, T] tensors, no model.

N counts completions (prompts * num_generations, each prompt's completions consecutive), T the
completion positions. Names and semantics are TRL 1.16's (`num_generations`, `beta`, `epsilon`,
`epsilon_high`, `delta`, `loss_type`, `importance_sampling_level`, `scale_rewards`,
`sapo_temperature_pos`/`_neg`, `vespo_k_pos`/`_lambda_pos`/`_k_neg`/`_lambda_neg`,
`max_completion_length`, `use_bias_correction_kl`, `off_policy_mask_threshold`,
`top_entropy_quantile`, `entropy_coef`, `multi_objective_aggregation`, the `frac_reward_zero_std`
metric):

- advantages: reward minus its group's mean, divided by the group's std ("group"), the whole
  batch's std ("batch", still centred on the group mean, as TRL does) or nothing ("none"); the
  std is torch.std's default, the UNBIASED one (divides by n - 1), plus 1e-4, as in TRL. A group
  whose rewards are all equal gets advantage 0 and teaches nothing.
- importance weight: w = exp(logp - old_logp) per token ("token"), or GSPO's one weight per
  sequence, exp(mean over its unmasked tokens of logp - old_logp) ("sequence").
- per token (`loss_type`): the clipped surrogate -min(w * A, clip(w, 1 - epsilon, 1 + epsilon_high)
  * A) for grpo, bnpo, dr_grpo, dapo and luspo (w capped at `delta` in the first term when set);
  CISPO's -sg(min(w, epsilon_high)) * A * logp; SAPO's soft gate -sigmoid(tau * (w - 1)) * 4 / tau
  * A; VESPO's -sg(phi(W)) * A * logp with W the product of the sequence's token ratios. Times
  DeepSeek-V3.2's off-policy sequence mask (`off_policy_mask_threshold`) and the high-entropy token
  mask (`top_entropy_quantile`) when set; plus beta * k3 KL to the reference when beta > 0, times
  w when `use_bias_correction_kl` (TRL's default: the ratio's gradient makes the KL's gradient the
  unbiased reverse-KL one, also on a fresh batch where w's value is 1). Aggregation: see
  `grpo_loss`; minus `entropy_coef` times the mean per-token entropy.

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
MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
STD_EPS = 1e-4


def group_advantages(
    rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group"
) -> torch.Tensor:
    """Group-relative advantages [N] from rewards [N] (groups of `num_generations` in a row).

    A = r - mean(group); "group": A / (std(group) + 1e-4); "batch": A / (std(all) + 1e-4);
    "none": A. std is unbiased (n - 1), as TRL's `torch.std` default.
    """
    _check_groups(rewards, num_generations, scale_rewards)
    grouped = rewards.view(-1, num_generations)
    advantages = (grouped - grouped.mean(dim=1, keepdim=True)).reshape(-1)
    if scale_rewards == "none":
        return advantages
    return advantages / (_reward_std(rewards, num_generations, scale_rewards) + STD_EPS)


def _check_groups(rewards: torch.Tensor, num_generations: int, scale_rewards: str) -> None:
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


def _reward_std(rewards: torch.Tensor, num_generations: int, scale_rewards: str) -> torch.Tensor:
    """Per row, the std the advantages divide by: the group's ("group", and "none", where TRL
    measures it only to log `frac_reward_zero_std`) or the batch's ("batch")."""
    if scale_rewards == "batch":
        return rewards.std().expand_as(rewards)
    return rewards.view(-1, num_generations).std(dim=1).repeat_interleave(num_generations)


def multi_objective_advantages(
    per_fn: torch.Tensor,
    weights: torch.Tensor,
    num_generations: int,
    scale_rewards: str = "group",
    aggregation: str = "sum_then_normalize",
) -> tuple[torch.Tensor, float]:
    """Advantages [N] and `frac_reward_zero_std` from each reward function's values [N, K] and
    their weights [K], as TRL aggregates several rewards (`multi_objective_aggregation`):

    "sum_then_normalize": the weighted sum, then `group_advantages` (`scale_rewards`).
    "normalize_then_sum" (GDPO, arXiv 2601.05242): each function's values centred on its group's
    mean and divided by its group's std + 1e-4, weighted and summed, then centred on the batch's
    mean and divided by the batch's std + 1e-4 (`scale_rewards` is not read).
    `frac_reward_zero_std` is TRL's: the fraction of rows whose std (the one the advantages
    divide by, the group's under "none") is 0.
    """
    if aggregation not in MULTI_OBJECTIVE_AGGREGATIONS:
        raise UserError(
            f"grpo.multi_objective_aggregation must be one of {MULTI_OBJECTIVE_AGGREGATIONS}, "
            f"got {aggregation!r}"
        )
    dtype = torch.promote_types(per_fn.dtype, torch.float32)
    per_fn, weights = per_fn.to(dtype), weights.to(dtype)
    if aggregation == "sum_then_normalize":
        total = (per_fn * weights).sum(1)
        advantages = group_advantages(total, num_generations, scale_rewards)
        std = _reward_std(total, num_generations, scale_rewards)
    else:
        _check_groups(per_fn[:, 0], num_generations, scale_rewards)
        grouped = per_fn.view(-1, num_generations, per_fn.shape[1])
        normed = (grouped - grouped.mean(1, keepdim=True)) / (
            grouped.std(1, keepdim=True) + STD_EPS
        )
        total = (normed.reshape(per_fn.shape) * weights).sum(1)
        std = total.std().expand_as(total)
        advantages = (total - total.mean()) / (std + STD_EPS)
    zero = torch.isclose(std, torch.zeros_like(std)).to(dtype).mean()
    return advantages, float(zero)


def frac_reward_zero_std(
    rewards: torch.Tensor, num_generations: int, scale_rewards: str = "group"
) -> float:
    """Fraction of rows whose reward std is 0, TRL's metric: per group (their completions get
    advantage 0 and teach nothing, so a rising value means the batch is running out of signal),
    or with `scale_rewards=batch` whether the whole batch's std is 0."""
    std = _reward_std(rewards.detach().float(), num_generations, scale_rewards)
    return float(torch.isclose(std, torch.zeros_like(std)).float().mean())


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """TRL's `top_entropy_quantile`: True [N, T] at the unmasked tokens whose entropy is at least
    the (1 - quantile) quantile of the unmasked tokens' entropies (0 keeps only the highest)."""
    on = mask.bool()
    live = entropies.detach()[on].float()
    if live.numel() == 0:
        return torch.zeros_like(on)
    threshold = torch.quantile(live, 1.0 - quantile)
    return (entropies.detach() * mask >= threshold.to(entropies.dtype)) & on


def off_policy_mask(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    threshold: float,
) -> torch.Tensor:
    """DeepSeek-V3.2's off-policy sequence mask (TRL's `off_policy_mask_threshold`) [N, 1]: 0 for
    a sequence with a negative advantage whose mean per-token KL(old || policy), estimated as
    old - logp over its tokens, exceeds `threshold`; 1 elsewhere."""
    kl = (old_logp - logp.detach()).nan_to_num(nan=0.0)
    seq_kl = (kl * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1.0)
    return ((advantages >= 0) | (seq_kl <= threshold)).to(mask.dtype)


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
    use_bias_correction_kl: bool = True
    off_policy_mask_threshold: float | None = None
    top_entropy_quantile: float = 1.0

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise UserError(f"grpo.loss_type must be one of {LOSS_TYPES}, got {self.loss_type!r}")
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise UserError(
                f"grpo.importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, "
                f"got {self.importance_sampling_level!r}"
            )
        if not 0.0 <= self.top_entropy_quantile <= 1.0:
            raise UserError(
                f"grpo.top_entropy_quantile must be in [0, 1], got {self.top_entropy_quantile!r}"
            )

    @property
    def reads_entropy(self) -> bool:
        """Whether the loss itself reads per-token entropies (else they are only logged)."""
        return self.top_entropy_quantile < 1.0

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
    entropies: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO-family loss (scalar, differentiable in `logp` and `entropies`) and logging stats.

    TRL 1.16's `GRPOTrainer._compute_loss` for one process and one micro-batch, computed in
    float32 at least (half-precision inputs are upcast; the loss is float32 or float64).

    logp, old_logp, ref_logp, mask, entropies: [N, T]; advantages: [N]. `old_logp` None means the
    batch is fresh (ratio 1, as TRL's `logp.detach()`). `ref_logp` is needed when beta > 0.
    `old_logp`, `ref_logp` and `advantages` are treated as constants (detached). `entropies`: the
    policy's per-token entropies (with grad when `entropy_coef` is not 0), needed by
    `top_entropy_quantile` < 1 and the entropy bonus, else only logged.
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
    Then minus `entropy_coef` x the mean entropy over the tokens the loss acts on (TRL's bonus:
    the same for every loss type; the caller scales it for gradient accumulation).
    Stats (TRL's metrics where TRL logs them): kl (masked mean of the KL term as it enters the
    loss, when ref_logp is given), entropy (masked mean, when entropies are given), clip_low /
    clip_high / clip_region (TRL's clip_ratio/low_mean, high_mean, region_mean: w < 1 - eps with
    A < 0, w > 1 + eps_high with A > 0, either; cispo: TRL's cispo_clip_ratio, w above its cap
    with A > 0, as clip_high and clip_region; 0 for sapo and vespo), clip_low_min /
    clip_high_max (TRL's clip_ratio/low_min and high_max: the least and most clipped
    sequence), ratio_mean / ratio_min / ratio_max, policy_loss (the loss without the KL term and
    the bonus), advantage_mean, num_tokens, entropy_sum and entropy_tokens (over the tokens the
    loss acts on: the adaptive entropy controller's window), and for vespo vespo_phi_mean. Weight
    stats are over unmasked tokens, or at the sequence level over all sequences, as TRL counts.
    """
    o = options
    loss_type, beta, max_completion_length = o.loss_type, o.beta, o.max_completion_length
    if logp.dim() != 2:
        raise ValueError(f"grpo_loss: logp must be [N, T], got shape {tuple(logp.shape)}")
    n, t = logp.shape
    named_inputs = (("old_logp", old_logp), ("ref_logp", ref_logp), ("mask", mask))
    for name, x in (*named_inputs, ("entropies", entropies)):
        if x is not None and x.shape != logp.shape:
            raise ValueError(f"grpo_loss: {name} shape {tuple(x.shape)} != logp {(n, t)}")
    if advantages.shape != (n,):
        raise ValueError(f"grpo_loss: advantages shape {tuple(advantages.shape)} != ({n},)")
    if beta > 0 and ref_logp is None:
        raise ValueError("grpo_loss: beta > 0 needs ref_logp")
    if entropies is None and (o.reads_entropy or entropy_coef):
        raise ValueError("grpo_loss: top_entropy_quantile < 1 and entropy_coef need entropies")
    eps_low = o.epsilon
    eps_high = o.epsilon if o.epsilon_high is None else o.epsilon_high

    # float32 at least: bf16 cannot even count a few hundred tokens exactly
    dtype = torch.promote_types(logp.dtype, torch.float32)
    logp = logp.to(dtype)
    mask = mask.to(dtype)
    if entropies is not None:
        entropies = entropies.to(dtype)
    old = logp.detach() if old_logp is None else old_logp.detach().to(dtype)
    adv = advantages.detach().to(dtype).unsqueeze(1)
    top = None
    if o.top_entropy_quantile < 1.0:
        top = high_entropy_mask(entropies, mask, o.top_entropy_quantile).to(dtype)
    log_ratio = logp - old
    # [N, T] per token, [N, 1] per sequence; broadcast against [N, 1] advantages
    ratio = torch.exp(log_importance_weights(log_ratio, mask, o.importance_sampling_level))
    kl = None
    if ref_logp is not None:
        kl = kl_k3(logp, ref_logp.detach().to(dtype))
        if o.use_bias_correction_kl:
            kl = kl * ratio  # the ratio's gradient counts, also where its value is 1
    phi, capped = None, ratio
    if loss_type in CLIP_LOSSES:
        clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
        if o.delta is not None:  # two-sided clipping; TRL's clip stats see the capped ratio too
            capped = torch.clamp(ratio, max=o.delta)
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
    if o.off_policy_mask_threshold is not None:
        per_token = per_token * off_policy_mask(logp, old, adv, mask, o.off_policy_mask_threshold)
    if top is not None:
        per_token = per_token * top
    policy_per_token = per_token.expand(n, t)
    per_token = policy_per_token
    if kl is not None and beta > 0:
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
    acting = mask if top is None else mask * top  # the tokens the loss acts on
    if entropy_coef:
        loss = loss - entropy_coef * (entropies * acting).sum() / acting.sum().clamp(min=1.0)

    with torch.no_grad():  # one device-to-host copy for all stats
        tokens = mask.sum()
        # the weight stats count what a weight belongs to: tokens, or every sequence (as TRL)
        counted = mask if ratio.shape[1] == t else torch.ones_like(ratio)

        def mmean(x: torch.Tensor) -> torch.Tensor:
            return (x * counted).sum() / counted.sum().clamp(min=1.0)

        def per_sequence(x: torch.Tensor) -> torch.Tensor:  # NaN for a sequence without tokens
            return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)

        zero = torch.zeros_like(ratio)
        if loss_type in CLIP_LOSSES:
            low = ((capped < 1 - eps_low) & (adv < 0)).to(dtype)
            high = ((capped > 1 + eps_high) & (adv > 0)).to(dtype)
        elif loss_type == "cispo":
            low, high = zero, ((ratio > eps_high) & (adv > 0)).to(dtype)
        else:
            low = high = zero
        nan = torch.tensor(float("nan"), dtype=dtype, device=logp.device)
        low_seq, high_seq = per_sequence(low), per_sequence(high)
        named = {
            "policy_loss": aggregate(policy_per_token),
            "clip_low": mmean(low),
            "clip_high": mmean(high),
            "clip_region": mmean(torch.maximum(low, high)),
            "clip_low_min": low_seq.nan_to_num(nan=float("inf")).min() if n else nan,
            "clip_high_max": high_seq.nan_to_num(nan=float("-inf")).max() if n else nan,
            "ratio_mean": mmean(ratio),
            "ratio_min": ratio.masked_fill(counted.expand_as(ratio) == 0, float("inf")).min(),
            "ratio_max": ratio.masked_fill(counted.expand_as(ratio) == 0, float("-inf")).max(),
            "advantage_mean": adv.mean(),
            "num_tokens": tokens,
        }
        if kl is not None:
            named["kl"] = (kl.expand(n, t) * mask).sum() / tokens.clamp(min=1.0)
        if entropies is not None:
            named["entropy"] = (entropies * mask).sum() / tokens.clamp(min=1.0)
            named["entropy_sum"] = (entropies * acting).sum()
            named["entropy_tokens"] = acting.sum()
        if phi is not None:
            named["vespo_phi_mean"] = phi.mean()
        values = torch.stack([v.detach().float().reshape(()) for v in named.values()]).tolist()
        stats = dict(zip(named, values, strict=True))
        for key in ("clip_low_min", "clip_high_max"):  # no sequence with tokens: NaN, as TRL's
            if math.isinf(stats[key]):
                stats[key] = float("nan")
        if stats["num_tokens"] == 0:
            stats["ratio_min"] = stats["ratio_max"] = 1.0
    return loss, stats


@dataclass
class EntropyControl:
    """The entropy bonus's coefficient: TRL's `entropy_coef`, fixed, or with
    `use_adaptive_entropy` (Skywork-OR1, arXiv 2505.22312) moved by `entropy_coef_delta` within
    [`entropy_coef_min`, `entropy_coef_max`] after each optimizer step: up while the step's mean
    entropy (over the tokens the loss acts on) is at most `entropy_target`, down otherwise, and
    applied in a step only when the previous step's entropy was at most the target (`last`,
    infinite before the first step). Part of a run's resumable state."""

    coef: float = 0.0
    adaptive: bool = False
    target: float = 0.2
    delta: float = 0.005
    low: float = 0.0
    high: float = 1.0
    last: float = math.inf

    @classmethod
    def from_config(cls, g: GRPOSection) -> EntropyControl:
        return cls(
            coef=g.entropy_coef,
            adaptive=g.use_adaptive_entropy,
            target=g.entropy_target,
            delta=g.entropy_coef_delta,
            low=g.entropy_coef_min,
            high=g.entropy_coef_max,
        )

    @property
    def enabled(self) -> bool:
        return self.coef != 0.0 or self.adaptive

    def applied(self) -> float:
        """The coefficient this optimizer step's loss takes."""
        if self.adaptive and self.last > self.target:
            return 0.0
        return self.coef

    def update(self, entropy: float) -> None:
        """After an optimizer step: its mean entropy over the tokens the loss acted on."""
        if not self.adaptive:
            return
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.high)
        else:
            self.coef = max(self.coef - self.delta, self.low)
        self.last = entropy
