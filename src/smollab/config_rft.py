"""The schema of `smollab rft` (rejection-sampling fine-tuning), registered into `config.SCHEMAS`.

Kept out of `config` (already long) and built from its sections: each round's SFT reads RFT's
`model`, `optim`, `train`, `perf` and `sft` sections as `smollab sft` reads its own, and the
scoring reads `reward` as `smollab grpo` does. `config_load` imports this module, so every path
that loads a config knows the command.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from smollab.config import CompiledPerfConfig, RewardSpec, RunConfig, Section, register
from smollab.config_rules import rft_rules, shared_rules
from smollab.config_sft import SFTModelConfig, SFTOptimConfig, SFTSection


class RFTTrainConfig(Section):
    """Each round's SFT: its length (epochs or steps over the round's kept records) and batches.
    No held-out loss: a round's records are all trained on; RFT measures held-out accuracy."""

    epochs: float | None = Field(
        2.0,
        gt=0,
        description="passes over each round's kept records (null: train.max_steps per round)",
    )
    max_steps: int = Field(1000, ge=1, description="optimizer steps per round (train.epochs=null)")
    max_time: float | None = Field(None, gt=0, description="seconds of training per round")
    batch_size: int = Field(32, ge=1)
    grad_accum: int = Field(1, ge=1)
    seq_len: int = Field(128, ge=2, description="longest row; longer examples are truncated")
    log_interval: int = Field(10, ge=1)
    save_interval: int = Field(500, ge=0, description="0: no periodic checkpoints")
    keep_last: int = Field(2, ge=1, description="periodic checkpoints kept per round")
    diverge_factor: float = Field(3.0, gt=1, description="loss above factor x its start = diverged")


class KeepConfig(Section):
    """Which scored completions a round trains on (both rules apply when both are set)."""

    threshold: float | None = Field(
        1.0,
        description="keep completions whose total reward >= "
        "this (a checker's 1.0); null: no threshold",
    )
    top_k: int | None = Field(None, ge=1, description="then at most the k best per prompt")


class RFTSection(Section):
    """Rounds of generate -> score -> keep -> SFT -> evaluate, in one run directory."""

    prompts_file: str | None = Field(None, description="training prompts, one per line (required)")
    eval_prompts_file: str | None = Field(
        None, description="held-out prompts, one per line (required): the accuracy per round"
    )
    rounds: int = Field(1, ge=1)
    restart_from: Literal["last", "base"] = Field(
        "last",
        description="each round's SFT starts from the last round's model, or from "
        "model.path (STaR); generation always samples the last model",
    )
    oversample: int = Field(12, ge=1, description="completions per prompt")
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(64, ge=1)
    gen_batch_size: int = Field(
        16, ge=1, description="prompts per sampler call (x oversample rows)"
    )
    keep: KeepConfig = Field(default_factory=KeepConfig)
    dedup: bool = Field(
        True,
        description="drop a prompt's repeated completions (exact text "
        "after whitespace normalisation)",
    )
    eval_temperature: float = Field(0.0, ge=0, description="0: greedy")
    eval_samples: int = Field(1, ge=1, description="completions per held-out prompt")
    accuracy_reward: str | None = Field(
        None,
        description="key of the reward entry that checks answers: a completion is correct "
        "when its value >= 1 (default: the first entry)",
    )


class RFTConfig(Section):
    model: SFTModelConfig = Field(default_factory=SFTModelConfig)
    optim: SFTOptimConfig = Field(default_factory=SFTOptimConfig)
    train: RFTTrainConfig = Field(default_factory=RFTTrainConfig)
    perf: CompiledPerfConfig = Field(default_factory=CompiledPerfConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    sft: SFTSection = Field(default_factory=SFTSection)
    rft: RFTSection = Field(default_factory=RFTSection)
    reward: list[RewardSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _rules(self) -> RFTConfig:
        shared_rules(self, data=False)
        rft_rules(self)
        return self


register("rft", RFTConfig)
