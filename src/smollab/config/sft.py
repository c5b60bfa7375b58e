"""The schema of `smollab sft` (supervised fine-tuning) and its rules across keys.

SFT reads a trained model (`model.path`, its tokenizer) and prompt/completion records instead of
a story corpus, so its `model` and `data` sections are its own; `smollab rft` reuses its model,
optim and `sft` sections for each round.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from smollab.config.sections import (
    CompiledPerfConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    Section,
    TrainConfig,
    TrainingConfig,
    compile_rules,
    doc,
    dtype_rules,
    lora_rules,
    shared_rules,
)


class SFTModelConfig(Section):
    """The model of `smollab sft`: a trained model, whose own tokenizer reads the data."""

    path: str | None = Field(
        None, description="run directory, HF model directory or hub id (required)"
    )
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description=doc(ModelConfig, "dtype")
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapters")


class SFTDataConfig(Section):
    """Prompt/completion (or text) records: a local .jsonl file or an HF dataset."""

    train_file: str | None = Field(None, description=".jsonl records (or hf_dataset)")
    eval_file: str | None = Field(None, description="held-out .jsonl (default: eval_fraction)")
    hf_dataset: str | None = Field(None, description="datasets.load_dataset path: hub id or dir")
    hf_name: str | None = Field(None, description="the dataset's configuration name")
    split: str = Field("train", description="hf_dataset: the training split")
    eval_split: str | None = Field(
        None, description="hf_dataset: held-out split (default: eval_fraction carved from split)"
    )
    eval_fraction: float = Field(
        0.05, gt=0, lt=0.5, description="held out of the training records (no eval file/split)"
    )
    prompt_field: str = Field("prompt", description="the field of a record that holds its prompt")
    completion_field: str = Field(
        "completion", description="the field of a record that holds its completion"
    )
    text_field: str = Field("text", description="records without prompt/completion: loss on all")
    seed: int = Field(0, description="which records the eval_fraction carve holds out")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes (0: in-process)")
    pin_memory: bool = Field(False, description="CUDA: the loader pins batches in its own thread")
    prefetch_factor: int | None = Field(
        None, ge=1, description="batches each worker loads ahead (needs num_workers)"
    )


class SFTOptimConfig(OptimConfig):
    """Fine-tuning defaults: a smaller LR and a short warmup."""

    lr: float = Field(3e-4, gt=0, description=doc(OptimConfig, "lr"))
    min_lr: float = Field(3e-5, ge=0, description=doc(OptimConfig, "min_lr"))
    warmup_steps: int = Field(
        10, ge=0, description="steps of linear warmup to lr; below the run's steps; 0: none"
    )


class SFTTrainConfig(TrainConfig):
    """SFT counts optimizer steps or epochs over the examples, in micro-batches of rows."""

    epochs: float | None = Field(
        None, gt=0, description="passes over the data (instead of train.max_steps)"
    )
    seq_len: int = Field(
        128,
        ge=2,
        description="longest row; longer examples are truncated (counted in the log and summary)",
    )
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step")
    diverge_factor: float = Field(
        3.0, gt=1, description="diverged once the loss is above this factor x its start"
    )


class SFTSection(Section):
    packing: bool = Field(
        False,
        description="several examples per row; position ids restart "
        "at each, so attention stays within an example",
    )
    completion_only_loss: bool = Field(
        True, description="prompt tokens carry no loss (false: every token does)"
    )


class SFTConfig(TrainingConfig):
    model: SFTModelConfig = Field(default_factory=SFTModelConfig)  # type: ignore[assignment]
    data: SFTDataConfig = Field(default_factory=SFTDataConfig)  # type: ignore[assignment]
    optim: SFTOptimConfig = Field(default_factory=SFTOptimConfig)
    train: SFTTrainConfig = Field(default_factory=SFTTrainConfig)
    perf: CompiledPerfConfig = Field(default_factory=CompiledPerfConfig)
    sft: SFTSection = Field(default_factory=SFTSection)

    @model_validator(mode="after")
    def _rules(self) -> SFTConfig:
        sft_rules(self)
        return self


def sft_rules(c: SFTConfig) -> None:
    """The shared rules (no story corpus), then SFT's own. A missing model.path or data source is
    refused when the run starts (the schema's defaults must construct)."""
    lora_rules(c.model.lora)
    dtype_rules(c.model.dtype, c.model.lora)
    shared_rules(c.optim, c.train, c.run)
    d, t, p = c.data, c.train, c.perf
    if d.train_file and d.hf_dataset:
        raise ValueError(
            f"data.train_file={d.train_file} and data.hf_dataset={d.hf_dataset} are "
            "both set: give one source of records"
        )
    if d.eval_file and not d.train_file:
        raise ValueError(
            "data.eval_file is the held-out file of data.train_file, which is not "
            "set (an HF dataset holds out data.eval_split)"
        )
    if not d.hf_dataset and (keys := d.changed("hf_name", "split", "eval_split")):
        raise ValueError(f"data.{keys[0]} is read with data.hf_dataset, which is not set")
    if (d.eval_file or d.eval_split) and (keys := d.changed("eval_fraction", "seed")):
        held = "data.eval_file" if d.eval_file else "data.eval_split"
        raise ValueError(
            f"data.{keys[0]} carves a held-out part of the training records, "
            f"and {held} is the held-out set"
        )
    if d.prefetch_factor is not None and d.num_workers == 0:
        raise ValueError(
            "data.prefetch_factor counts batches each worker loads ahead, and "
            "data.num_workers=0 loads in the training process"
        )
    if t.epochs is not None and t.changed("max_steps"):
        raise ValueError(
            f"train.epochs={t.epochs:g} and train.max_steps={t.max_steps} are both "
            "set: the run's length is one or the other"
        )
    compile_rules(p)
