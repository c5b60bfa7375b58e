"""Weights & Biases: `wandb.init(dir=<run dir>)`, so its files go in `<run dir>/wandb/`, never the
user's working directory. W&B reads its own settings from the environment: WANDB_MODE=offline
keeps everything on disk (`wandb sync <run dir>/wandb/offline-run-*` uploads it later),
WANDB_PROJECT names the project (default `smollab`). The run is named after its directory and
grouped by `run.group` (a sweep's study). Each attempt is a W&B run of its own: one that resumed
from checkpoint step N is `<run name>-resumeN` (same group) and logs steps N+1 on, since W&B keeps
a run's steps increasing and ignores a row at or below its last (the dead process's rows past the
checkpoint would win over the new ones). `resume_from` (rewind) would keep one run, but it needs
the W&B server (a beta feature that offline mode only records). summary.json keeps the newest
attempt's id as `wandb_run_id` and every attempt's in `wandb_run_ids`.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

FINISHED_OK = ("completed", "diverged", "degenerate", "stuck", "pruned")


class WandbTracker:
    def __init__(
        self,
        run_dir: Path,
        name: str,
        group: str | None,
        config: dict[str, Any],
        summary: dict[str, Any],
        update_summary: Callable[..., Any],
    ):
        import wandb

        run_id = secrets.token_hex(4)
        self.run = wandb.init(
            dir=str(run_dir),
            project=os.environ.get("WANDB_PROJECT") or "smollab",
            name=name,
            group=group,
            config=config,
            id=run_id,
            resume="never",
            reinit="create_new",
        )
        earlier = summary.get("wandb_run_ids") or []
        update_summary(wandb_run_id=run_id, wandb_run_ids=[*earlier, run_id])

    def row(self, row: dict[str, float]) -> None:
        step = int(row["step"])
        self.run.log({k: v for k, v in row.items() if k != "step"}, step=step)

    def close(self, summary: dict[str, Any]) -> None:
        self.run.summary.update({k: v for k, v in summary.items() if v is not None})
        self.run.finish(exit_code=0 if summary.get("status") in FINISHED_OK else 1)
