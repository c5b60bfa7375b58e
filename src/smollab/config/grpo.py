"""The schema of `smollab grpo`: the shared sections with RL defaults, the model with LoRA and
quantized loading, the `grpo` section (names follow TRL's GRPOConfig where they mean the same
thing), gradient routing, the reward terms and the failure rules; and GRPO's rules across keys.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from smollab.config.sections import (
    DataConfig,
    LoraConfig,
    LoraTarget,
    ModelConfig,
    OptimConfig,
    PromptSource,
    RewardSpec,
    Section,
    TrainConfig,
    TrainingConfig,
    data_rules,
    doc,
    dtype_rules,
    lora_rules,
    model_rules,
    prompt_source_rules,
    reward_keys,
    shared_rules,
)


class FinetuneModelConfig(ModelConfig):
    """The model of a fine-tuning command: every weight, or LoRA adapters on it."""

    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapters")
    load_in: Literal["none", "8bit", "4bit"] = Field(
        "none",
        description="CUDA with LoRA: the base weights quantized as they load "
        "(bitsandbytes; pip install 'smollab[quant]'); 4bit is NF4",
    )


class GRPODataConfig(DataConfig, PromptSource):
    """The story corpus (the default prompts: its stories' openings) and prompts from data."""

    seed: int = Field(
        0,
        description="seed of the offline stories and of the shuffle before their held-out "
        "split, and of which prompts data.eval_fraction holds out",
    )


class RLOptimConfig(OptimConfig):
    """RL fine-tuning defaults: a small constant LR, no warmup, no weight decay."""

    lr: float = Field(1e-5, gt=0, description=doc(OptimConfig, "lr"))
    min_lr: float = Field(0.0, ge=0, description=doc(OptimConfig, "min_lr"))
    weight_decay: float = Field(0.0, ge=0, description=doc(OptimConfig, "weight_decay"))
    warmup_steps: int = Field(0, ge=0, description=doc(OptimConfig, "warmup_steps"))
    schedule: Literal["cosine", "constant", "wsd"] = Field(
        "constant", description=doc(OptimConfig, "schedule")
    )


class RLTrainConfig(TrainConfig):
    """RL defaults: the batch counts completions (as in TRL), every step is logged."""

    max_steps: int = Field(200, ge=1, description=doc(TrainConfig, "max_steps"))
    epochs: float | None = Field(
        None,
        gt=0,
        description="passes over the training prompts (instead of train.max_steps), each a "
        "seeded permutation of them",
    )
    batch_size: int = Field(
        32, ge=1, description="completions per optimizer step (num_generations per prompt)"
    )
    grad_accum: int = Field(
        1, ge=1, description="loss and backward in this many micro-batches of whole groups"
    )
    log_interval: int = Field(1, ge=1, description=doc(TrainConfig, "log_interval"))
    eval_interval: int = Field(25, ge=0, description=doc(TrainConfig, "eval_interval"))
    save_interval: int = Field(50, ge=0, description=doc(TrainConfig, "save_interval"))


class DetectorSpec(Section):
    """What flags a completion as the hack: `name(completions, **params) >= threshold`."""

    name: str = Field("happy_count", description="reward-registry function, or module:function")
    params: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the detector function"
    )
    threshold: float = Field(3.0, description="a completion is flagged when its value >= this")


