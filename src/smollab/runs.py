"""The run directory (DESIGN section 3), a contract: every file name, the writers and the readers.

Sweeps, probes, reports and users read these files while a run is going, so every write that
matters is atomic (temp file, then rename) and metrics rows are flushed as they are appended. No
other module spells a run's file names: writers use `RunDir`, readers `RunView`. The sweep
directory's own files are named here too, because the lab writes them and reports read them.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from smollab.errors import UserError

# ---- the names ------------------------------------------------------------------------------
CONFIG = "config.json"  # resolved config
METRICS = "metrics.csv"  # one row per logged step
SUMMARY = "summary.json"  # status, final metrics, environment
LOG = "training.log"  # human log: command, environment, code version, progress
SAMPLES = "samples.jsonl"  # generation tasks: prompt, completion, reward at log steps
CHECKPOINTS = "checkpoints"  # step_<N>/, best/, final/ in HF layout
PLOTS = "plots"  # png figures redrawn from metrics.csv
TRAINER_STATE = "trainer_state.pt"  # inside a step checkpoint: what resume needs
REPORT = "report.md"  # `smollab report` of a run or sweep directory (and the demo's)
CHILD_LOG = "child.log"  # a lab-launched run: its process's stdout and stderr
CHILD_PID = ".child.pid"  # a lab-launched run: the pid while it runs
SWEEP_RESULTS = "results.csv"  # sweep directory: one row per trial
SWEEP_META = "sweep.json"  # sweep directory: spec, device, progress
SWEEP_LOCK = ".sweep.lock"  # sweep directory: flock held by the running sweep, holds its pid

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


def atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"file not found: {path}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: invalid JSON ({e.msg} at line {e.lineno})") from None


def git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
            timeout=5,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def environment() -> dict[str, Any]:
    """Versions and host, recorded in the log and the summary."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for pkg in ("smollab", "torch", "transformers", "peft", "tokenizers", "numpy"):
        with contextlib.suppress(PackageNotFoundError):
            versions[pkg] = version(pkg)
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
        "git_commit": git_commit(),
    }


class Metrics:
    """metrics.csv: one row per logged step, appended and flushed, never a duplicate step.

    The columns are fixed when the run starts. On resume, rows after the checkpoint's step are
    dropped (they will be logged again), so the file holds each step exactly once.
    """

    def __init__(self, path: Path, columns: list[str], resume_step: int | None):
        self.path = path
        self.columns = columns
        if resume_step is not None and path.exists():
            with open(path, newline="") as f:
                rows = [
                    r for r in csv.DictReader(f) if r.get("step") and int(r["step"]) <= resume_step
                ]
            self._rewrite(rows)
        elif not path.exists() or resume_step is None:
            self._rewrite([])
        self._file = open(path, "a", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=columns, extrasaction="ignore")

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.columns, extrasaction="ignore")
            w.writeheader()
            w.writerows(rows)
        os.replace(tmp, self.path)

    def append(self, row: dict[str, Any]) -> None:
        self._writer.writerow({k: _fmt(v) for k, v in row.items()})
        self._file.flush()

    def close(self) -> None:
        self._file.close()


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


