"""Experiment trackers (`run.report_to`): TensorBoard, Weights & Biases, Trackio.

Each tracker is one small module with the same three calls (open with the resolved config, `row`
for every metrics row, `close` with the summary); `fanout` starts those a run names and sends each
row to all of them. The training scaffold attaches the fan-out to the run directory, so every row
reaches the trackers only after metrics.csv holds it: the CSV stays the source of truth.

This package sits beside `report` under `train` in the import layers: it reads nothing above the
run directory and config, and the loops (through the scaffold) are its only callers.
"""

from smollab.trackers.fanout import open_trackers

__all__ = ["open_trackers"]
