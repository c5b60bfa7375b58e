"""What lanes of one worker may differ in, and what lanes refuse: configuration knowledge that the
sweep's lanes executor and the probe check before any trial starts (without importing torch),
and that the lanes worker checks again for each lane it takes.
"""

from __future__ import annotations

from smollab.errors import UserError

# What may differ between the lanes of one worker: each lane's own optimizer, schedule, KL and
# clipping, seed, budget, adapter size, failure rules and run directory. Everything else (the
# base model, data, prompts, batch and completion shapes, sampling, rewards, precision) is shared,
# because the lanes are rows of one batch through one base model.
LANE_SECTIONS = ("optim.", "run.", "failure.")
LANE_KEYS = frozenset(
    {
        "grpo.beta",
        "grpo.epsilon",
        "grpo.epsilon_high",
        "grpo.loss_type",
        "grpo.scale_rewards",
        "grpo.delta",
        "grpo.use_bias_correction_kl",
        "grpo.off_policy_mask_threshold",
        "grpo.multi_objective_aggregation",
        "model.lora.r",
        "model.lora.alpha",
        "train.max_steps",
        "train.epochs",
        "train.max_time",
        "train.log_interval",
        "train.eval_interval",
        "train.save_interval",
        "train.keep_last",
    }
)


def may_differ(key: str) -> bool:
    """Whether the dotted config `key` may take a different value in each lane."""
    return key in LANE_KEYS or key.startswith(LANE_SECTIONS)


# What the batched lanes model (`LaneLlama`) cannot do, each with the reason (a key set to any
# other value is refused); everything else a GRPO run does, a lane does through the same step.
_NO_ENTROPIES = "the batched model gives each token's log-prob, not each position's entropy"
UNSUPPORTED = {
    "model.lora.dropout": (0.0, "the batched model applies no LoRA dropout"),
    "model.load_in": ("none", "the batched model reads its base in full precision"),
    "grpo.routing.enabled": (False, "the batched model holds one adapter per lane, routing two"),
    "perf.precision": ("fp32", "the batched model runs in float32"),
    "perf.grad_checkpointing": (False, "the batched model keeps its activations"),
    "grpo.entropy_coef": (0.0, _NO_ENTROPIES),
    "grpo.use_adaptive_entropy": (False, _NO_ENTROPIES),
    "grpo.top_entropy_quantile": (1.0, _NO_ENTROPIES),
    "grpo.steps_per_generation": (
        None,
        "lanes generate every step, and a lane refilled mid-sweep would start its own schedule",
    ),
}


def check_supported(flat: dict, name: str) -> None:
    """Refuse, in one line, a config (flattened dotted keys) that lanes cannot train."""
    for key, (want, why) in UNSUPPORTED.items():
        if flat[key] != want:
            raise UserError(f"lane {name}: {key}={flat[key]} is not supported in lanes ({why})")
