"""Every command's schema, by the command's name: the one table the loader, `config show`, the
run directory's change check, the sweep and `--help` look a command up in. Adding a command's
schema is one line here."""

from __future__ import annotations

from smollab.config.grpo import GRPOConfig
from smollab.config.prepare import DataPrepareConfig
from smollab.config.pretrain import PretrainConfig
from smollab.config.rft import RFTConfig
from smollab.config.sections import Section
from smollab.config.sft import SFTConfig

SCHEMAS: dict[str, type[Section]] = {
    "pretrain": PretrainConfig,
    "data": DataPrepareConfig,
    "grpo": GRPOConfig,
    "sft": SFTConfig,
    "rft": RFTConfig,
}
