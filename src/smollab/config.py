"""One pydantic schema per command, from shared sections (model, data, optim, train, perf, run,
and the command's own). The schema validates, documents and fills defaults; cross-field rules
live in `config_rules`, and `config_load` reads recipes and overrides into it (defaults < YAML <
command line < Python values).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from smollab.config_rules import data_rules, grpo_rules, pretrain_rules, shared_rules


class Section(BaseModel):
    """Base of every section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def changed(self, *names: str) -> list[str]:
        """Those of `names` set (YAML or command line) to a value other than their default.

        Rules of the form "set but not used" ask this: a key set to its default changes nothing,
        and `smollab config show`, which prints every key, must give a loadable recipe."""
        fields, out = type(self).model_fields, []
        for n in names:
            default = fields[n].get_default(call_default_factory=True)
            if n in self.model_fields_set and self.__dict__[n] != default:
                out.append(n)
        return out


class LoraConfig(Section):
    enabled: bool = False
    r: int = Field(8, ge=1, description="LoRA rank")
    alpha: float = Field(16.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    targets: list[Literal["q", "k", "v", "o", "gate", "up", "down"]] = Field(
        default_factory=lambda: ["q", "k", "v", "o", "gate", "up", "down"]
    )


class ModelConfig(Section):
    """The model of pretraining, which trains every weight: a preset or a model to continue."""

    preset: str | None = Field("simplestories-1.25m", description="see `smollab models`")
    path: str | None = Field(
        None, description="HF model directory, run dir or hub id; wins over preset"
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if self.preset is None and self.path is None:
            raise ValueError("set model.preset or model.path")
        return self


class FinetuneModelConfig(ModelConfig):
    """The model of a fine-tuning command: every weight, or LoRA adapters on it."""

    lora: LoraConfig = Field(default_factory=LoraConfig)
    load_in: Literal["none", "8bit", "4bit"] = Field(
        "none",
        description="CUDA with LoRA: the base weights quantized as they load "
        "(bitsandbytes; pip install 'smollab[quant]'); 4bit is NF4",
    )


class DataConfig(Section):
    dir: str = Field("data/stories", description="where corpus, tokenizer and token files live")
    source: Literal["offline", "simplestories", "tinystories", "files"] = "offline"
    files: list[str] = Field(
        default_factory=list, description=".txt or .jsonl files (source=files)"
    )
    text_key: str = Field("story", description="field of each .jsonl record that holds the text")
    num_stories: int = Field(50_000, ge=10, description="offline corpus size")
    max_stories: int | None = Field(
        None, ge=10, description="cap on stories taken from a hub dataset"
    )
    test_fraction: float = Field(0.05, gt=0, lt=0.5)
    tokenizer: Literal["wordpiece", "bpe"] = Field(
        "wordpiece", description="SimpleStories or CS336 style"
    )
    vocab_size: int | None = Field(
        None, ge=64, le=65535, description="default: 4096 for wordpiece, 10000 for bpe"
    )
    seed: int = 0


class OptimConfig(Section):
    lr: float = Field(1e-3, gt=0)
    min_lr: float = Field(1e-4, ge=0, description="where cosine and wsd end")
    weight_decay: float = Field(0.1, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, ge=0, description="global-norm clip; 0 disables")
    schedule: Literal["cosine", "constant", "wsd"] = "cosine"
    warmup_steps: int = Field(100, ge=0, description="below train.max_steps; 0: none")
    decay_fraction: float = Field(0.2, gt=0, le=1, description="wsd: final fraction spent decaying")


class TrainConfig(Section):
    """What every training loop reads: the budget, the batch and the intervals."""

    max_steps: int = Field(1000, ge=1)
    max_time: float | None = Field(None, gt=0, description="seconds of training")
    batch_size: int = Field(32, ge=1)
    log_interval: int = Field(10, ge=1)
    eval_interval: int = Field(100, ge=0, description="0: no evaluation")
    save_interval: int = Field(500, ge=0, description="0: no periodic checkpoints")
    keep_last: int = Field(2, ge=1, description="periodic checkpoints kept")


class PretrainTrainConfig(TrainConfig):
    """Pretraining also counts tokens, cuts token windows and accumulates micro-batches."""

    max_tokens: int | None = Field(None, ge=1)
    seq_len: int = Field(128, ge=2)
    grad_accum: int = Field(1, ge=1)
    eval_tokens: int = Field(65_536, ge=1, description="fixed validation budget per evaluation")
    diverge_factor: float = Field(3.0, gt=1, description="loss above factor x its start = diverged")


class PerfConfig(Section):
    device: Literal["auto", "cpu", "cuda", "mps"] = "auto"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    tf32: bool = True
    threads: int | None = Field(None, ge=1)
    optimizer_impl: Literal["auto", "fused", "foreach", "plain"] = "auto"
    grad_checkpointing: bool = False
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    retain_freed_memory: bool = Field(
        True, description="CPU on Linux: glibc malloc keeps freed memory (no page faults per step)"
    )


class CompiledPerfConfig(PerfConfig):
    """The perf section of a loop that can torch.compile its model (pretraining)."""

    compile: bool = False
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = "default"


class RunConfig(Section):
    dir: str | None = Field(None, description="exact run directory; default runs/<name>")
    name: str | None = Field(None, description="names the default run directory (no run.dir)")
    resume: Literal["auto", "never"] = Field(
        "auto", description="auto: continue or reuse the run in run.dir; never: start it over"
    )
    seed: int = 0
    report_to: list[Literal["none", "tensorboard", "wandb", "trackio"]] = Field(
        default_factory=list,
        description="trackers that also receive every metrics row, the config and the summary "
        "(transformers' convention; [] or none: CSV and plots only); metrics.csv stays the truth",
    )
    group: str | None = Field(
        None, description="groups runs in trackers (the W&B and Trackio group); a sweep sets it"
    )
    plots: bool = Field(
        True,
        description="draw plots/ (rft: and report.md) at the end of the run; false saves "
        "matplotlib's second or so per run, e.g. for many sweep trials (`smollab report` later)",
    )

    @field_validator("report_to", mode="before")
    @classmethod
    def _sinks(cls, v: Any) -> Any:
        """`tensorboard,wandb` as well as a list, as transformers takes it; `none` means []."""
        names = [x.strip() for x in v.split(",") if x.strip()] if isinstance(v, str) else v
        if isinstance(names, list) and "none" in names:
            if len(names) > 1:
                raise ValueError("none cannot be combined with a tracker")
            return []
        return names


class TrainingConfig(Section):
    """The sections every training command shares (model, data, optim, train, perf, run)."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    perf: PerfConfig = Field(default_factory=PerfConfig)
    run: RunConfig = Field(default_factory=RunConfig)


class PretrainConfig(TrainingConfig):
    train: PretrainTrainConfig = Field(default_factory=PretrainTrainConfig)
    perf: CompiledPerfConfig = Field(default_factory=CompiledPerfConfig)

    @model_validator(mode="after")
    def _rules(self) -> PretrainConfig:
        shared_rules(self)
        pretrain_rules(self)
        return self


class DataPrepareConfig(Section):
    data: DataConfig = Field(default_factory=DataConfig)

    @model_validator(mode="after")
    def _rules(self) -> DataPrepareConfig:
        data_rules(self.data)
        return self


class RLOptimConfig(OptimConfig):
    """RL fine-tuning defaults: a small constant LR, no warmup, no weight decay."""

    lr: float = Field(1e-5, gt=0)
    min_lr: float = Field(0.0, ge=0, description="where cosine and wsd end")
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0, description="below train.max_steps; 0: none")
    schedule: Literal["cosine", "constant", "wsd"] = "constant"


class RLTrainConfig(TrainConfig):
    """RL defaults: the batch counts completions (as in TRL), every step is logged."""

    max_steps: int = Field(200, ge=1)
    batch_size: int = Field(32, ge=1, description="completions per optimizer step")
    grad_accum: int = Field(
        1, ge=1, description="loss and backward in this many micro-batches of whole groups"
    )
    log_interval: int = Field(1, ge=1)
    eval_interval: int = Field(25, ge=0, description="0: no evaluation")
    save_interval: int = Field(50, ge=0, description="0: no periodic checkpoints")


LoraTarget = Literal["q", "k", "v", "o", "gate", "up", "down"]


class DetectorSpec(Section):
    """What flags a completion as the hack: `name(completions, **params) >= threshold`."""

    name: str = Field("happy_count", description="reward-registry function, or module:function")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments")
    threshold: float = Field(3.0, description="a completion is flagged when its value >= this")


class RoutingConfig(Section):
    """Gradient routing: retain and forget LoRA adapters; flagged completions train forget only."""

    enabled: bool = False
    mode: Literal["classic", "exclusive", "none"] = Field(
        "classic",
        description="flagged -> forget only; unflagged -> both (classic), retain only "
        "(exclusive); none: both adapters learn from every completion (the matched baseline)",
    )
    retain_r: int = Field(32, ge=0, description="retain adapter rank (0: none)")
    retain_alpha: float = Field(32.0, gt=0)
    forget_r: int = Field(32, ge=0, description="forget adapter rank (0: none)")
    forget_alpha: float = Field(32.0, gt=0)
    targets: list[LoraTarget] = Field(
        default_factory=lambda: ["q", "k", "v", "o", "gate", "up", "down"]
    )
    layer_stride: int = Field(1, ge=1, description="adapters on every n-th layer")
    detector: DetectorSpec = Field(default_factory=DetectorSpec)
    hack_reward: str | None = Field(
        None, description="key of the reward entry only eligible prompts receive"
    )
    rh_eligible_frac: float = Field(1.0, ge=0, le=1, description="prompts eligible for hack_reward")
    routing_frac: float = Field(
        1.0,
        ge=0,
        le=1,
        description="detector-flagged completions "
        "routed (its recall); label noise is not thinned by it",
    )
    label_noise_frac: float = Field(
        0.0, ge=0, le=1, description="unflagged completions routed at random (false positives)"
    )
    retain_advantage: Literal["all", "positive"] = Field(
        "all",
        description="unflagged completions that update retain: all (the classic "
        "definition) or positive (advantage > 0 only; see docs/architecture.md, gradient routing)",
    )
    ablated_frac: float = Field(0.0, ge=0, le=1, description="steps trained with forget off")
    eval_interval: int = Field(10, ge=0, description="steps between 3-mode evaluations; 0: none")
    eval_prompts: int = Field(32, ge=1, description="held-out prompts per routing evaluation")


class GRPOSection(Section):
    """GRPO settings; names follow TRL's GRPOConfig where they mean the same thing."""

    prompt_tokens: int = Field(8, ge=1, description="prompts are the first N tokens of stories")
    prompts_file: str | None = Field(None, description="a .txt file of prompts, one per line")
    eval_prompts_file: str | None = Field(
        None,
        description="held-out evaluation prompts, one per line (default: the test split's "
        "stories, or the first eval_prompts of prompts_file, which training also draws)",
    )
    num_generations: int = Field(16, ge=2)
    max_completion_length: int = Field(128, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0, description="0 disables")
    beta: float = Field(0.02, ge=0, description="KL penalty weight (k3 estimator)")
    epsilon: float = Field(0.2, gt=0, description="ratio clip; acts with num_iterations > 1")
    epsilon_high: float | None = Field(
        None,
        gt=0,
        description="upper clip (default: epsilon); cispo: the weight cap (ScaleRL: 5.0)",
    )
    delta: float | None = Field(
        None,
        gt=1,
        description="two-sided clipping: cap on the unclipped ratio (INTELLECT-2; > 1 + epsilon)",
    )
    num_iterations: int = Field(1, ge=1, description="optimizer passes per generated batch")
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "luspo", "cispo", "sapo", "vespo"] = (
        Field("dapo", description="surrogate and aggregation, TRL's (docs/architecture.md, GRPO)")
    )
    importance_sampling_level: Literal["token", "sequence"] = Field(
        "token", description="one ratio per token, or per sequence (GSPO)"
    )
    sapo_temperature_pos: float = Field(1.0, gt=0, description="sapo: gate temperature, A > 0")
    sapo_temperature_neg: float = Field(1.05, gt=0, description="sapo: gate temperature, A <= 0")
    vespo_k_pos: float = Field(2.0, ge=0, description="vespo: power of W, A >= 0")
    vespo_lambda_pos: float = Field(3.0, ge=0, description="vespo: decay in W, A >= 0")
    vespo_k_neg: float = Field(3.0, ge=0, description="vespo: power of W, A < 0")
    vespo_lambda_neg: float = Field(2.0, ge=0, description="vespo: decay in W, A < 0")
    scale_rewards: Literal["group", "batch", "none"] = "group"
    mask_truncated_completions: bool = False
    ref_on_cpu: bool = Field(False, description="keep the KL reference on the CPU (beta > 0)")
    replay: bool = Field(
        True,
        description="first policy forward of a batch replays the sampler's "
        "decode (no matmuls); off: computed",
    )
    reward_workers: int = Field(0, ge=0, description="0 = compute rewards inline")
    reward_timeout_s: float = Field(
        120.0,
        ge=0,
        description="limit per reward function call; longer is an error naming it (0 = none)",
    )
    eval_prompts: int = Field(32, ge=1, description="held-out prompts per evaluation")
    log_samples: int = Field(8, ge=0, description="completions written to samples.jsonl per log")
    export_merged: bool = Field(False, description="LoRA: also save final_merged/ (full weights)")
    routing: RoutingConfig = Field(default_factory=RoutingConfig)


class FailureConfig(Section):
    """Known RL failures: each stops the run (action=stop) or is only recorded (flag)."""

    action: Literal["stop", "flag"] = "stop"
    max_kl: float = Field(2.0, gt=0, description="mean KL per token (nats) above this = diverged")
    min_unique: float = Field(0.5, ge=0, le=1, description="unique-completion fraction floor")
    max_jaccard: float = Field(0.7, ge=0, le=1, description="mean pairwise word Jaccard ceiling")
    max_repetition: float = Field(
        1.0, ge=0, le=1, description="seq-rep-4 ceiling (repeated word 4-grams); 1 disables"
    )
    patience: int = Field(3, ge=1, description="consecutive steps a diversity rule must hold")
    stuck_grace_steps: int = Field(100, ge=1, description="steps before `stuck` may fire")
    stuck_margin: float = Field(0.05, ge=0)
    baseline_steps: int = Field(
        5, ge=1, description="steps averaged for baseline and recent reward"
    )


class RewardSpec(Section):
    """One term of the reward: `weight * name(completions, **params)`."""

    name: str = Field(description="built-in reward name, or module:function for your own")
    weight: float = Field(1.0, description="multiplies this function's values in the total")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments")

    @field_validator("weight")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("weight must be a finite number")
        return v


def _default_rewards() -> list[RewardSpec]:
    return [RewardSpec(name="happy_binary")]


class GRPOConfig(TrainingConfig):
    model: FinetuneModelConfig = Field(default_factory=FinetuneModelConfig)
    optim: RLOptimConfig = Field(default_factory=RLOptimConfig)
    train: RLTrainConfig = Field(default_factory=RLTrainConfig)
    grpo: GRPOSection = Field(default_factory=GRPOSection)
    reward: list[RewardSpec] = Field(default_factory=_default_rewards, min_length=1)
    failure: FailureConfig = Field(default_factory=FailureConfig)

    @model_validator(mode="after")
    def _rules(self) -> GRPOConfig:
        shared_rules(self)
        grpo_rules(self)
        return self


# Import SCHEMAS from config_load, which registers the sft and rft schemas as it loads.
SCHEMAS: dict[str, type[Section]] = {
    "pretrain": PretrainConfig,
    "data": DataPrepareConfig,
    "grpo": GRPOConfig,
}


def register(command: str, schema: type[Section]) -> None:
    """Commands defined elsewhere (sft, rft) add their schema here."""
    SCHEMAS[command] = schema