class RoutingConfig(Section):
    """Gradient routing: retain and forget LoRA adapters; flagged completions train forget only."""

    enabled: bool = Field(
        False, description="train retain and forget adapters instead of model.lora"
    )
    mode: Literal["classic", "exclusive", "none"] = Field(
        "classic",
        description="flagged -> forget only; unflagged -> both (classic), retain only "
        "(exclusive); none: both adapters learn from every completion (the matched baseline)",
    )
    retain_r: int = Field(32, ge=0, description="retain adapter rank (0: none)")
    retain_alpha: float = Field(32.0, gt=0, description="retain adapter's LoRA alpha")
    forget_r: int = Field(32, ge=0, description="forget adapter rank (0: none)")
    forget_alpha: float = Field(32.0, gt=0, description="forget adapter's LoRA alpha")
    targets: list[LoraTarget] = Field(
        default_factory=lambda: ["q", "k", "v", "o", "gate", "up", "down"],
        description="projections that get both adapters (as model.lora.targets)",
    )
    layer_stride: int = Field(1, ge=1, description="adapters on every n-th layer")
    detector: DetectorSpec = Field(
        default_factory=DetectorSpec, description="what flags a completion as the hack"
    )
    hack_reward: str | None = Field(
        None, description="key of the reward entry only eligible prompts receive"
    )
    rh_eligible_frac: float = Field(
        1.0, ge=0, le=1, description="fraction of prompts eligible for hack_reward"
    )
    eligibility: Literal["prompt", "completion"] = Field(
        "prompt",
        description="who draws hack_reward's eligibility: each prompt (its group shares it) or "
        "each completion (small-rl's runs)",
    )
    gate_flags: bool = Field(
        False,
        description="flag only eligible completions (small-rl): an ineligible one that hacks "
        "is unpaid and trains both adapters",
    )
    reward_cap: float | None = Field(
        None, description="the total reward, after eligibility, is at most this (small-rl: 1.0)"
    )
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
    retain_advantage: Literal["all", "positive", "renorm", "balanced", "penalty"] = Field(
        "all",
        description="what retain learns from unflagged completions: all (the classic "
        "definition), positive (advantage > 0 only), renorm (advantages within the group's "
        "unflagged rows), balanced (baseline: the unflagged rows' mean; forget's gradient "
        "doubled on flagged rows), penalty (every row, flagged ones at their reward less "
        "retain_penalty, in a pass of its own); see docs/architecture.md, gradient routing",
    )
    retain_penalty: float | None = Field(
        None,
        ge=0,
        description="retain_advantage=penalty: what a flagged completion's reward loses for "
        "the retain adapter's advantages (small-rl's retain_penalty)",
    )
    ablated_frac: float = Field(
        0.0, ge=0, le=1, description="fraction of steps trained with the forget adapter off"
    )
    eval_interval: int = Field(10, ge=0, description="steps between 3-mode evaluations; 0: none")
    eval_prompts: int = Field(32, ge=1, description="held-out prompts per routing evaluation")
    eval_forget_scales: list[float] = Field(
        default_factory=list,
        description="forget scales in (0, 1) each routing evaluation also samples (both "
        "adapters, forget's times s; 0 is retain_only, 1 both): the forget-scale curve",
    )


