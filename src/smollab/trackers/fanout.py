"""The trackers a run names in `run.report_to`, started together and fed as one sink.

Failure policy: a tracker that cannot start fails the run before its first step (a missing
package is refused earlier, when the config is validated: `config.sections.tracker_rules`). A tracker
that fails later, mid-run, is logged once in training.log (and on stderr) with its error, recorded in the
summary's `tracker_errors`, and dropped; training and the other trackers go on. The rows are in
metrics.csv already, so nothing is lost, and hours of training are not thrown away because a
dashboard's upload failed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from smollab.rundir.atomic import one_line
from smollab.rundir.writer import RunDir


class Tracker(Protocol):
    def row(self, row: dict[str, float]) -> None: ...

    def close(self, summary: dict[str, Any]) -> None: ...


def open_trackers(
    run: RunDir, report_to: list[str], config: dict[str, Any], group: str | None
) -> Fanout | None:
    """Start every tracker of `report_to` for `run` (named by its directory, grouped by `group`,
    the resolved `config` as hyperparameters) and attach them to it as its row sink."""
    if not report_to:
        return None
    # A resumed attempt goes on from its newest checkpoint, step_<N>: a new run in W&B and
    # Trackio (which cannot rewind), a purge past N in TensorBoard.
    resume_step = int(run.resume_from.name.split("_")[1]) if run.resume_from else None
    started: list[tuple[str, Tracker]] = []
    for name in report_to:
        try:
            started.append((name, _open(name, run, config, group, resume_step)))
        except Exception:
            for _, t in started:
                t.close({"status": "failed"})
            raise
    run.log(f"trackers: {', '.join(report_to)}")
    fan = Fanout(started, run.log, run.update_summary)
    run.sink = fan
    return fan


def attempt_name(run_name: str, resume_step: int | None) -> str:
    """A tracker run's name: the run directory's, and `-resume<N>` for an attempt that resumed
    from step N (W&B ignores steps at or below a run's last and Trackio appends duplicates, so
    each attempt after a resume is a run of its own, in the same group)."""
    return run_name if resume_step is None else f"{run_name}-resume{resume_step}"


def _open(
    name: str, run: RunDir, config: dict[str, Any], group: str | None, resume_step: int | None
) -> Tracker:
    path = Path(run.path)
    title = attempt_name(path.resolve().name, resume_step)
    if name == "tensorboard":
        from smollab.trackers.tensorboard_sink import TensorBoardTracker

        return TensorBoardTracker(path, config, resume_step)
    if name == "wandb":
        from smollab.trackers.wandb_sink import WandbTracker

        return WandbTracker(path, title, group, config, run.read_summary(), run.update_summary)
    from smollab.trackers.trackio_sink import TrackioTracker

    return TrackioTracker(title, group, config, run.read_summary(), run.update_summary)


class Fanout:
    """Sends each row and the summary to every tracker; a tracker that raises is dropped (see the
    module docstring), its error logged once and kept in the summary."""

    def __init__(
        self,
        trackers: list[tuple[str, Tracker]],
        log: Callable[..., None],
        update_summary: Callable[..., Any],
    ):
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
            self.log(
                f"tracker {name} failed and is dropped (metrics.csv keeps every row): "
                f"{self.errors[name]}",
                echo=True,
            )
            with contextlib.suppress(Exception):  # a closing summary: the log line stands
                self.update_summary(tracker_errors=dict(self.errors))
