"""Crash recording: a run that fails after its directory opened ends `failed`, never `running`.

`records_failure` decorates each loop's `train(cfg)`; `open_run` registers the run directory it
opens and `finish` unregisters it, so an exception between the two is recorded in that run (status,
one-line evidence, traceback in the log) and reaches the CLI as `RunFailed` (exit 1). Bad input
raised before the directory exists passes unchanged and writes nothing.
"""

from __future__ import annotations

import contextlib
import functools
import traceback
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from smollab.errors import RunFailed
from smollab.rundir.atomic import is_disk_full, one_line
from smollab.rundir.runs import LOG
from smollab.rundir.writer import RunDir

# The runs of the block (`open_run` adds each, `finish` removes it): what a crash is recorded into.
_OPEN_RUNS: ContextVar[list[RunDir] | None] = ContextVar("smollab_open_runs", default=None)


def opened(run: RunDir) -> None:
    """From here on a crash of the decorated loop is recorded into `run`."""
    runs = _OPEN_RUNS.get()
    if runs is not None:
        runs.append(run)


def closed(run: RunDir) -> None:
    """`run` is wrapped up: a later exception is not its failure."""
    runs = _OPEN_RUNS.get()
    if runs is not None and run in runs:
        runs.remove(run)


def records_failure(train: Callable[[Any], dict]) -> Callable[[Any], dict]:
    """Decorates a loop's `train(cfg)`. Once `open_run` has opened the run directory, any exception
    is recorded there (status failed, its one-line evidence in summary.json, the traceback in
    training.log) and raised as RunFailed (the CLI's exit 1); an interrupt the loop has not wrapped
    up itself is recorded as interrupted. Before that (bad input) nothing is written and the
    exception passes unchanged. The step in the evidence is the optimizer steps done when the
    exception left `train`: the loop's `step` variable, or its `ledger`'s or run `state`'s."""

    @functools.wraps(train)
    def recorded(cfg: Any) -> dict:
        with open_runs() as runs:
            try:
                return train(cfg)
            except KeyboardInterrupt as e:
                step = _loop_step(e, train)
                for run in runs:
                    _record(run, "interrupted", "interrupted" + _after(step), step)
                raise
            except Exception as e:
                if not runs:
                    raise
                run = runs[-1]
                evidence = record_failure(run, e, _loop_step(e, train))
                raise RunFailed(evidence, run.path / LOG) from e

    return recorded


@contextlib.contextmanager
def open_runs() -> Iterator[list[RunDir]]:
    """The runs opened inside this block and not yet wrapped up: what a crash is recorded into
    (`records_failure`; a lanes worker holds many at once)."""
    runs: list[RunDir] = []
    token = _OPEN_RUNS.set(runs)
    try:
        yield runs
    finally:
        _OPEN_RUNS.reset(token)


def record_failure(run: RunDir, e: BaseException, step: int | None = None) -> str:
    """`run` ends failed by `e`: its one-line evidence (returned) in summary.json, the traceback
    in training.log; the run is closed and no longer counts as open."""
    evidence = failure_line(e) + _after(step)
    with contextlib.suppress(Exception):  # a full disk may refuse the log too
        trace = "".join(traceback.format_exception(e)).rstrip()
        run.log(f"failed: {evidence}\n{trace}")
    _record(run, "failed", evidence, step)
    closed(run)
    return evidence


def failure_line(e: BaseException) -> str:
    """What failed a run, in one line: `disk full while writing <path>`, or `Type: message`."""
    if is_disk_full(e):
        where = getattr(e, "filename", None)
        return f"disk full while writing {where}" if where else f"disk full ({one_line(e)})"
    return f"{type(e).__name__}: {one_line(e, 500)}"


def _after(step: int | None) -> str:
    return "" if step is None else f" (after {step} steps)"


def _loop_step(e: BaseException, train: Callable) -> int | None:
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is train.__code__:
            here = tb.tb_frame.f_locals
            keeper = here.get("ledger", here.get("state"))
            step = here.get("step", getattr(keeper, "step", None))
            return step if isinstance(step, int) else None
        tb = tb.tb_next
    return None


def _record(run: RunDir, status: str, evidence: str, step: int | None) -> None:
    """Best effort: when the disk is full this may not land, and the raised error still says why."""
    with contextlib.suppress(Exception):
        run.update_summary(
            status=status, evidence=evidence, **({"steps": step} if step is not None else {})
        )
    with contextlib.suppress(Exception):
        run.close()
