"""Reward functions (TRL's calling convention), the registry, and the spec model (from config)."""

from smollab.config import RewardSpec
from smollab.rewards.registry import (
    BUILTINS,
    ResolvedReward,
    RewardError,
    compute_rewards,
    get_reward,
    validate_specs,
)

__all__ = [
    "BUILTINS",
    "ResolvedReward",
    "RewardError",
    "RewardSpec",
    "compute_rewards",
    "get_reward",
    "validate_specs",
]
