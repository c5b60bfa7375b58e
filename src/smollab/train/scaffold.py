"""What every training loop repeats around its own step: record a crash, open or resume the run
directory, take an optimizer step, save resumable state, and wrap up. Loops call these in order,
top to bottom; the loop itself (batches, losses, metrics) stays in each loop's `train()`.

Resumable state is the optimizer, the GradScaler, the RNG streams (torch's and Python's) and
whatever the loop adds (its step counters); weights are the checkpoint's safetensors (a LoRA run:
its adapter only), loaded strictly. A checkpoint that cannot be read (cut short by a full disk,
damaged) is skipped for the one before it, with a line in the log.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import random
import traceback
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import torch

from smollab.config import DataConfig, ModelConfig, TrainingConfig, to_dict
from smollab.errors import RunFailed
from smollab.runs import (
    LOG,
    TRAINER_STATE,
    CheckpointError,
    RunDir,
    is_disk_full,
    load_trainer_state,
    one_line,
)

WEIGHTS, ADAPTER = "model.safetensors", "adapter_model.safetensors"

# The runs a `records_failure` call has opened and not yet wrapped up (`open_run` adds, `finish`
# removes): what a crash must be recorded into.
_OPEN_RUNS: ContextVar[list[RunDir] | None] = ContextVar("smollab_open_runs", default=None)


def records_failure(train: Callable[[Any], dict]) -> Callable[[Any], dict]:
    """Decorates a loop's `train(cfg)`. Once `open_run` has opened the run directory, any exception
    is recorded there (status failed, its one-line evidence in summary.json, the traceback in
    training.log) and raised as RunFailed (the CLI's exit 1); an interrupt the loop has not wrapped
    up itself is recorded as interrupted. Before that (bad input) nothing is written and the
    exception passes unchanged. The step in the evidence is the loop's `step` variable (optimizer
    steps done) at the moment the exception left `train`."""

    @functools.wraps(train)
    def recorded(cfg: Any) -> dict:
        opened: list[RunDir] = []
        token = _OPEN_RUNS.set(opened)
        try:
            return train(cfg)
        except KeyboardInterrupt as e:
            step = _loop_step(e, train)
            for run in opened:
                _record(run, "interrupted", "interrupted" + _after(step), step)
            raise
        except Exception as e:
            if not opened:
                raise
            step = _loop_step(e, train)
            evidence = failure_line(e) + _after(step)
            with contextlib.suppress(Exception):  # a full disk may refuse the log too
                trace = "".join(traceback.format_exception(e)).rstrip()
                opened[-1].log(f"failed: {evidence}\n{trace}")
            _record(opened[-1], "failed", evidence, step)
            raise RunFailed(evidence, opened[-1].path / LOG) from e
        finally:
            _OPEN_RUNS.reset(token)

    return recorded


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
            step = tb.tb_frame.f_locals.get("step")
            return step if isinstance(step, int) else None
        tb = tb.tb_next
    return None


def _record(run: RunDir, status: str, evidence: str, step: int | None) -> None:
    """Best effort: when the disk is full this may not land, and the raised error still says why."""
    with contextlib.suppress(Exception):
        run.update_summary(status=status, evidence=evidence,
                           **({"steps": step} if step is not None else {}))  # fmt: skip
    with contextlib.suppress(Exception):
        run.close()


def open_run(path: Path, cfg: TrainingConfig, command: str) -> tuple[RunDir, dict | None]:
    """Start `path` or find where to resume it. The second value is the summary of a run that had
    already finished: the loop returns it and does nothing else. A run that goes on is marked
    running (an earlier failure's evidence cleared), cleaned of what a killed writer left, and
    from here on a crash is recorded into it (`records_failure`)."""
    run = RunDir.start(path, to_dict(cfg), cfg.run.resume, command)
    if not run.already_done:
        opened = _OPEN_RUNS.get()
        if opened is not None:
            opened.append(run)
        for done in run.clean_leftovers():
            run.log(f"leftover of an interrupted write: {done}")
        run.update_summary(status="running", evidence=None)
        return run, None
    summary = run.read_summary()
    print(f"run {run.path} already {summary['status']}; nothing to do", flush=True)
    run.close()
    return run, summary


def load_tokenizer_for(model_cfg: ModelConfig, data_cfg: DataConfig, data_tokens: bool):
    """The tokenizer of a run. Pretraining (`data_tokens`, data already prepared) reads the data
    directory's, since its tokens are the data. Fine-tuning reads the one saved beside the model,
    else the data directory's, preparing that directory if it holds nothing yet."""
    from smollab.data.prepare import ensure_prepared
    from smollab.data.tokenizer import load_tokenizer
    from smollab.models.loading import load_tokenizer_near, resolve_model_dir

    if not data_tokens:
        where = resolve_model_dir(model_cfg.path) if model_cfg.path else None
        if isinstance(where, str) or (where and (where / "tokenizer_config.json").exists()):
            return load_tokenizer_near(where)  # a hub id, or a directory that has one
        ensure_prepared(data_cfg, exact=False)
    return load_tokenizer(Path(data_cfg.dir) / "tokenizer")


def resume(run: RunDir, model: torch.nn.Module, optimizer, scaler, lora: bool) -> dict[str, Any]:
    """Load the weights, optimizer, scaler and RNG of the newest usable step checkpoint into the
    given objects and return the loop's own saved fields ({} when the run starts fresh).
    `run.resume_from` becomes the checkpoint used."""
    if not run.resume_from:
        return {}
    device = next(model.parameters()).device
    ckpt, state, weights = _usable_checkpoint(run, lora, str(device))
    run.resume_from = ckpt
    _load_weights(model, weights, ckpt / (ADAPTER if lora else WEIGHTS), lora)
    optimizer.load_state_dict(state.pop("optimizer"))
    scaler_state = state.pop("scaler", None)
    if scaler is not None and scaler_state is not None:
        scaler.load_state_dict(scaler_state)
    rng = state.pop("rng", None)
    if rng is not None:
        torch.set_rng_state(rng["cpu"])
        if rng.get("python") is not None:
            version, internal, gauss = rng["python"]
            random.setstate((version, tuple(internal), gauss))
        if rng.get("cuda") and torch.cuda.is_available():  # as many GPUs as are here now
            for i, gpu_state in enumerate(rng["cuda"][: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(gpu_state, i)
    run.log(f"resumed from {ckpt.name} at step {state['step']}", echo=True)
    return state


def _usable_checkpoint(run: RunDir, lora: bool, device: str) -> tuple[Path, dict, dict]:
    """The newest step checkpoint whose trainer state and weights read whole, falling back one
    checkpoint at a time (a line in the log for each skipped); a CheckpointError when none does."""
    from safetensors.torch import load_file

    skipped = []
    for ckpt in reversed(run.step_checkpoints()):
        if not (ckpt / TRAINER_STATE).exists():
            continue
        weights_path = ckpt / (ADAPTER if lora else WEIGHTS)
        try:
            state = load_trainer_state(ckpt)
            if not isinstance(state, dict) or not {"step", "optimizer"} <= state.keys():
                raise CheckpointError(f"{ckpt / TRAINER_STATE}: not a trainer state")
            try:
                weights = load_file(weights_path, device=device)
            except Exception as e:
                raise CheckpointError(f"{weights_path}: unreadable ({one_line(e)})") from e
        except CheckpointError as e:
            skipped.append(str(e).replace(f"{run.ckpt_dir}{os.sep}", ""))
            run.log(f"checkpoint {ckpt.name} unusable, trying the one before: {e}", echo=True)
            continue
        return ckpt, state, weights
    raise CheckpointError(f"no usable checkpoint in {run.ckpt_dir}: {'; '.join(skipped)}; "
                          "remove them (or the run directory) to start over")  # fmt: skip


def _load_weights(model: torch.nn.Module, weights: dict, path: Path, lora: bool) -> None:
    """Strict: every tensor the model (or its adapter) has must be in the file and nothing else."""
    if lora:
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        _check_keys(path, set(get_peft_model_state_dict(model)), set(weights))
        set_peft_model_state_dict(model, weights)
        return
    params = model.state_dict()
    _check_keys(path, set(params) - _tied_to(params, set(weights)), set(weights))
    try:
        model.load_state_dict(weights, strict=False)  # a tied weight arrives through its twin
    except RuntimeError as e:  # shapes that differ
        raise CheckpointError(f"{path} does not fit the model: {one_line(e)}") from e


def _tied_to(params: dict[str, torch.Tensor], present: set[str]) -> set[str]:
    """Names absent from the file that share storage with a name present (HF saves tied weights,
    such as lm_head tied to the embedding, once)."""
    by_storage: dict[tuple, list[str]] = {}
    for name, t in params.items():
        if t.numel():
            by_storage.setdefault((t.device, t.data_ptr()), []).append(name)
    return {n for names in by_storage.values() if present & set(names) for n in names} - present


def _check_keys(path: Path, expected: set[str], got: set[str]) -> None:
    missing, unexpected = sorted(expected - got), sorted(got - expected)
    if missing or unexpected:
        parts = [f"{what} {_first(keys)}" for what, keys in
                 (("missing", missing), ("unexpected", unexpected)) if keys]  # fmt: skip
        raise CheckpointError(f"{path} does not fit the model: {'; '.join(parts)}")


def _first(keys: list[str], n: int = 3) -> str:
    return ", ".join(keys[:n]) + (f" (+{len(keys) - n} more)" if len(keys) > n else "")


def optimizer_step(params: list[torch.Tensor], optimizer, scaler, grad_clip: float) -> torch.Tensor:
    """Unscale, clip (`grad_clip` 0: measure the norm only), step, update the scaler, zero grads.
    Returns the gradient norm before clipping."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def save_state(
    run: RunDir, step: int, model, tokenizer, optimizer, scaler, keep_last: int, **loop_state: Any
) -> None:
    """checkpoints/step_<step>/: weights, tokenizer and everything `resume` restores."""
    rng = {"cpu": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    state = dict(optimizer=optimizer.state_dict(), rng=rng, step=step, **loop_state)
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    run.save_checkpoint(f"step_{step}", model, tokenizer, state, keep_last)


def finish(run: RunDir, status: str, model, tokenizer, log_line: str, *, merged: bool = False,
           **summary: Any) -> dict[str, Any]:  # fmt: skip
    """Final checkpoint (also `final_merged/` for LoRA with `merged`) unless interrupted, the
    summary, plots, closing lines. The loop re-raises an interrupt after this returns."""
    if status != "interrupted":
        run.save_checkpoint("final", model, tokenizer)
        if merged:
            run.save_checkpoint("final_merged", model.merge_and_unload(), tokenizer)
    out = run.update_summary(status=status, **summary)
    run.log(log_line, echo=True)
    from smollab.report.plots import plot_run

    plot_run(run.path)
    run.close()
    opened = _OPEN_RUNS.get()
    if opened is not None and run in opened:
        opened.remove(run)  # wrapped up: a later exception is not this run's failure
    print(f"run directory: {run.path}", flush=True)
    return out
