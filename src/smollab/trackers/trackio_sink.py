"""Trackio (the tracker TRL recommends): a local SQLite store that `trackio show` serves. It keeps
its own store (TRACKIO_DIR, by default Hugging Face's cache), so one dashboard lists every run; the
project is `smollab` (TRACKIO_PROJECT to change it), each run named after its directory and grouped
by `run.group` (a sweep's study). As in W&B (see wandb_sink), an attempt that resumed from
checkpoint step N is a Trackio run of its own, `<run name>-resumeN`: resuming the same run would
append the steps after N a second time. summary.json keeps the newest attempt's Trackio run id as
`trackio_run_id` and every attempt's in `trackio_run_ids`. Trackio has no run summary: the
summary's numbers are logged at the last step as `summary/<key>`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


class TrackioTracker:
    def __init__(
        self,
        name: str,
        group: str | None,
        config: dict[str, Any],
        summary: dict[str, Any],
        update_summary: Callable[..., Any],
    ):
        import trackio

        self.run = trackio.init(
            project=os.environ.get("TRACKIO_PROJECT") or "smollab",
            name=name,
            group=group,
            config=config,
            resume="never",
            embed=False,
        )
        earlier = summary.get("trackio_run_ids") or []
        update_summary(trackio_run_id=self.run.id, trackio_run_ids=[*earlier, self.run.id])
        self.step = 0

    def row(self, row: dict[str, float]) -> None:
        self.step = int(row["step"])
        self.run.log({k: v for k, v in row.items() if k != "step"}, step=self.step)

    def close(self, summary: dict[str, Any]) -> None:
        numbers = {
            f"summary/{k}": float(v)
            for k, v in summary.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if numbers:
            self.run.log(numbers, step=self.step)
        self.run.finish()
