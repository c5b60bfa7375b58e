"""The sections every command's schema is built from (model, data, optim, train, perf, run, the
reward spec), each with the rules across its own keys beside it.

A command's schema (`pretrain`, `grpo`, `sft`, `rft`, `prepare`) assembles these sections, adds
its own, and runs the rules in its validator after every section has validated, so a refusal is
one line naming every key involved. "Set" means set in YAML or on the command line to a value
other than the default (`Section.changed`): a default changes nothing, and `smollab config show`
prints every key, so its output must load again.

Imports nothing of smollab and no torch: the bench parent reads the schemas.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Section(BaseModel):
    """Base of every section: unknown keys are errors, assignments are validated, and no float key
    takes NaN or infinity (`allow_inf_nan`, once here for every section): no key of any schema
    means anything by them, and a key that can be off says so with 0 or null."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

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


def doc(section: type[Section], key: str) -> str:
    """The description of `section`'s `key`, for a command's section that changes only its
    default (`lr: float = Field(1e-5, gt=0, description=doc(OptimConfig, "lr"))`): one text per
    key, wherever its default differs."""
    return section.model_fields[key].description or ""


# ---- model ------------------------------------------------------------------------------------

LoraTarget = Literal["q", "k", "v", "o", "gate", "up", "down"]


class LoraConfig(Section):
    enabled: bool = Field(
        False, description="train LoRA adapters on a frozen base, not every weight"
    )
    r: int = Field(8, ge=1, description="LoRA rank: the inner size of each adapter")
    alpha: float = Field(16.0, gt=0, description="LoRA scale: an adapter's update counts alpha / r")
    dropout: float = Field(
        0.0, ge=0, lt=1, description="dropout on each adapter's input in training"
    )
    targets: list[LoraTarget] = Field(
        default_factory=lambda: ["q", "k", "v", "o", "gate", "up", "down"],
        description="projections that get an adapter: attention q, k, v, o; MLP gate, up, down",
    )


def lora_rules(lora: LoraConfig) -> None:
    """LoRA's sub-keys are read only with LoRA on."""
    keys = lora.changed("r", "alpha", "dropout", "targets")
    if keys and not lora.enabled:
        raise ValueError(f"model.lora.{keys[0]} is set but model.lora.enabled is false")


class ModelConfig(Section):
    """The model of pretraining, which trains every weight: a preset or a model to continue."""

    preset: str | None = Field(
        "simplestories-1.25m",
        description="a built-in model shape, freshly initialized (`smollab models` lists them)",
    )
    path: str | None = Field(
        None,
        description="trained weights to load: an HF model directory, a run directory (its final "
        "checkpoint) or a hub id; wins over preset",
    )
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto",
        description="the dtype the weights are held and trained in. auto: fp32 whatever the "
        "checkpoint stores (a bf16 or fp16 checkpoint, as Hub models are published, is upcast "
        "as it loads: the fp32 master weights training wants; perf.precision sets the compute "
        "dtype); bf16, fp16: the weights held in that dtype, for memory (LoRA adapters stay "
        "fp32; bf16 full fine-tuning trains bf16 weights with no fp32 copy; fp16 only as a "
        "LoRA base)",
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if self.preset is None and self.path is None:
            raise ValueError("set model.preset or model.path")
        return self


def dtype_rules(dtype: str, lora: LoraConfig | None = None) -> None:
    """fp16 weights cannot take optimizer steps: there is no fp32 copy for the update to land in
    (a GradScaler refuses to unscale fp16 gradients), so fp16 holds only a frozen LoRA base."""
    if dtype == "fp16" and not (lora and lora.enabled):
        raise ValueError(
            "model.dtype=fp16: fp16 weights cannot be trained (no fp32 master copy); use bf16, "
            "or LoRA (model.lora.enabled=true) on an fp16 base"
        )


def model_rules(m: ModelConfig) -> None:
    """A preset beside a path would be ignored (the path wins)."""
    if m.path and m.preset is not None and m.changed("preset"):
        raise ValueError(
            f"model.preset={m.preset} and model.path={m.path} are both set; the "
            "path wins, so drop model.preset (or set it to null)"
        )


# ---- data -------------------------------------------------------------------------------------


