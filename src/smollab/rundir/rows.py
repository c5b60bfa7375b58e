"""The rows a run appends as it goes: metrics.csv (one per logged step) and samples.jsonl (the
generations at log steps). Appended and flushed, so readers see them live; on resume both are cut
back to the checkpoint's step (and a row a kill cut short dropped), so each step appears once.
`runs` names the files; this module only writes and reads rows.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smollab.rundir.atomic import atomic_write, writing


class Metrics:
    """metrics.csv: one row per logged step, appended and flushed, never a duplicate step.

    The columns are fixed when the run starts. On resume, rows after the checkpoint's step are
    dropped (they will be logged again), and so is a row cut short by a kill, so the file holds
    each step exactly once; a fresh start (`resume_step` None) empties it.
    """

    def __init__(
        self,
        path: Path,
        columns: list[str],
        resume_step: int | None,
        on_row: Callable[[dict[str, float]], None] | None = None,
    ):
        self.path = path
        self.columns = columns
        self.on_row = on_row  # sees each row once it is in the file, as `read_metrics` reads it
        rows = []
        if resume_step is not None and path.exists():
            with open(path, newline="") as f:
                rows = [r for r in csv.DictReader(f) if _row_step(r) <= resume_step]
        atomic_write(path, self._writer_of(rows), newline="")
        self._file = open(path, "a", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=columns, extrasaction="ignore")

    def _writer_of(self, rows: list[dict[str, Any]]) -> Callable[[Any], None]:
        def write(f) -> None:
            w = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)

        return write

    def append(self, row: dict[str, Any]) -> None:
        """Write and flush the row; then `on_row` gets it as the file holds it (the CSV is the
        truth: trackers receive the same names, steps and rounded values, and only after)."""
        cells = {k: _fmt(v) for k, v in row.items()}
        with writing(self.path):
            self._writer.writerow(cells)
            self._file.flush()
        if self.on_row is not None:
            self.on_row({k: float(cells[k]) for k in self.columns if cells.get(k, "") != ""})

    def close(self) -> None:
        self._file.close()


def _row_step(row: dict[str, Any]) -> float:
    """The step of a whole metrics row; infinity (never kept) for a row a kill cut short."""
    if None in row or None in row.values():  # fewer or more cells than the header
        return math.inf
    try:
        return int(row["step"])
    except (KeyError, TypeError, ValueError):
        return math.inf


def cut_samples(path: Path, resume_step: int | None) -> None:
    """Cut samples.jsonl back to the lines of steps up to `resume_step` (all of them on a fresh
    start, `resume_step` None), dropping a line a kill cut short."""
    if not path.exists():
        return
    upto = -1 if resume_step is None else resume_step
    with open(path) as f:
        keep = [x.rstrip("\n") + "\n" for x in f if _sample_step(x) <= upto]
    atomic_write(path, lambda f: f.writelines(keep))


def _sample_step(line: str) -> float:
    """The step of a whole samples.jsonl record; infinity for a line a kill cut short."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, TypeError, KeyError):
        return math.inf


def _fmt(v: Any) -> Any:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else v


def read_metrics(path: Path) -> list[dict[str, float | None]]:
    """metrics.csv as a list of rows with floats (None where a cell is empty)."""
    if not Path(path).exists():
        return []
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            out.append({k: (float(v) if v not in ("", None) else None) for k, v in r.items()})
    return out
