"""TensorBoard: event files in `<run dir>/tb/`, one scalar per metrics column, tagged by its name.

The resolved config goes in as text and, at the end, as HParams with the summary's numbers as
their metrics, so TensorBoard's HParams tab compares the runs of a sweep
(`tensorboard --logdir <sweep dir>/trials`: each trial is its directory).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smollab.config.load import flatten
from smollab.rundir.runs import TENSORBOARD


class TensorBoardTracker:
    """`resume_step`: the checkpoint step a resumed attempt goes on from (None: a fresh start)."""

    def __init__(self, run_dir: Path, config: dict[str, Any], resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self._make = SummaryWriter
        self.dir = run_dir / TENSORBOARD
        self.config = config
        self.writer = None
        self.resume_step = resume_step
        self.step = resume_step or 0

    def _open(self, purge_step: int | None):
        # purge_step: a resumed run drops the events an interrupted process logged past its
        # checkpoint, as metrics.csv does, so each step appears once. Only a writer that logs a
        # row purges: an attempt that ends before its first row (a failed or interrupted resume)
        # must not hide the earlier events (purge_step 0 would hide them all).
        self.writer = self._make(log_dir=str(self.dir), purge_step=purge_step)
        self.writer.add_text("config", _code(self.config), self.step)

    def row(self, row: dict[str, float]) -> None:
        self.step = int(row["step"])
        if self.writer is None:
            self._open(0 if self.resume_step is None else self.resume_step + 1)
        for key, value in row.items():
            if key != "step":
                self.writer.add_scalar(key, value, self.step)
        self.writer.flush()

    def close(self, summary: dict[str, Any]) -> None:
        if self.writer is None:
            self._open(None)
        from torch.utils.tensorboard.summary import hparams

        numbers = {
            f"summary/{k}": float(v)
            for k, v in summary.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        params = {
            k: v if isinstance(v, int | float | str | bool) else json.dumps(v)
            for k, v in flatten(self.config).items()
        }
        for part in hparams(params, numbers):
            self.writer.file_writer.add_summary(part)
        for key, value in numbers.items():
            self.writer.add_scalar(key, value, self.step)
        self.writer.add_text("summary", _code(summary), self.step)
        self.writer.close()


def _code(tree: dict[str, Any]) -> str:
    """A dict as a JSON block in TensorBoard's markdown text view."""
    body = json.dumps(tree, indent=2, default=str)
    return "\n".join("    " + line for line in body.splitlines())