class DataConfig(Section):
    dir: str = Field(
        "data/stories", description="where the corpus, tokenizer and token files are written"
    )
    source: Literal["offline", "simplestories", "tinystories", "files"] = Field(
        "offline",
        description="where the stories come from: generated offline, a hub dataset "
        "(SimpleStories, TinyStories), or data.files",
    )
    files: list[str] = Field(
        default_factory=list, description=".txt or .jsonl files to read (source=files)"
    )
    text_key: str = Field("story", description="field of each .jsonl record that holds the text")
    num_stories: int = Field(
        50_000, ge=10, description="stories the offline generator writes (source=offline)"
    )
    max_stories: int | None = Field(
        None, ge=10, description="cap on stories taken from a hub dataset (null: all)"
    )
    test_fraction: float = Field(
        0.05,
        gt=0,
        lt=0.5,
        description="fraction of the stories held out for validation (a hub dataset: only "
        "with max_stories; otherwise its own test split)",
    )
    tokenizer: Literal["wordpiece", "bpe"] = Field(
        "wordpiece",
        description="tokenizer trained on the corpus: wordpiece (as SimpleStories) or bpe "
        "(as CS336)",
    )
    vocab_size: int | None = Field(
        None,
        ge=64,
        le=65535,
        description="tokenizer vocabulary size (null: 4096 for wordpiece, 10000 for bpe)",
    )
    seed: int = Field(
        0, description="seed of the offline stories and of the shuffle before the held-out split"
    )


def data_rules(d: DataConfig) -> None:
    """Rules of the story-corpus data section, in every command that reads one."""
    hub = d.source in ("simplestories", "tinystories")
    if d.source == "files" and not d.files:
        raise ValueError("data.source=files needs data.files (a list of .txt or .jsonl paths)")
    if d.files and d.source != "files":
        raise ValueError(
            f"data.files is set but data.source={d.source} (files are read only "
            "with data.source=files)"
        )
    if d.changed("max_stories") and not hub:
        raise ValueError(
            f"data.max_stories caps a hub dataset; data.source={d.source} does not "
            "read it (the offline corpus has data.num_stories)"
        )
    if d.changed("num_stories") and d.source != "offline":
        raise ValueError(
            f"data.num_stories sizes the offline corpus; data.source={d.source} does not read it"
        )
    if d.changed("text_key") and not any(f.lower().endswith(".jsonl") for f in d.files):
        raise ValueError(
            "data.text_key names the text field of .jsonl records, and data.files "
            "holds no .jsonl file"
        )
    if hub and d.changed("seed"):
        raise ValueError(
            f"data.seed: data.source={d.source} keeps the dataset's own splits and "
            "order, so nothing is drawn at random"
        )
    if hub and d.changed("test_fraction") and d.max_stories is None:
        raise ValueError(
            f"data.test_fraction: data.source={d.source} uses the dataset's own test "
            "split (the fraction applies only with data.max_stories)"
        )


class PromptSource(Section):
    """Prompts from data (GRPO, RFT), in SFT's words: a dataset's split, the held-out split or a
    carved fraction, the prompt column. A file of prompts is the command's own key
    (`grpo.prompts_file`, `rft.prompts_file`)."""

    hf_dataset: str | None = Field(
        None,
        description="prompts from datasets: a hub id, a local data directory or a "
        "save_to_disk directory (instead of a prompts file)",
    )
    hf_name: str | None = Field(None, description="hf_dataset: its configuration name")
    split: str = Field("train", description="hf_dataset: the split of training prompts")
    eval_split: str | None = Field(None, description="hf_dataset: the split of held-out prompts")
    eval_fraction: float | None = Field(
        None,
        gt=0,
        lt=0.5,
        description="held-out prompts carved out of the training ones by data.seed (no "
        "held-out file or split)",
    )
    prompt_field: str = Field(
        "prompt",
        description="the column of the prompt (text, or a list of chat messages); every other "
        "column reaches every reward as a keyword argument, as in TRL",
    )


def prompt_source_rules(
    d: PromptSource, file_key: str, file: str | None, eval_key: str, eval_file: str | None
) -> None:
    """One source of training prompts, one of held-out prompts; the dataset keys only with a
    dataset, the prompt column only with a table."""
    if file and d.hf_dataset:
        raise ValueError(
            f"{file_key}={file} and data.hf_dataset={d.hf_dataset} are both set: give one "
            "source of prompts"
        )
    if not d.hf_dataset and (keys := d.changed("hf_name", "split", "eval_split")):
        raise ValueError(f"data.{keys[0]} is read with data.hf_dataset, which is not set")
    if eval_file and d.eval_split:
        raise ValueError(
            f"{eval_key}={eval_file} and data.eval_split={d.eval_split} are both set: give one "
            "held-out set"
        )
    if d.eval_fraction is not None and (eval_file or d.eval_split):
        held = eval_key if eval_file else "data.eval_split"
        raise ValueError(
            f"data.eval_fraction carves held-out prompts out of the training ones, and {held} is "
            "the held-out set"
        )
    if d.eval_fraction is not None and not (file or d.hf_dataset):
        raise ValueError(
            f"data.eval_fraction carves held-out prompts out of {file_key} or data.hf_dataset, "
            "and neither is set"
        )
    tables = [f for f in (file, eval_file) if f and not f.lower().endswith(".txt")]
    if d.changed("prompt_field") and not (tables or d.hf_dataset):
        raise ValueError(
            "data.prompt_field names the prompt column of a table, and no prompts table is "
            "given (a .txt file holds one prompt a line)"
        )