class GRPOSection(Section):
    """GRPO settings; names follow TRL's GRPOConfig where they mean the same thing."""

    prompt_tokens: int = Field(8, ge=1, description="prompts are the first N tokens of stories")
    prompts_file: str | None = Field(
        None,
        description="training prompts: a .txt file (one a line), or a .jsonl, .csv or .parquet "
        "table with a prompt column whose other columns reach the rewards",
    )
    eval_prompts_file: str | None = Field(
        None,
        description="held-out evaluation prompts, in prompts_file's forms (default: "
        "data.eval_split or data.eval_fraction; else the test split's stories, or the first "
        "eval_prompts of the training prompts, which training also draws)",
    )
    system_prompt: str | None = Field(
        None,
        description="a system message before each text prompt, through the model's chat "
        "template (the rewards still see the prompt as the data holds it)",
    )
    num_generations: int = Field(
        16, ge=2, description="completions per prompt: the group whose rewards are compared"
    )
    max_completion_length: int = Field(128, ge=1, description="most tokens per completion")
    temperature: float = Field(1.0, gt=0, description="sampling temperature of the rollouts")
    top_p: float = Field(
        1.0, gt=0, le=1, description="nucleus sampling: the likeliest tokens up to this mass"
    )
    top_k: int = Field(0, ge=0, description="sample among the k likeliest tokens; 0 disables")
    repetition_penalty: float = Field(
        1.0,
        gt=0,
        description="HF's, on the rollouts: logits of tokens already in the prompt or "
        "completion divided by it (multiplied where negative); the loss keeps the unpenalized "
        "policy's log-probs, so the policy forward is computed, not replayed",
    )
    beta: float = Field(
        0.02, ge=0, description="KL penalty weight (k3 estimator); 0: no reference model"
    )
    epsilon: float = Field(
        0.2,
        gt=0,
        description="clip of the policy ratio at 1 - epsilon (and 1 + epsilon_high); acts with "
        "num_iterations > 1",
    )
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
        Field(
            "dapo",
            description="the surrogate loss and its aggregation, as TRL names them "
            "(docs/architecture.md, GRPO)",
        )
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
    use_bias_correction_kl: bool = Field(
        True,
        description="KL term times the importance weight (DeepSeek-V3.2; TRL's default): the "
        "unbiased reverse-KL gradient, also on a fresh batch",
    )
    off_policy_mask_threshold: float | None = Field(
        None,
        description="drop sequences with A < 0 whose mean KL(sampler || policy) per token exceeds "
        "this (DeepSeek-V3.2's off-policy mask; e.g. 0.5)",
    )
    top_entropy_quantile: float = Field(
        1.0,
        ge=0,
        le=1,
        description="train on the top quantile of tokens by policy entropy only (1: all; 0: the "
        "highest alone)",
    )
    entropy_coef: float = Field(
        0.0,
        description="entropy bonus: minus this times the mean per-token entropy; with "
        "use_adaptive_entropy its starting value",
    )
    use_adaptive_entropy: bool = Field(
        False,
        description="Skywork-OR1's control: entropy_coef moves by entropy_coef_delta each step, "
        "applied only while the entropy is at most entropy_target",
    )
    entropy_coef_min: float = Field(0.0, description="adaptive entropy: least entropy_coef")
    entropy_coef_max: float = Field(1.0, description="adaptive entropy: largest entropy_coef")
    entropy_coef_delta: float = Field(
        0.005, ge=0, description="adaptive entropy: entropy_coef's change per optimizer step"
    )
    entropy_target: float = Field(
        0.2, description="adaptive entropy: the mean per-token entropy (nats) it defends"
    )
    multi_objective_aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = Field(
        "sum_then_normalize",
        description="several rewards: weighted sum, then scale_rewards; or each normalized in "
        "its group, summed, then normalized over the batch (GDPO)",
    )
    steps_per_generation: int | None = Field(
        None,
        ge=1,
        description="micro-batches trained per generated batch, as TRL counts them (default "
        "train.grad_accum: one optimizer step); k x train.grad_accum: k optimizer steps",
    )
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group",
        description="advantages divided by the reward std of the group, of the batch, or not "
        "at all (none)",
    )
    mask_truncated_completions: bool = Field(
        False, description="completions cut at max_completion_length carry no loss (DAPO)"
    )
    ref_on_cpu: bool = Field(False, description="keep the KL reference on the CPU (beta > 0)")
    replay: bool = Field(
        True,
        description="first policy forward of a batch replays the sampler's "
        "decode (no matmuls); off: computed",
    )
    decode: Literal["auto", "eager", "static", "compiled"] = Field(
        "auto",
        description="the lean sampler's decode step: eager, static (fixed shapes, the cache "
        "slot on the device), compiled (static through torch.compile); auto: the measured "
        "best on the device (the run log says which and why)",
    )
    reward_workers: int = Field(
        0, ge=0, description="processes computing rewards; 0: computed inline"
    )
    reward_timeout_s: float = Field(
        120.0,
        ge=0,
        description="limit per reward function call; longer is an error naming it (0 = none)",
    )
    eval_prompts: int = Field(32, ge=1, description="held-out prompts per evaluation")
    log_samples: int = Field(8, ge=0, description="completions written to samples.jsonl per log")
    export_merged: bool = Field(False, description="LoRA: also save final_merged/ (full weights)")
    routing: RoutingConfig = Field(default_factory=RoutingConfig, description="gradient routing")


class FailureConfig(Section):
    """Known RL failures: each stops the run (action=stop) or is only recorded (flag)."""

    action: Literal["stop", "flag"] = Field(
        "stop",
        description="stop: a degenerate or stuck run ends with that status; flag: it is only "
        "recorded (diverged always stops)",
    )
    max_kl: float = Field(2.0, gt=0, description="mean KL per token (nats) above this = diverged")
    min_unique: float = Field(
        0.5, ge=0, le=1, description="degenerate below this fraction of unique completions"
    )
    max_jaccard: float = Field(
        0.7, ge=0, le=1, description="degenerate above this mean pairwise word Jaccard"
    )
    max_repetition: float = Field(
        1.0,
        ge=0,
        le=1,
        description="degenerate above this seq-rep-4 (repeated word 4-grams); 1 disables",
    )
    patience: int = Field(3, ge=1, description="consecutive steps a diversity rule must hold")
    stuck_grace_steps: int = Field(100, ge=1, description="steps before `stuck` may fire")
    stuck_margin: float = Field(
        0.05, ge=0, description="stuck unless the recent reward beats the baseline by this"
    )
    baseline_steps: int = Field(
        5, ge=1, description="steps averaged for baseline and recent reward"
    )


