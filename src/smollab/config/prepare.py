"""The schema of `smollab data prepare`: the data section alone (corpus, tokenizer, token files
of data.dir), with its rules."""

from __future__ import annotations

from pydantic import Field, model_validator

from smollab.config.sections import DataConfig, Section, data_rules


class DataPrepareConfig(Section):
    data: DataConfig = Field(default_factory=DataConfig)

    @model_validator(mode="after")
    def _rules(self) -> DataPrepareConfig:
        data_rules(self.data)
        return self