# ---- optim ------------------------------------------------------------------------------------


class OptimConfig(Section):
    lr: float = Field(1e-3, gt=0, description="peak learning rate, reached after the warmup")
    min_lr: float = Field(
        1e-4, ge=0, description="learning rate the cosine and wsd schedules end at"
    )
    min_lr_ratio: float | None = Field(
        None,
        ge=0,
        le=1,
        description="the end of the cosine and wsd schedules as a fraction of lr, instead of "
        "min_lr (nanoGPT's lr/10 is 0.1, HF's min_lr_rate): the schedule keeps its shape "
        "whatever lr a sweep tries",
    )
    weight_decay: float = Field(
        0.1, ge=0, description="AdamW's decoupled weight decay (pretrain, sft: matrices only)"
    )
    beta1: float = Field(0.9, ge=0, lt=1, description="AdamW's first-moment decay")
    beta2: float = Field(0.95, ge=0, lt=1, description="AdamW's second-moment decay")
    eps: float = Field(1e-8, gt=0, description="AdamW's denominator epsilon")
    grad_clip: float = Field(
        1.0, ge=0, description="clip the gradients' global L2 norm to this; 0 disables"
    )
    schedule: Literal["cosine", "constant", "wsd"] = Field(
        "cosine",
        description="learning rate after the warmup: cosine decay to min_lr, constant, or "
        "warmup-stable-decay (linear to min_lr over the last decay_fraction)",
    )
    warmup_steps: int = Field(
        100, ge=0, description="steps of linear warmup to lr; below train.max_steps; 0: none"
    )
    decay_fraction: float = Field(0.2, gt=0, le=1, description="wsd: final fraction spent decaying")

    @property
    def final_lr(self) -> float:
        """Where the cosine and wsd schedules end: lr x min_lr_ratio when set, else min_lr."""
        if self.min_lr_ratio is not None:
            return self.lr * self.min_lr_ratio
        return self.min_lr


def optim_rules(o: OptimConfig) -> None:
    """The schedule's keys: one of min_lr and min_lr_ratio, and only where the schedule decays;
    decay_fraction only for wsd."""
    if o.min_lr_ratio is not None and o.changed("min_lr"):
        raise ValueError(
            f"optim.min_lr={o.min_lr:g} and optim.min_lr_ratio={o.min_lr_ratio:g} are both "
            "set; keep one (min_lr_ratio ends the schedule at that fraction of optim.lr)"
        )
    if o.schedule == "constant" and (keys := o.changed("min_lr", "min_lr_ratio")):
        raise ValueError(
            f"optim.{keys[0]}={getattr(o, keys[0]):g} is set but optim.schedule=constant "
            "never decays"
        )
    if o.schedule != "constant" and o.min_lr > o.lr and o.min_lr_ratio is None:
        raise ValueError(
            f"optim.min_lr={o.min_lr:g} is above optim.lr={o.lr:g}: the "
            f"{o.schedule} schedule would rise to it (optim.min_lr_ratio ends it at a "
            "fraction of optim.lr instead)"
        )
    if o.schedule != "wsd" and o.changed("decay_fraction"):
        raise ValueError(
            f"optim.decay_fraction is the wsd schedule's; optim.schedule="
            f"{o.schedule} does not read it"
        )


# ---- train ------------------------------------------------------------------------------------


class TrainConfig(Section):
    """What every training loop reads: the budget, the batch and the intervals."""

    max_steps: int = Field(1000, ge=1, description="optimizer steps to train")
    max_time: float | None = Field(
        None, gt=0, description="stop after this many seconds of training (null: no limit)"
    )
    batch_size: int = Field(32, ge=1, description="sequences per micro-batch")
    log_interval: int = Field(10, ge=1, description="steps between metrics.csv rows")
    eval_interval: int = Field(100, ge=0, description="steps between evaluations; 0: none")
    save_interval: int = Field(
        500, ge=0, description="steps between periodic checkpoints; 0: none (final/ still)"
    )
    keep_last: int = Field(2, ge=1, description="periodic checkpoints kept (the oldest go)")


class Checkpointing(Protocol):
    """A train section that writes periodic checkpoints (`TrainConfig`, RFT's per-round one)."""

    save_interval: int

    def changed(self, *names: str) -> list[str]: ...


def checkpoint_rules(t: Checkpointing) -> None:
    """keep_last counts periodic checkpoints, so it needs some."""
    if not t.save_interval and t.changed("keep_last"):
        raise ValueError(
            "train.keep_last counts periodic checkpoints, and train.save_interval=0 writes none"
        )