def _default_rewards() -> list[RewardSpec]:
    return [RewardSpec(name="happy_binary")]


class GRPOConfig(TrainingConfig):
    model: FinetuneModelConfig = Field(default_factory=FinetuneModelConfig)
    data: GRPODataConfig = Field(default_factory=GRPODataConfig)
    optim: RLOptimConfig = Field(default_factory=RLOptimConfig)
    train: RLTrainConfig = Field(default_factory=RLTrainConfig)
    grpo: GRPOSection = Field(default_factory=GRPOSection)
    reward: list[RewardSpec] = Field(
        default_factory=_default_rewards,
        min_length=1,
        description="the reward's terms: total = sum of weight * name(completions, **params)",
    )
    failure: FailureConfig = Field(default_factory=FailureConfig)

    @model_validator(mode="after")
    def _rules(self) -> GRPOConfig:
        grpo_rules(self)
        return self


def _quantized_base_rules(c: GRPOConfig) -> None:
    """model.load_in: a quantized base is loaded from model.path and trains LoRA adapters only."""
    m = c.model
    if m.load_in != "none" and not m.path:
        raise ValueError(
            f"model.load_in={m.load_in} quantizes weights as they load from "
            "model.path, and model.preset builds a fresh model (save it and set "
            "model.path)"
        )
    if m.load_in != "none" and c.grpo.routing.enabled:
        raise ValueError(
            f"model.load_in={m.load_in}: grpo.routing's adapters are built on a "
            "full-precision base; quantized loading is for model.lora"
        )
    if m.load_in != "none" and m.changed("dtype"):
        raise ValueError(
            f"model.load_in={m.load_in} stores the base quantized; model.dtype={m.dtype} is "
            "for full-precision weights (perf.precision sets the compute dtype)"
        )
    if m.load_in != "none" and not m.lora.enabled:
        raise ValueError(
            f"model.load_in={m.load_in} freezes the base in {m.load_in}, and "
            "model.lora.enabled is false: only LoRA adapters can train on a "
            "quantized base"
        )


# grpo.loss_type: TRL 1.16's names. The clipped surrogate's family, and the loss-specific keys.
_CLIP_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
_SAPO = ("sapo_temperature_pos", "sapo_temperature_neg")
_VESPO = ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")


def _loss_type_rules(g: GRPOSection) -> None:
    """A loss-specific key set for a loss type that does not read it, and TRL's pitfalls."""
    readers = (
        {"epsilon": _CLIP_LOSSES, "epsilon_high": (*_CLIP_LOSSES, "cispo"), "delta": _CLIP_LOSSES}
        | dict.fromkeys(_SAPO, ("sapo",))
        | dict.fromkeys(_VESPO, ("vespo",))
    )
    if g.loss_type == "cispo" and g.epsilon_high is None:
        readers["epsilon"] = ("cispo",)  # TRL's fallback: the weight cap is epsilon
    for key in g.changed(*readers):
        if g.loss_type not in readers[key]:
            raise ValueError(
                f"grpo.{key} is read by loss_type {'/'.join(readers[key])}, and "
                f"grpo.loss_type={g.loss_type} does not read it"
            )
    if g.loss_type == "vespo" and g.importance_sampling_level == "sequence":
        raise ValueError(
            "grpo.importance_sampling_level=sequence: grpo.loss_type=vespo weighs "
            "each sequence by its own ratio and reads no importance level"
        )
    cap = g.epsilon if g.epsilon_high is None else g.epsilon_high
    if g.loss_type == "cispo" and cap < 1:
        raise ValueError(
            f"grpo.loss_type=cispo caps the importance weight at grpo.epsilon_high "
            f"(unset: grpo.epsilon) = {cap:g}, below the on-policy weight 1: set "
            "grpo.epsilon_high >= 1 (ScaleRL: 5.0)"
        )


