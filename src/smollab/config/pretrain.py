"""The schema of `smollab pretrain`: the shared sections, a train section that also counts tokens
and cuts token windows, a perf section that can compile, and pretraining's rules across keys."""

from __future__ import annotations

from pydantic import Field, model_validator

from smollab.config.sections import (
    CompiledPerfConfig,
    TrainConfig,
    TrainingConfig,
    compile_rules,
    data_rules,
    dtype_rules,
    model_rules,
    shared_rules,
)


class PretrainTrainConfig(TrainConfig):
    """Pretraining also counts tokens, cuts token windows and accumulates micro-batches."""

    max_tokens: int | None = Field(
        None, ge=1, description="stop after this many training tokens (null: no limit)"
    )
    seq_len: int = Field(128, ge=2, description="tokens per training window (the context)")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step")
    eval_tokens: int = Field(
        65_536, ge=1, description="validation tokens per evaluation (a fixed budget)"
    )
    diverge_factor: float = Field(
        3.0, gt=1, description="diverged once the loss is above this factor x its start"
    )


class PretrainConfig(TrainingConfig):
    train: PretrainTrainConfig = Field(default_factory=PretrainTrainConfig)
    perf: CompiledPerfConfig = Field(default_factory=CompiledPerfConfig)

    @model_validator(mode="after")
    def _rules(self) -> PretrainConfig:
        pretrain_rules(self)
        return self


def pretrain_rules(c: PretrainConfig) -> None:
    """The shared rules, then pretraining's own."""
    model_rules(c.model)
    dtype_rules(c.model.dtype)
    data_rules(c.data)
    shared_rules(c.optim, c.train, c.run)
    t = c.train
    if not t.eval_interval and t.changed("eval_tokens"):
        raise ValueError(
            "train.eval_tokens sizes each evaluation, and train.eval_interval=0 "
            "turns evaluation off"
        )
    compile_rules(c.perf)
