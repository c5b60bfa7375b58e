"""What each command's metrics.csv holds: its columns, in order, one row per logged step.

Part of the run directory's contract: the loops write these rows, and a sweep's metric, the
reports and users read them, without importing a loop. GRPO adds `reward/<key>` per reward
function when it has several, and gradient routing's columns when it routes.
"""

from __future__ import annotations

PRETRAIN = [
    "step",
    "tokens",
    "wall_s",
    "train_s",
    "lr",
    "train_loss",
    "val_loss",
    "grad_norm",
    "tokens_per_s",
    "mfu",
    "peak_mem_mb",
]

SFT = ["step", "epoch", *PRETRAIN[1:]]  # pretraining's, and the epochs done

RFT = [
    "step",
    "accuracy",
    "eval_reward_mean",
    "generated",
    "kept",
    "kept_fraction",
    "prompts_with_kept",
    "gen_s",
    "completions_per_s",
    "sft_steps",
    "sft_train_loss",
    "wall_s",
]  # one row per round: step is the round

GRPO = [
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
    "clip_low",
    "clip_high",
    "clip_low_min",
    "clip_high_max",
    "entropy_coef",
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

ROUTING = [
    "hack_rate",
    "routed_frac",
    "eligible_frac",
]

BY_COMMAND = {"pretrain": PRETRAIN, "sft": SFT, "rft": RFT, "grpo": GRPO}