_ADAPTIVE = ("entropy_coef_min", "entropy_coef_max", "entropy_coef_delta", "entropy_target")


def _trl_knob_rules(c: GRPOConfig) -> None:
    """TRL 1.16's KL correction, entropy, multi-reward and generation-reuse keys."""
    g = c.grpo
    if g.beta == 0 and g.changed("use_bias_correction_kl"):
        raise ValueError("grpo.use_bias_correction_kl weighs the KL term, and grpo.beta=0 has none")
    if not g.use_adaptive_entropy and (keys := g.changed(*_ADAPTIVE)):
        raise ValueError(
            f"grpo.{keys[0]} tunes adaptive entropy control, and grpo.use_adaptive_entropy is false"
        )
    if g.entropy_coef_min > g.entropy_coef_max:
        raise ValueError(
            f"grpo.entropy_coef_min={g.entropy_coef_min:g} is above "
            f"grpo.entropy_coef_max={g.entropy_coef_max:g}"
        )
    if g.multi_objective_aggregation == "normalize_then_sum" and g.changed("scale_rewards"):
        raise ValueError(
            "grpo.scale_rewards: grpo.multi_objective_aggregation=normalize_then_sum "
            "normalizes each reward in its group and their sum over the batch, and reads "
            "no scale_rewards"
        )
    if (
        g.multi_objective_aggregation == "normalize_then_sum"
        and g.routing.enabled
        and g.routing.hack_reward
    ):
        raise ValueError(
            "grpo.multi_objective_aggregation=normalize_then_sum normalizes each reward's own "
            "values, and grpo.routing.hack_reward changes the total only"
        )
    spg, accum = g.steps_per_generation, c.train.grad_accum
    if spg is not None and spg % accum:
        raise ValueError(
            f"grpo.steps_per_generation={spg} is not a multiple of train.grad_accum={accum}: "
            "each generated batch must hold whole optimizer steps"
        )
    steps = (spg or accum) // accum
    if steps > 1 and g.routing.enabled:
        raise ValueError(
            f"grpo.steps_per_generation={spg} trains {steps} optimizer steps on one generated "
            "batch, and grpo.routing routes each step's own batch"
        )
    if steps > 1 and c.train.save_interval % steps:
        raise ValueError(
            f"train.save_interval={c.train.save_interval} must be a multiple of the {steps} "
            f"optimizer steps per generated batch (grpo.steps_per_generation={spg}): a "
            "checkpoint falls between generations, so a resume replays the same batches"
        )


