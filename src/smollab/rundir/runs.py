"""The run directory's names, statuses and reader: every file a run writes (config.json,
metrics.csv, summary.json, training.log, samples.jsonl, checkpoints/, plots/, ...; the layout is
in docs/architecture.md, "The run directory"), the statuses a summary may hold, and `RunView`.

Sweeps, probes, reports and users read these files while a run is going, so every write that
matters is atomic (temp file, then rename) and metrics rows are flushed as they are appended. No
other module spells a run's file names: the writer (`writer.RunDir`) and readers (`RunView`)
take them from here. The sweep directory's own files are named here too, because the lab writes
them and reports read them.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from smollab.rundir.atomic import atomic_write_json, read_json
from smollab.rundir.rows import read_metrics

# ---- the names ------------------------------------------------------------------------------
CONFIG = "config.json"  # resolved config
METRICS = "metrics.csv"  # one row per logged step
SUMMARY = "summary.json"  # status, final metrics, environment
LOG = "training.log"  # human log: command, environment, code version, progress
SAMPLES = "samples.jsonl"  # generation tasks: prompt, completion, reward at log steps
ROUTING_EVAL = "routing_eval.jsonl"  # gradient routing: one row per adapter mode per evaluation
EVAL_PROMPTS = "eval_prompts.jsonl"  # GRPO: each held-out prompt's reward, a line per evaluation
WORDLE_GAMES = "wordle_games.json"  # `smollab sample RUN --wordle-games N`: solve rate, guesses
CHECKPOINTS = "checkpoints"  # step_<N>/, best/, final/ in HF layout
ROUNDS = "rounds"  # `smollab rft`: rounds/<N>/ (data.jsonl, stats.json, sft/, model/)
PLOTS = "plots"  # png figures redrawn from metrics.csv
TRAINER_STATE = "trainer_state.pt"  # inside a step checkpoint: what resume needs
REPORT = "report.md"  # `smollab report` of a run or sweep directory (and the demo's)
CHILD_LOG = "child.log"  # a lab-launched run: its process's stdout and stderr
CHILD_PID = ".child.pid"  # a lab-launched run: the pid while it runs
SWEEP_RESULTS = "results.csv"  # sweep directory: one row per trial
SWEEP_META = "sweep.json"  # sweep directory: spec, device, progress
SWEEP_LOCK = ".sweep.lock"  # sweep directory: flock held by the running sweep, holds its pid
WARM_LOG = "warm.log"  # a sweep, probe, bench or doctor directory: the warm start server's output
TENSORBOARD = "tb"  # run.report_to tensorboard: the run's event files
WANDB = "wandb"  # run.report_to wandb: W&B's own directory (wandb.init(dir=<run dir>) names it)

# What a run writes, removed when run.resume=never starts it over (a lab parent's CHILD_LOG and
# CHILD_PID stay: the parent has them open for the child it launched into this directory).
RUN_FILES = (
    CONFIG,
    METRICS,
    SUMMARY,
    LOG,
    SAMPLES,
    ROUTING_EVAL,
    EVAL_PROMPTS,
    WORDLE_GAMES,
    CHECKPOINTS,
    ROUNDS,
    PLOTS,
    REPORT,
    TENSORBOARD,
    WANDB,
)

STATUSES = (
    "running",
    "completed",
    "diverged",
    "degenerate",
    "stuck",
    "pruned",
    "failed",
    "interrupted",
)
FINISHED = ("completed", "diverged", "degenerate", "stuck", "pruned")  # results, never rerun


def run_path(run_dir: str | None, command: str, parts: Iterable[str]) -> Path:
    """A run's directory: `run.dir` exactly when set, else runs/<command>-<parts>, deterministic,
    so running the same config again resumes it."""
    if run_dir:
        return Path(run_dir)
    name = "-".join([command, *[p for p in parts if p]])
    safe = "".join(c if c.isalnum() or c in "-_.=" else "_" for c in name)
    return Path("runs") / safe


def set_status(run_dir: str | Path, status: str, evidence: str | None = None) -> dict[str, Any]:
    """Record a verdict made outside the run (a sweep pruning it) into its summary, atomically."""
    if status not in STATUSES:
        raise ValueError(f"unknown status {status}")
    view = RunView(run_dir)
    summary = view.summary()
    summary.update(status=status, evidence=evidence)
    atomic_write_json(view.summary_path, summary)
    return summary


class RunView:
    """A read-only look at a run directory, which may be running, finished, or not a run at all.

    Sweeps, probes, reports and the demo read runs through this, so a missing file reads as empty
    (a run that has not logged yet) and the file names stay in this module.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunView({str(self.path)!r})"

    config_path = property(lambda self: self.path / CONFIG)
    metrics_path = property(lambda self: self.path / METRICS)
    summary_path = property(lambda self: self.path / SUMMARY)
    log_path = property(lambda self: self.path / LOG)
    samples_path = property(lambda self: self.path / SAMPLES)
    plots_dir = property(lambda self: self.path / PLOTS)
    checkpoints_dir = property(lambda self: self.path / CHECKPOINTS)
    routing_eval_path = property(lambda self: self.path / ROUTING_EVAL)
    eval_prompts_path = property(lambda self: self.path / EVAL_PROMPTS)

    def is_run(self) -> bool:
        """Whether anything of a run is here yet (a config, a summary or metrics)."""
        return any(p.exists() for p in (self.config_path, self.summary_path, self.metrics_path))

    def summary(self) -> dict[str, Any]:
        return read_json(self.summary_path) if self.summary_path.exists() else {}

    def config(self) -> dict[str, Any]:
        return read_json(self.config_path) if self.config_path.exists() else {}

    def metrics(self) -> list[dict[str, float | None]]:
        return read_metrics(self.metrics_path)

    def routing_eval(self) -> list[dict[str, Any]]:
        """routing_eval.jsonl's rows (a line a kill cut short is skipped); [] without routing."""
        return _jsonl(self.routing_eval_path)

    def eval_prompts(self) -> list[dict[str, Any]]:
        """eval_prompts.jsonl's rows ({step, rewards: one per held-out prompt}), a line a kill
        cut short skipped; [] for a run that writes none (not GRPO, or no evaluations yet)."""
        return _jsonl(self.eval_prompts_path)

    def status(self) -> str | None:
        return self.summary().get("status")

    def last(self, key: str) -> float | None:
        """The last logged value of a metrics column (None if never logged)."""
        rows = [r for r in self.metrics() if r.get(key) is not None]
        return rows[-1][key] if rows else None

    def step_checkpoints(self) -> list[Path]:
        """checkpoints/step_<N>/ directories, oldest first."""
        d = self.checkpoints_dir
        steps = (
            [p for p in d.glob("step_*") if p.name.split("_")[1].isdigit()] if d.is_dir() else []
        )
        return sorted(steps, key=lambda p: int(p.name.split("_")[1]))

    def latest_checkpoint(self) -> Path | None:
        """The newest complete step checkpoint: the one `run.resume=auto` continues from."""
        steps = [p for p in self.step_checkpoints() if (p / TRAINER_STATE).exists()]
        return steps[-1] if steps else None

    def resume_step(self) -> int:
        """The step a relaunch continues after (0: it starts over)."""
        latest = self.latest_checkpoint()
        return int(latest.name.split("_")[1]) if latest else 0

    def log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """A jsonl file's whole records (a line a kill cut short is skipped); [] when it is absent."""
    rows = []
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        for line in f:
            with contextlib.suppress(ValueError):
                rows.append(json.loads(line))
    return rows
