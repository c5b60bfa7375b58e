"""A sweep's objective: a metrics.csv column, how it is reduced, and the name of the results.csv
column that holds it (`Metric.label`).

The lab's sweep spec holds one, and the report reads it back from sweep.json to find that column:
it is part of what a sweep directory promises its readers, so it lives with the run directory's
contract, below both (report never imports lab).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Metric(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="a metrics.csv column of the command, e.g. val_loss")
    goal: Literal["min", "max"] = Field("min", description="whether lower or higher is better")
    at_step: int | None = Field(
        None, ge=1, description="value at this step instead of the final one"
    )
    reduce: Literal["last", "best"] = Field(
        "last", description="last logged value, or the best one"
    )

    @property
    def label(self) -> str:
        label = self.name if self.reduce == "last" else f"best_{self.name}"
        return f"{label}@{self.at_step}" if self.at_step else label
