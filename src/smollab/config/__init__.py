"""Configuration: one pydantic schema per command, built from shared sections, each command's
rules across keys beside its schema; loading (defaults < YAML < key=value < Python values); the
keys a command does not read; the lanes' table of what may differ; the shipped recipes by name.

- `sections`  the shared sections (model, data, optim, train, perf, run, reward) and their rules
- `pretrain`, `grpo`, `sft`, `rft`, `prepare`  one command's schema and rules each
- `registry`  `SCHEMAS`: command name -> schema
- `load`      recipes and overrides into a schema; every failure one line naming the key
- `not_read`  the keys a command does not read although another does, with the reason
- `describe`  a schema's keys with type, default and description (`smollab COMMAND --help`)
- `lanes`     what may differ between the lanes of one worker, and what lanes refuse
- `recipes`   the shipped recipes (package data), found by name or by path

The schemas are re-exported here (`from smollab.config import GRPOConfig`); nothing needs
importing for a side effect.
"""

from __future__ import annotations

from smollab.config.grpo import (
    DetectorSpec,
    FailureConfig,
    FinetuneModelConfig,
    GRPOConfig,
    GRPOSection,
    RLOptimConfig,
    RLTrainConfig,
    RoutingConfig,
)
from smollab.config.prepare import DataPrepareConfig
from smollab.config.pretrain import PretrainConfig, PretrainTrainConfig
from smollab.config.registry import SCHEMAS
from smollab.config.rft import KeepConfig, RFTConfig, RFTSection, RFTTrainConfig
from smollab.config.sections import (
    CompiledPerfConfig,
    DataConfig,
    LoraConfig,
    LoraTarget,
    ModelConfig,
    OptimConfig,
    PerfConfig,
    RewardSpec,
    RunConfig,
    Section,
    TrainConfig,
    TrainingConfig,
)
from smollab.config.sft import (
    SFTConfig,
    SFTDataConfig,
    SFTModelConfig,
    SFTOptimConfig,
    SFTSection,
    SFTTrainConfig,
)

__all__ = [
    "SCHEMAS",
    "CompiledPerfConfig",
    "DataConfig",
    "DataPrepareConfig",
    "DetectorSpec",
    "FailureConfig",
    "FinetuneModelConfig",
    "GRPOConfig",
    "GRPOSection",
    "KeepConfig",
    "LoraConfig",
    "LoraTarget",
    "ModelConfig",
    "OptimConfig",
    "PerfConfig",
    "PretrainConfig",
    "PretrainTrainConfig",
    "RFTConfig",
    "RFTSection",
    "RFTTrainConfig",
    "RLOptimConfig",
    "RLTrainConfig",
    "RewardSpec",
    "RoutingConfig",
    "RunConfig",
    "SFTConfig",
    "SFTDataConfig",
    "SFTModelConfig",
    "SFTOptimConfig",
    "SFTSection",
    "SFTTrainConfig",
    "Section",
    "TrainConfig",
    "TrainingConfig",
]
