"""The inbox of a lanes worker: how a sweep hands trials to one process that trains them as lanes.

A lanes worker (`smollab lanes grpo --inbox DIR`) trains many compatible trials as lanes of one
batched model (`train.grpo.lanes`). The sweep's `executor: lanes` (lab/sweep/lanes_executor.py)
talks to it through files in DIR only, so either side can die without leaving the other waiting
on a pipe, and a reader of DIR sees what happened:

  <name>.trial.json  executor -> worker: {"argv": ["grpo", BASE?, key=value, ...], "run_dir": ...}
                     the trial, as the argv of the child a process sweep would start
  <name>.stop        executor -> worker: end this lane at its next step boundary as a SIGINT
                     would end a child (status interrupted); the text is the reason
  <name>.exit        worker -> executor: the lane's exit code (0 ended, 1 failed, 130 interrupted)
  close              executor -> worker: no more trials; exit once every lane has ended
  worker.log         the worker's own output

Every file is written atomically (written whole, then renamed), so a reader never sees half of it.
The protocol lives with the run directory's contract, beneath both sides: the lab never imports
a loop. What lanes may differ in and refuse is configuration (`smollab.config.lanes`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from smollab.rundir.atomic import atomic_write_text

TRIAL, STOP, EXIT, CLOSE, WORKER_LOG = ".trial.json", ".stop", ".exit", "close", "worker.log"
EXIT_ENDED, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


@dataclass(frozen=True)
class LaneTrial:
    name: str
    argv: list[str]  # ["grpo", BASE?, key=value, ...]: what `smollab` would be run with
    run_dir: str


class Inbox:
    """One lanes worker's inbox directory, with the calls each side makes."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    # ---- executor side
    def post(self, trial: LaneTrial) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        body = {"argv": list(trial.argv), "run_dir": str(trial.run_dir)}
        atomic_write_text(self.path / f"{trial.name}{TRIAL}", json.dumps(body))

    def stop(self, name: str, reason: str = "") -> None:
        atomic_write_text(self.path / f"{name}{STOP}", reason)

    def exit_code(self, name: str) -> int | None:
        """The lane's exit code once the worker has ended it, else None."""
        p = self.path / f"{name}{EXIT}"
        return int(p.read_text().strip()) if p.exists() else None

    def close(self) -> None:
        atomic_write_text(self.path / CLOSE, "")

    # ---- worker side
    def new_trials(self, seen: set[str]) -> list[LaneTrial]:
        """Trials posted and not in `seen` (their names), oldest first."""
        out = []
        paths = sorted(self.path.glob(f"*{TRIAL}"), key=lambda p: (p.stat().st_mtime_ns, p.name))
        for p in paths:
            name = p.name[: -len(TRIAL)]
            if name not in seen:
                body = json.loads(p.read_text())
                out.append(LaneTrial(name, list(body["argv"]), str(body["run_dir"])))
        return out

    def stop_reason(self, name: str) -> str | None:
        """The reason the executor asked this lane to stop, or None while it has not."""
        p = self.path / f"{name}{STOP}"
        return p.read_text() if p.exists() else None

    def ended(self, name: str, code: int) -> None:
        atomic_write_text(self.path / f"{name}{EXIT}", str(code))

    def closed(self) -> bool:
        return (self.path / CLOSE).exists()
