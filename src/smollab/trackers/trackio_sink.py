"""Trackio (the tracker TRL recommends): a local SQLite store that `trackio show` serves. It keeps
its own store (TRACKIO_DIR, by default Hugging Face's cache), so one dashboard lists every run; the
project is `smollab` (TRACKIO_PROJECT to change it), each run named after its directory and grouped
by `run.group` (a sweep's study). Trackio has no run summary: the summary's numbers are logged at
the last step as `summary/<key>`.
"""

from __future__ import annotations

import os
from typing import Any


class TrackioTracker:
    def __init__(self, name: str, group: str | None, config: dict[str, Any], resumed: bool):
        import trackio

        self.run = trackio.init(
            project=os.environ.get("TRACKIO_PROJECT") or "smollab", name=name, group=group,
            config=config, resume="allow" if resumed else "never", embed=False,
        )  # fmt: skip
        self.step = 0

    def row(self, row: dict[str, float]) -> None:
        self.step = int(row["step"])
        self.run.log({k: v for k, v in row.items() if k != "step"}, step=self.step)

    def close(self, summary: dict[str, Any]) -> None:
        numbers = {f"summary/{k}": float(v) for k, v in summary.items()
                   if isinstance(v, int | float) and not isinstance(v, bool)}  # fmt: skip
        if numbers:
            self.run.log(numbers, step=self.step)
        self.run.finish()
