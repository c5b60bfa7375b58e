"""A live progress bar when stdout is a terminal; nothing otherwise (plain log lines instead)."""

from __future__ import annotations

import sys


class Progress:
    def __init__(self, total: int, enabled: bool = True, start: int = 0, label: str = "train"):
        self.live = enabled and sys.stdout.isatty()
        self._bar = None
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn(f"[bold]{label}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(label, total=total, completed=start, info="")

    def update(self, step: int, **info: float | None) -> None:
        if self._bar is None:
            return
        text = "  ".join(_fmt(k, v) for k, v in info.items() if v is not None)
        self._bar.update(self._task, completed=step, info=text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def _fmt(key: str, value: float) -> str:
    if key == "tps":
        return f"{value:,.0f} tok/s"
    return f"{key} {value:.4g}"
