"""The trackers a run names in `run.report_to`, started together and fed as one sink.

Failure policy: a tracker that cannot start fails the run before its first step (a missing package
is refused before the run directory is written, naming the extra to install). A tracker that fails
later, mid-run, is logged once in training.log (and on stderr) with its error, recorded in the
summary's `tracker_errors`, and dropped; training and the other trackers go on. The rows are in
metrics.csv already, so nothing is lost, and hours of training are not thrown away because a
dashboard's upload failed.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from smollab.atomic_files import one_line
from smollab.errors import UserError
from smollab.runs import RunDir

# name in run.report_to -> (package it imports, pyproject extra that installs it)
PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"),
            "trackio": ("trackio", "trackio")}  # fmt: skip


class Tracker(Protocol):
    def row(self, row: dict[str, float]) -> None: ...

    def close(self, summary: dict[str, Any]) -> None: ...


def check_installed(report_to: list[str]) -> None:
    """One line naming the extra to install for the first tracker whose package is missing."""
    for name in report_to:
        package, extra = PACKAGES[name]
        if importlib.util.find_spec(package) is None:
            raise UserError(f"run.report_to {name}: the {package} package is not installed; "
                            f"pip install 'smollab[{extra}]'")  # fmt: skip


def open_trackers(run: RunDir, report_to: list[str], config: dict[str, Any],
                  group: str | None) -> Fanout | None:  # fmt: skip
    """Start every tracker of `report_to` for `run` (named by its directory, grouped by `group`,
    the resolved `config` as hyperparameters) and attach them to it as its row sink."""
    if not report_to:
        return None
    resumed = run.resume_from is not None
    started: list[tuple[str, Tracker]] = []
    for name in report_to:
        try:
            started.append((name, _open(name, run, config, group, resumed)))
        except Exception:
            for _, t in started:
                t.close({"status": "failed"})
            raise
    run.log(f"trackers: {', '.join(report_to)}")
    fan = Fanout(started, run.log, run.update_summary)
    run.sink = fan
    return fan


def _open(name: str, run: RunDir, config: dict[str, Any], group: str | None,
          resumed: bool) -> Tracker:  # fmt: skip
    path, title = Path(run.path), Path(run.path).resolve().name
    if name == "tensorboard":
        from smollab.trackers.tensorboard_sink import TensorBoardTracker

        return TensorBoardTracker(path, config)
    if name == "wandb":
        from smollab.trackers.wandb_sink import WandbTracker

        return WandbTracker(path, title, group, config, run.read_summary(), run.update_summary)
    from smollab.trackers.trackio_sink import TrackioTracker

    return TrackioTracker(title, group, config, resumed)


class Fanout:
    """Sends each row and the summary to every tracker; a tracker that raises is dropped (see the
    module docstring), its error logged once and kept in the summary."""

    def __init__(self, trackers: list[tuple[str, Tracker]], log: Callable[..., None],
                 update_summary: Callable[..., Any]):  # fmt: skip
        self.trackers = trackers
        self.log = log
        self.update_summary = update_summary
        self.errors: dict[str, str] = {}

    def row(self, row: dict[str, float]) -> None:
        for name, t in list(self.trackers):
            self._call(name, t, lambda t=t: t.row(row))

    def close(self, summary: dict[str, Any]) -> None:
        for name, t in list(self.trackers):
            self._call(name, t, lambda t=t: t.close(summary))
        self.trackers = []

    def _call(self, name: str, tracker: Tracker, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception as e:
            self.trackers = [(n, t) for n, t in self.trackers if t is not tracker]
            self.errors[name] = f"{type(e).__name__}: {one_line(e, 300)}"
            self.log(f"tracker {name} failed and is dropped (metrics.csv keeps every row): "
                     f"{self.errors[name]}", echo=True)  # fmt: skip
            with contextlib.suppress(Exception):  # a closing summary: the log line stands
                self.update_summary(tracker_errors=dict(self.errors))