# ---- perf -------------------------------------------------------------------------------------


class PerfConfig(Section):
    device: Literal["auto", "cpu", "cuda", "mps"] = Field(
        "auto", description="where to train; auto: CUDA, else MPS, else the CPU"
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32",
        description="matmul precision: fp32, bf16 autocast, or fp16 autocast with a loss "
        "scaler; fp32 where the device has no native kernel (the run log says why)",
    )
    tf32: bool = Field(True, description="CUDA: fp32 matmuls may run on TF32 tensor cores")
    threads: int | None = Field(
        None, ge=1, description="CPU threads torch uses (null: torch's default)"
    )
    optimizer_impl: Literal["auto", "fused", "foreach", "plain"] = Field(
        "auto",
        description="AdamW kernel: fused, foreach (multi-tensor) or plain (per parameter); "
        "auto: fused (CUDA, CPU and MPS have fused kernels)",
    )
    grad_checkpointing: bool = Field(
        False, description="recompute activations in the backward: less memory, more time"
    )
    attn_implementation: Literal["sdpa", "eager"] = Field(
        "sdpa",
        description="HF attention: sdpa (PyTorch's scaled_dot_product_attention) or eager",
    )
    retain_freed_memory: bool = Field(
        True, description="CPU on Linux: glibc malloc keeps freed memory (no page faults per step)"
    )


class CompiledPerfConfig(PerfConfig):
    """The perf section of a loop that can torch.compile its model (pretrain, sft, rft)."""

    compile: bool = Field(
        False, description="torch.compile the model (MPS: with the aot_eager backend)"
    )
    compile_mode: Literal["default", "reduce-overhead", "max-autotune"] = Field(
        "default", description="torch.compile's mode (inductor; needs perf.compile)"
    )


def compile_rules(p: CompiledPerfConfig) -> None:
    """compile_mode is read only when compiling."""
    if p.changed("compile_mode") and not p.compile:
        raise ValueError(f"perf.compile_mode={p.compile_mode} is set but perf.compile is false")


# ---- run --------------------------------------------------------------------------------------


class RunConfig(Section):
    dir: str | None = Field(None, description="exact run directory; default runs/<name>")
    name: str | None = Field(None, description="names the default run directory (no run.dir)")
    resume: Literal["auto", "never"] = Field(
        "auto", description="auto: continue or reuse the run in run.dir; never: start it over"
    )
    seed: int = Field(
        0, description="seed of the model's initialization, the data order and the sampling"
    )
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


# run.report_to name -> (the package it imports, the pyproject extra that installs it)
TRACKER_PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "trackio": ("trackio", "trackio"),
}


def tracker_rules(r: RunConfig) -> None:
    """A tracker of `run.report_to` whose package is missing is refused with the extra to install,
    when the config is read: before data, model or run directory, and once in a sweep's parent
    (which validates every trial's config). Only looked up (find_spec), never imported here."""
    for name in r.report_to:
        package, extra = TRACKER_PACKAGES[name]
        if importlib.util.find_spec(package) is None:
            raise ValueError(
                f"run.report_to {name}: the {package} package is not installed; "
                f"pip install 'smollab[{extra}]'"
            )


def run_rules(r: RunConfig) -> None:
    """run.name names the default directory, so not beside run.dir; trackers are installed."""
    if r.dir and r.changed("name"):
        raise ValueError(
            f"run.name={r.name} names the default run directory, and run.dir={r.dir} is set"
        )
    tracker_rules(r)


def shared_rules(o: OptimConfig, t: Checkpointing, r: RunConfig) -> None:
    """The rules every training command runs after its model and data rules."""
    optim_rules(o)
    checkpoint_rules(t)
    run_rules(r)


# ---- reward -----------------------------------------------------------------------------------


class RewardSpec(Section):
    """One term of the reward: `weight * name(completions, **params)`."""

    name: str = Field(description="built-in reward name, or module:function for your own")
    weight: float = Field(1.0, description="multiplies this function's values in the total")
    params: dict[str, Any] = Field(
        default_factory=dict, description="keyword arguments of the reward function"
    )


def reward_keys(names: Iterable[str]) -> list[str]:
    """The key of each reward entry, from its function name: the name, `name#2`, `name#3` when
    a name repeats. One rule for the registry (`ResolvedReward.key`, the metric columns), the
    routing rules (`grpo.routing.hack_reward`) and the routing report (task weights)."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


# ---- the sections a story-corpus training command shares -----------------------------------


class TrainingConfig(Section):
    """The sections every training command shares (model, data, optim, train, perf, run)."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    perf: PerfConfig = Field(default_factory=PerfConfig)
    run: RunConfig = Field(default_factory=RunConfig)