class RunDir:
    """One run's directory. Create with `RunDir.start`, which also decides whether to resume."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.ckpt_dir = self.path / CHECKPOINTS
        self._summary: dict[str, Any] = {}
        self._log_file = None
        self.metrics: Metrics | None = None

    # ---- opening --------------------------------------------------------------------------

    @classmethod
    def start(cls, path: str | Path, config: dict[str, Any], resume: str, command: str) -> RunDir:
        """Open `path` for a run; `resume_from` tells the loop where to continue, if anywhere.

        A completed run is never overwritten: with resume=auto its existing result stands
        (`already_done`), and with resume=never an existing directory is an error.
        """
        run = cls(path)
        existing = (run.path / CONFIG).exists()
        if existing and resume == "never":
            raise UserError(
                f"run.dir {run.path} already holds a run: use run.resume=auto or another run.dir"
            )
        run.path.mkdir(parents=True, exist_ok=True)
        run.resume_from = run.latest_checkpoint() if existing else None
        prev = run.read_summary() if existing else {}
        run.already_done = prev.get("status") in FINISHED
        run._summary = prev
        run._log_file = open(run.path / LOG, "a")
        if not run.already_done:
            atomic_write_json(run.path / CONFIG, config)
        run.log(f"$ {' '.join([Path(sys.argv[0]).name, *sys.argv[1:]])}")
        env = environment()
        run.log(f"command {command}; python {env['python']}; {env['platform']}")
        run.log("versions " + " ".join(f"{k}={v}" for k, v in env["versions"].items()))
        run.log(f"git commit {env['git_commit'] or 'unknown'}")
        run._summary.update(command=command, environment=env)
        return run

    def read_summary(self) -> dict[str, Any]:
        return RunView(self.path).summary()

    # ---- writing --------------------------------------------------------------------------

    def log(self, msg: str, echo: bool = False) -> None:
        line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}"
        if self._log_file:
            self._log_file.write(line + "\n")
            self._log_file.flush()
        if echo:
            print(msg, flush=True)

    def open_metrics(self, columns: list[str], resume_step: int | None) -> Metrics:
        self.metrics = Metrics(self.path / METRICS, columns, resume_step)
        return self.metrics

    def append_samples(self, records: Iterable[dict[str, Any]]) -> None:
        """Add generations (prompt, completion, reward, step) to samples.jsonl, flushed."""
        with open(self.path / SAMPLES, "a") as f:
            f.writelines(json.dumps(r, default=_json_default) + "\n" for r in records)

    def update_summary(self, **fields: Any) -> dict[str, Any]:
        if "status" in fields and fields["status"] not in STATUSES:
            raise ValueError(f"unknown status {fields['status']}")
        self._summary.update(fields)
        atomic_write_json(self.path / SUMMARY, self._summary)
        return self._summary

    def close(self) -> None:
        if self.metrics:
            self.metrics.close()
        if self._log_file:
            self._log_file.close()
            self._log_file = None

    # ---- checkpoints ----------------------------------------------------------------------

    def save_checkpoint(
        self, name: str, model, tokenizer=None, state: dict[str, Any] | None = None,
        keep_last: int | None = None,
    ) -> Path:  # fmt: skip
        """Write checkpoints/<name>/ in HF layout (+ trainer state) atomically.

        The directory is written under a temporary name and renamed, so a reader (or a resume
        after kill -9) sees either the whole checkpoint or none of it.
        """
        import torch
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a bar per save of a 1M-parameter model is noise
        self.ckpt_dir.mkdir(exist_ok=True)
        final = self.ckpt_dir / name
        tmp = self.ckpt_dir / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if state is not None:
            torch.save(state, tmp / TRAINER_STATE)
        old = self.ckpt_dir / f".{name}.old"
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        if keep_last is not None and name.startswith("step_"):
            for stale in self.step_checkpoints()[:-keep_last]:
                shutil.rmtree(stale, ignore_errors=True)
        return final

    def step_checkpoints(self) -> list[Path]:
        return RunView(self.path).step_checkpoints()

    def latest_checkpoint(self) -> Path | None:
        steps = [p for p in self.step_checkpoints() if (p / TRAINER_STATE).exists()]
        return steps[-1] if steps else None


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    """Trainer state saved by `save_checkpoint`; `weights_only=True` never unpickles objects."""
    import torch

    return torch.load(Path(ckpt) / TRAINER_STATE, map_location="cpu", weights_only=True)


def default_run_dir(command: str, parts: Iterable[str]) -> Path:
    """runs/<command>-<parts>: deterministic, so running the same config again resumes it."""
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

    def is_run(self) -> bool:
        """Whether anything of a run is here yet (a config, a summary or metrics)."""
        return any(p.exists() for p in (self.config_path, self.summary_path, self.metrics_path))

    def summary(self) -> dict[str, Any]:
        return read_json(self.summary_path) if self.summary_path.exists() else {}

    def config(self) -> dict[str, Any]:
        return read_json(self.config_path) if self.config_path.exists() else {}

    def metrics(self) -> list[dict[str, float | None]]:
        return read_metrics(self.metrics_path)

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

    def log_lines(self) -> list[str]:
        try:
            return self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