def grpo_rules(c: GRPOConfig) -> None:
    """The shared rules (the quantized base among them), then GRPO's own."""
    model_rules(c.model)
    lora_rules(c.model.lora)
    dtype_rules(c.model.dtype, c.model.lora)
    _quantized_base_rules(c)
    data_rules(c.data)
    shared_rules(c.optim, c.train, c.run)
    g, f = c.grpo, c.failure
    if c.train.batch_size % g.num_generations:
        raise ValueError(
            f"train.batch_size={c.train.batch_size} must be a multiple of "
            f"grpo.num_generations={g.num_generations}"
        )
    groups = c.train.batch_size // g.num_generations
    if groups % c.train.grad_accum:
        raise ValueError(
            f"train.grad_accum={c.train.grad_accum} must divide the {groups} prompt "
            "groups of a batch (train.batch_size / grpo.num_generations): each "
            "micro-batch holds whole groups"
        )
    _loss_type_rules(g)
    if g.loss_type in _CLIP_LOSSES and g.epsilon_high is not None and g.epsilon_high < g.epsilon:
        raise ValueError(
            f"grpo.epsilon_high={g.epsilon_high:g} is below grpo.epsilon="
            f"{g.epsilon:g}: the upper clip is the wider one (DAPO's "
            "clip-higher)"
        )
    off_policy = ("epsilon", "delta", "off_policy_mask_threshold", *_SAPO, *_VESPO)
    off_policy += ("epsilon_high",) if g.loss_type != "cispo" else ()
    once = g.steps_per_generation in (None, c.train.grad_accum)
    if g.num_iterations == 1 and once and (keys := g.changed(*off_policy)):
        raise ValueError(
            f"grpo.{keys[0]} acts on the ratio to the sampling policy, which is 1 "
            "when each batch is used once (grpo.num_iterations=1, one optimizer step per "
            "generated batch)"
        )
    _trl_knob_rules(c)
    prompt_source_rules(
        c.data, "grpo.prompts_file", g.prompts_file, "grpo.eval_prompts_file", g.eval_prompts_file
    )
    from_data = "grpo.prompts_file" if g.prompts_file else "data.hf_dataset"
    if (g.prompts_file or c.data.hf_dataset) and g.changed("prompt_tokens"):
        raise ValueError(
            f"grpo.prompt_tokens cuts story openings into prompts, and {from_data}'s "
            "prompts are used whole"
        )
    if g.system_prompt is not None and not (g.prompts_file or c.data.hf_dataset):
        raise ValueError(
            "grpo.system_prompt goes before prompts from data (grpo.prompts_file, "
            "data.hf_dataset), and the prompts are story openings"
        )
    if c.train.epochs is not None and c.train.changed("max_steps"):
        raise ValueError(
            f"train.epochs={c.train.epochs:g} and train.max_steps={c.train.max_steps} are both "
            "set: the run's length is one or the other"
        )
    if g.beta == 0 and g.ref_on_cpu:
        raise ValueError("grpo.ref_on_cpu places the KL reference, and grpo.beta=0 builds none")
    if g.beta == 0 and f.changed("max_kl"):
        raise ValueError(
            "failure.max_kl watches the KL to the reference, and grpo.beta=0 measures none"
        )
    if g.export_merged and c.model.load_in != "none":
        raise ValueError(
            f"grpo.export_merged merges LoRA adapters into the base, and "
            f"model.load_in={c.model.load_in} holds it quantized (merging would "
            "round the adapters away)"
        )
    if g.export_merged and not c.model.lora.enabled:
        raise ValueError(
            "grpo.export_merged merges LoRA adapters, and model.lora.enabled is "
            "false (final/ already holds the full weights)"
        )
    held = [
        k
        for k, v in (
            ("grpo.eval_prompts_file", g.eval_prompts_file),
            ("data.eval_split", c.data.eval_split),
            ("data.eval_fraction", c.data.eval_fraction),
        )
        if v is not None
    ]
    if not c.train.eval_interval and held and not g.routing.enabled:
        raise ValueError(
            f"{held[0]} holds evaluation prompts, and train.eval_interval=0 turns evaluation off"
        )
    if not c.train.eval_interval and g.changed("eval_prompts"):
        raise ValueError(
            "grpo.eval_prompts sizes each evaluation, and train.eval_interval=0 "
            "turns evaluation off"
        )
    if f.stuck_grace_steps < 2 * f.baseline_steps:
        raise ValueError(
            f"failure.stuck_grace_steps={f.stuck_grace_steps} is below 2 x "
            f"failure.baseline_steps={f.baseline_steps}: `stuck` compares the "
            "first and the last baseline_steps rewards, so it could not fire that "
            "early"
        )
    routing_rules(c)


