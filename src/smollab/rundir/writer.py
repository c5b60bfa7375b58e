"""A run writing its own directory: `RunDir` opens it (resume or refuse), logs, appends rows,
writes the summary and checkpoints, and cleans what a killed writer left.

Apart from `runs`, which keeps the names and the reader: readers never need this writer. The
trainer state it saves is read back here too (`load_trainer_state`), so its format has one home;
torch is imported only inside those two (a checkpoint's trainer_state.pt), never at import.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from smollab.errors import UserError
from smollab.rundir.atomic import (
    _json_default,
    atomic_write_json,
    fsync_dir,
    fsync_file,
    one_line,
    writing,
)
from smollab.rundir.rows import Metrics, cut_samples
from smollab.rundir.runs import (
    CHECKPOINTS,
    CONFIG,
    EVAL_PROMPTS,
    FINISHED,
    LOG,
    METRICS,
    ROUTING_EVAL,
    RUN_FILES,
    SAMPLES,
    STATUSES,
    SUMMARY,
    TRAINER_STATE,
    RunView,
)

# Keys that may differ when a run is continued: how to open it, not what it computes.
RERUN_FREE = {
    "run.resume": "auto continues, never starts over",
    "run.dir": "the directory itself, however it was spelled",
    "perf.threads": "speed only; the lab gives a resumed trial the CPU share free at the time",
    "run.report_to": "where rows are also sent, not what the run computes",
    "run.group": "how trackers group the run, not what it computes",
    "run.plots": "whether the end of the run draws plots/, not what it computes",
}


def git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        )
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


class RowSink(Protocol):
    """Where a run's rows also go besides metrics.csv (the trackers of `run.report_to`, attached by
    the training scaffold): each row as the CSV holds it, then the final summary on close."""

    def row(self, row: dict[str, float]) -> None: ...

    def close(self, summary: dict[str, Any]) -> None: ...


class RunDir:
    """One run's directory. Create with `RunDir.start`, which also decides whether to resume."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.ckpt_dir = self.path / CHECKPOINTS
        self._summary: dict[str, Any] = {}
        self._log_file = None
        self.metrics: Metrics | None = None
        self.sink: RowSink | None = None

    # ---- opening --------------------------------------------------------------------------

    @classmethod
    def start(cls, path: str | Path, config: dict[str, Any], resume: str, command: str) -> RunDir:
        """Open `path` for a run; `resume_from` tells the loop where to continue, if anywhere.

        A directory holding a run continues it (resume=auto) only under the same config: a
        finished run's result stands (`already_done`), an unfinished one resumes; any other
        config is refused with the keys that differ. resume=never starts the run over: the
        previous run's files go first.
        """
        run = cls(path)
        if resume == "never" and RunView(run.path).is_run():
            for name in RUN_FILES:
                p = run.path / name
                if p.is_dir():
                    shutil.rmtree(p)
                else:
                    p.unlink(missing_ok=True)
        existing = (run.path / CONFIG).exists()
        if existing:
            changes = config_changes(RunView(run.path).config(), config, command)
            if changes:
                more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
                raise UserError(
                    f"run.dir {run.path} holds a run with another config ({', '.join(changes[:3])}"
                    f"{more}): give a new run.dir, or run.resume=never to start it over"
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
            with writing(self.path / LOG):
                self._log_file.write(line + "\n")
                self._log_file.flush()
        if echo:
            print(msg, flush=True)

    def open_metrics(self, columns: list[str], resume_step: int | None) -> Metrics:
        """Open metrics.csv for appending. Every append-only file of the run (metrics.csv,
        samples.jsonl, routing_eval.jsonl, eval_prompts.jsonl) is cut back to `resume_step` first, or emptied on a
        fresh start, so a resumed run logs each step once."""
        cut_samples(self.path / SAMPLES, resume_step)
        cut_samples(self.path / ROUTING_EVAL, resume_step)
        cut_samples(self.path / EVAL_PROMPTS, resume_step)
        self.metrics = Metrics(
            self.path / METRICS, columns, resume_step, on_row=self.sink.row if self.sink else None
        )
        return self.metrics

    def append_samples(self, records: Iterable[dict[str, Any]]) -> None:
        """Add generations (prompt, completion, reward, step) to samples.jsonl, flushed."""
        with writing(self.path / SAMPLES), open(self.path / SAMPLES, "a") as f:
            f.writelines(json.dumps(r, default=_json_default) + "\n" for r in records)

    def append_routing_eval(self, rows: Iterable[dict[str, Any]]) -> None:
        """Add gradient routing's evaluation rows (step, mode, rewards, hack rate, diversity)."""
        with writing(self.path / ROUTING_EVAL), open(self.path / ROUTING_EVAL, "a") as f:
            f.writelines(json.dumps(r, default=_json_default) + "\n" for r in rows)

    def append_eval_prompts(self, step: int, rewards: list[float]) -> None:
        """Add one evaluation's reward per held-out prompt (in prompt order): a sweep's Wilcoxon
        pruner pairs them prompt by prompt with the best trial's."""
        line = json.dumps({"step": step, "rewards": rewards}, default=_json_default) + "\n"
        with writing(self.path / EVAL_PROMPTS), open(self.path / EVAL_PROMPTS, "a") as f:
            f.write(line)

    def update_summary(self, **fields: Any) -> dict[str, Any]:
        if "status" in fields and fields["status"] not in STATUSES:
            raise ValueError(f"unknown status {fields['status']}")
        self._summary.update(fields)
        atomic_write_json(self.path / SUMMARY, self._summary)
        return self._summary

    def close(self) -> None:
        """Close the files; the sink (trackers) gets the summary as it stands: the final one after
        `finish`, the failed or interrupted one after a crash."""
        sink, self.sink = self.sink, None
        if sink:
            sink.close(dict(self._summary))
        if self.metrics:
            self.metrics.close()
        if self._log_file:
            self._log_file.close()
            self._log_file = None

    # ---- checkpoints ----------------------------------------------------------------------

    def save_checkpoint(
        self,
        name: str,
        model,
        tokenizer=None,
        state: dict[str, Any] | None = None,
        keep_last: int | None = None,
    ) -> Path:
        """Write checkpoints/<name>/ in HF layout (+ trainer state) atomically.

        The directory is written under a temporary name, fsynced and renamed, so a reader (or a
        resume after kill -9) sees either the whole checkpoint or none of it. `keep_last` prunes
        the oldest step checkpoints up to this one (newer ones, left by a run that resumed from
        an earlier checkpoint, are rewritten as it gets there).
        """
        import torch
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a bar per save of a 1M-parameter model is noise
        self.ckpt_dir.mkdir(exist_ok=True)
        final = self.ckpt_dir / name
        tmp, old = self.ckpt_dir / f".{name}.tmp", self.ckpt_dir / f".{name}.old"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            with writing(final):
                model.save_pretrained(tmp, safe_serialization=True)
                if tokenizer is not None:
                    tokenizer.save_pretrained(tmp)
                if state is not None:
                    with open(tmp / TRAINER_STATE, "wb") as f:  # a file: a full disk is ENOSPC
                        torch.save(state, f)
                for f in tmp.rglob("*"):
                    if f.is_file():
                        fsync_file(f)
                fsync_dir(tmp)
                if final.exists():
                    shutil.rmtree(old, ignore_errors=True)
                    os.replace(final, old)
                os.replace(tmp, final)
                fsync_dir(self.ckpt_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        if keep_last is not None and name.startswith("step_"):
            upto = [p for p in self.step_checkpoints() if _ckpt_step(p) <= _ckpt_step(final)]
            for stale in upto[:-keep_last]:
                self._remove_checkpoint(stale)
        return final

    def _remove_checkpoint(self, ckpt: Path) -> None:
        """Rename away, then delete: a kill mid-delete leaves a hidden leftover, not half a step."""
        gone = ckpt.with_name(f".{ckpt.name}.old")
        shutil.rmtree(gone, ignore_errors=True)
        os.replace(ckpt, gone)
        shutil.rmtree(gone, ignore_errors=True)

    def clean_leftovers(self) -> list[str]:
        """Remove what a killed writer left: `.<name>.tmp` checkpoint directories, `.<name>.old`
        ones (restored as `<name>` when a kill fell between the two renames of best/ or final/),
        and temporary files of dead processes. Returns what it did, for the log."""
        done = []
        if self.ckpt_dir.is_dir():
            for p in sorted(self.ckpt_dir.glob(".*.tmp")):
                shutil.rmtree(p, ignore_errors=True)
                done.append(f"removed {p.name}")
            for p in sorted(self.ckpt_dir.glob(".*.old")):
                whole = self.ckpt_dir / p.name[1 : -len(".old")]
                if not whole.exists() and not whole.name.startswith("step_"):
                    os.replace(p, whole)
                    done.append(f"restored {whole.name}")
                else:
                    shutil.rmtree(p, ignore_errors=True)
                    done.append(f"removed {p.name}")
        for p in sorted(self.path.glob(".*.tmp*")):
            pid = p.name.rsplit(".tmp", 1)[1]
            if p.is_file() and (not pid.isdigit() or not _alive(int(pid))):
                p.unlink(missing_ok=True)
                done.append(f"removed {p.name}")
        return done

    def step_checkpoints(self) -> list[Path]:
        return RunView(self.path).step_checkpoints()

    def latest_checkpoint(self) -> Path | None:
        return RunView(self.path).latest_checkpoint()


def config_changes(old: dict[str, Any], new: dict[str, Any], command: str) -> list[str]:
    """`key old -> new` for each key whose value in `new` differs from the recorded `old` config
    (keys in RERUN_FREE aside). A key the recorded config lacks (written before the key existed)
    counts as its default; a key only the recorded config has (since removed) is not compared."""
    from smollab.config.load import flatten, to_dict
    from smollab.config.registry import SCHEMAS

    before, after = flatten(old), flatten(new)
    defaults = flatten(to_dict(SCHEMAS[command]())) if command in SCHEMAS else {}
    missing = object()
    out = []
    for key, value in after.items():
        was = before.get(key, defaults.get(key, missing))
        if key not in RERUN_FREE and was != value:
            shown = "(none)" if was is missing else json.dumps(was)
            out.append(f"{key} {shown} -> {json.dumps(value)}")
    return out


class CheckpointError(UserError):
    """A checkpoint that cannot be used: unreadable, cut short, or not this model's. One line
    naming it (never PyTorch's advice to unpickle with weights_only=False)."""


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    """Trainer state saved by `save_checkpoint`; `weights_only=True` never unpickles objects."""
    import pickle

    import torch

    path = Path(ckpt) / TRAINER_STATE
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:  # its message advises weights_only=False: never
        why = _first_sentence(str(e).partition("WeightsUnpickler error:")[2]) or "refused"
        raise CheckpointError(f"{path}: unreadable as plain data (weights-only load: {why})") from e
    except Exception as e:
        raise CheckpointError(
            f"{path}: unreadable ({_first_sentence(str(e)) or type(e).__name__})"
        ) from e


def _first_sentence(text: str) -> str:
    """The first sentence of the first non-empty line: PyTorch's errors go on with advice."""
    line = next((x.strip() for x in text.splitlines() if x.strip()), "")
    return one_line(line.split(". ")[0], 200)


def _ckpt_step(p: Path) -> int:
    return int(p.name.split("_")[1])


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
