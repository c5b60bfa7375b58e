"""The schema of `smollab rft` (rejection-sampling fine-tuning) and its rules across keys.

Built from the shared sections and SFT's: each round's SFT reads RFT's `model`, `optim`,
`train`, `perf` and `sft` sections as `smollab sft` reads its own, and the scoring reads `reward`
as `smollab grpo` does.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from smollab.config.sections import (
    CompiledPerfConfig,
    PromptSource,
    RewardSpec,
    RunConfig,
    Section,
    compile_rules,
    dtype_rules,
    lora_rules,
    prompt_source_rules,
    reward_keys,
    shared_rules,
)
from smollab.config.sft import SFTModelConfig, SFTOptimConfig, SFTSection


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
    batch_size: int = Field(32, ge=1, description="rows per micro-batch")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step")
    seq_len: int = Field(128, ge=2, description="longest row; longer examples are truncated")
    log_interval: int = Field(10, ge=1, description="steps between a round's metrics rows")
    save_interval: int = Field(
        500, ge=0, description="steps between a round's periodic checkpoints; 0: none"
    )
    keep_last: int = Field(2, ge=1, description="periodic checkpoints kept per round")
    diverge_factor: float = Field(
        3.0, gt=1, description="diverged once the loss is above this factor x its start"
    )


class KeepConfig(Section):
    """Which scored completions a round trains on (both rules apply when both are set)."""

    threshold: float | None = Field(
        1.0,
        description="keep completions whose total reward >= "
        "this (a checker's 1.0); null: no threshold",
    )
    top_k: int | None = Field(None, ge=1, description="then at most the k best per prompt")


class RFTDataConfig(PromptSource):
    """Prompts from a dataset, and the held-out ones (a split, or a carved fraction)."""

    seed: int = Field(0, description="which prompts data.eval_fraction holds out")


class RFTSection(Section):
    """Rounds of generate -> score -> keep -> SFT -> evaluate, in one run directory."""

    prompts_file: str | None = Field(
        None,
        description="training prompts: a .txt file (one a line), or a .jsonl, .csv or .parquet "
        "table with a prompt column whose other columns reach the rewards (or data.hf_dataset)",
    )
    eval_prompts_file: str | None = Field(
        None,
        description="held-out prompts, in prompts_file's forms: the accuracy per round (or "
        "data.eval_split, data.eval_fraction; one is required)",
    )
    system_prompt: str | None = Field(
        None,
        description="a system message before each text prompt, through the model's chat "
        "template (the rewards still see the prompt as the data holds it)",
    )
    rounds: int = Field(1, ge=1, description="rounds of generate, score, keep, SFT, evaluate")
    restart_from: Literal["last", "base"] = Field(
        "last",
        description="each round's SFT starts from the last round's model, or from "
        "model.path (STaR); generation always samples the last model",
    )
    oversample: int = Field(12, ge=1, description="completions per prompt")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the generation")
    top_p: float = Field(
        1.0, gt=0, le=1, description="nucleus sampling: the likeliest tokens up to this mass"
    )
    max_new_tokens: int = Field(64, ge=1, description="most tokens per completion")
    gen_batch_size: int = Field(
        16, ge=1, description="prompts per sampler call (x oversample rows)"
    )
    keep: KeepConfig = Field(default_factory=KeepConfig, description="what a round trains on")
    dedup: bool = Field(
        True,
        description="drop a prompt's repeated completions (exact text "
        "after whitespace normalisation)",
    )
    eval_temperature: float = Field(
        0.0, ge=0, description="sampling temperature on held-out prompts; 0: greedy"
    )
    eval_samples: int = Field(1, ge=1, description="completions per held-out prompt")
    accuracy_reward: str | None = Field(
        None,
        description="key of the reward entry that checks answers: a completion is correct "
        "when its value >= 1 (default: the first entry)",
    )


class RFTConfig(Section):
    model: SFTModelConfig = Field(default_factory=SFTModelConfig)
    data: RFTDataConfig = Field(default_factory=RFTDataConfig)
    optim: SFTOptimConfig = Field(default_factory=SFTOptimConfig)
    train: RFTTrainConfig = Field(default_factory=RFTTrainConfig)
    perf: CompiledPerfConfig = Field(default_factory=CompiledPerfConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    sft: SFTSection = Field(default_factory=SFTSection)
    rft: RFTSection = Field(default_factory=RFTSection)
    reward: list[RewardSpec] = Field(
        default_factory=list,
        description="the reward's terms that score completions (required): total = sum of "
        "weight * name(completions, **params)",
    )

    @model_validator(mode="after")
    def _rules(self) -> RFTConfig:
        rft_rules(self)
        return self


def rft_rules(c: RFTConfig) -> None:
    """The shared rules (no story corpus), then RFT's own. A missing model.path, prompts file or
    reward is refused when the run starts (the schema's defaults must construct)."""
    lora_rules(c.model.lora)
    dtype_rules(c.model.dtype, c.model.lora)
    shared_rules(c.optim, c.train, c.run)
    r, t, p, d = c.rft, c.train, c.perf, c.data
    prompt_source_rules(
        d, "rft.prompts_file", r.prompts_file, "rft.eval_prompts_file", r.eval_prompts_file
    )
    if d.changed("seed") and d.eval_fraction is None:
        raise ValueError(
            "data.seed picks the prompts data.eval_fraction holds out, and data.eval_fraction "
            "is not set"
        )
    if t.epochs is not None and t.changed("max_steps"):
        raise ValueError(
            f"train.epochs={t.epochs:g} and train.max_steps={t.max_steps} are both "
            "set: a round's length is one or the other (train.epochs=null for "
            "steps)"
        )
    if r.keep.threshold is None and r.keep.top_k is None:
        raise ValueError(
            "rft.keep: set threshold, top_k or both (otherwise every completion would be kept)"
        )
    if r.eval_temperature == 0 and r.eval_samples > 1:
        raise ValueError(
            f"rft.eval_samples={r.eval_samples}: rft.eval_temperature=0 is greedy, "
            "so every sample of a prompt would be the same"
        )
    keys = reward_keys(x.name for x in c.reward)
    if r.accuracy_reward is not None and r.accuracy_reward not in keys:
        raise ValueError(
            f"rft.accuracy_reward={r.accuracy_reward} names no reward entry (the "
            f"keys: {', '.join(keys) or 'none'})"
        )
    compile_rules(p)