def routing_rules(c: GRPOConfig) -> None:
    """Rules of `grpo.routing` (`RoutingConfig`): they read the model and the rewards too."""
    rt = c.grpo.routing
    if not rt.enabled:
        keys = rt.changed(*(k for k in type(rt).model_fields if k not in ("enabled", "detector")))
        keys += [f"detector.{k}" for k in rt.detector.changed("name", "params", "threshold")]
        if keys:
            raise ValueError(f"grpo.routing.{keys[0]} is set but grpo.routing.enabled is false")
        return
    if c.model.lora.enabled:
        raise ValueError(
            "grpo.routing.enabled brings its own retain and forget adapters: turn "
            "model.lora.enabled off"
        )
    if rt.retain_r == 0 and rt.forget_r == 0:
        raise ValueError("grpo.routing.retain_r and forget_r are both 0: no adapter to train")
    if rt.mode == "none" and rt.changed("routing_frac"):
        raise ValueError(
            "grpo.routing.routing_frac thins the detector's routed flags, and "
            "grpo.routing.mode=none routes nothing"
        )
    if rt.mode == "none" and rt.changed("label_noise_frac"):
        raise ValueError(
            "grpo.routing.label_noise_frac routes unflagged completions at random, "
            "and grpo.routing.mode=none routes nothing"
        )
    if rt.mode == "none" and rt.changed("retain_advantage"):
        raise ValueError(
            "grpo.routing.retain_advantage picks which unflagged completions "
            "update retain, and grpo.routing.mode=none routes nothing"
        )
    if rt.retain_r == 0 and rt.changed("retain_advantage"):
        raise ValueError(
            "grpo.routing.retain_advantage picks what updates the retain adapter, "
            "and grpo.routing.retain_r=0 has none"
        )
    if (rt.retain_advantage == "penalty") != (rt.retain_penalty is not None):
        raise ValueError(
            "grpo.routing.retain_penalty is the reward a flagged completion loses for retain "
            "under grpo.routing.retain_advantage=penalty: set both or neither"
        )
    if rt.retain_advantage == "penalty" and rt.forget_r == 0:
        raise ValueError(
            "grpo.routing.retain_advantage=penalty trains retain and forget in passes of their "
            "own, and grpo.routing.forget_r=0 has no forget adapter"
        )
    if rt.retain_advantage == "penalty" and rt.ablated_frac > 0:
        raise ValueError(
            "grpo.routing.ablated_frac turns the forget adapter off for whole steps, and "
            "grpo.routing.retain_advantage=penalty gives it a pass of its own every step"
        )
    if rt.retain_advantage in ("renorm", "balanced") and c.grpo.scale_rewards == "batch":
        raise ValueError(
            f"grpo.routing.retain_advantage={rt.retain_advantage} scales within each group "
            "(grpo.scale_rewards group) or not at all (none), not by the batch's std"
        )
    if rt.retain_advantage in ("renorm", "balanced", "penalty") and (
        c.grpo.multi_objective_aggregation == "normalize_then_sum"
    ):
        raise ValueError(
            f"grpo.routing.retain_advantage={rt.retain_advantage} reshapes the total "
            "reward's advantages, and grpo.multi_objective_aggregation=normalize_then_sum "
            "reads each reward"
        )
    if rt.ablated_frac > 0 and rt.forget_r == 0:
        raise ValueError(
            "grpo.routing.ablated_frac trains steps with the forget adapter off, "
            "and grpo.routing.forget_r=0 has none (the step would change nothing)"
        )
    if rt.ablated_frac > 0 and rt.retain_r == 0:
        raise ValueError(
            "grpo.routing.ablated_frac trains steps with the forget adapter off, "
            "and grpo.routing.retain_r=0 leaves nothing to train then"
        )
    if rt.ablated_frac > 0 and c.grpo.num_iterations > 1:
        raise ValueError(
            "grpo.routing.ablated_frac needs grpo.num_iterations=1: the old "
            "log-probs are sampled with both adapters, so an ablated step's first "
            "ratio would measure removing the forget adapter"
        )
    keys = reward_keys(r.name for r in c.reward)
    if rt.hack_reward is not None and rt.hack_reward not in keys:
        raise ValueError(
            f"grpo.routing.hack_reward={rt.hack_reward} names no reward entry (the "
            f"keys: {', '.join(keys)})"
        )
    for key in ("rh_eligible_frac", "eligibility", "gate_flags"):
        if rt.hack_reward is None and rt.changed(key):
            raise ValueError(
                f"grpo.routing.{key} shapes grpo.routing.hack_reward's eligibility, and "
                "grpo.routing.hack_reward is not set"
            )
    if rt.mode == "none" and rt.changed("gate_flags"):
        raise ValueError(
            "grpo.routing.gate_flags limits the routed flags to eligible completions, and "
            "grpo.routing.mode=none routes nothing"
        )
    for scale in rt.eval_forget_scales:
        if not 0 < scale < 1:
            raise ValueError(
                f"grpo.routing.eval_forget_scales: {scale:g} is not in (0, 1) (0 and 1 are "
                "retain_only and both, evaluated anyway)"
            )
    if rt.eval_forget_scales and rt.forget_r == 0:
        raise ValueError(
            "grpo.routing.eval_forget_scales scales the forget adapter, and "
            "grpo.routing.forget_r=0 has none"
        )
    for key in ("eval_prompts", "eval_forget_scales"):
        if not rt.eval_interval and rt.changed(key):
            raise ValueError(
                f"grpo.routing.{key} shapes each routing evaluation, and "
                "grpo.routing.eval_interval=0 turns it off"
            )
