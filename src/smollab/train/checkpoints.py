"""Resumable state: what a step checkpoint holds beside its weights, how a run saves it, and how a
run resumes from the newest checkpoint that reads whole.

Resumable state is the optimizer, the GradScaler, the RNG streams (torch's and Python's) and
whatever the loop adds (its step counters); weights are the checkpoint's safetensors (a LoRA run:
its adapter only; a routed run: retain/ and forget/, PEFT's layout), loaded strictly. A checkpoint that cannot be read (cut short by a full disk,
damaged) is skipped for the one before it, with a line in the log. Under DDP rank 0 picks the
checkpoint and every rank loads it from the shared filesystem (the data directory is shared
already), so replicas continue with the same optimizer, scaler and RNG: cheaper than broadcasting
an optimizer state twice the model's size through pickles.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import torch

from smollab.models.routing import routed_adapters
from smollab.rundir.atomic import one_line
from smollab.rundir.runs import TRAINER_STATE
from smollab.rundir.writer import CheckpointError, RunDir, load_trainer_state
from smollab.train import distributed
from smollab.train.distributed import SINGLE, Dist

WEIGHTS, ADAPTER = "model.safetensors", "adapter_model.safetensors"


def save_state(
    run: RunDir, step: int, model, tokenizer, optimizer, scaler, keep_last: int, **loop_state: Any
) -> None:
    """checkpoints/step_<step>/: weights, tokenizer and everything `resume` restores."""
    rng = {"cpu": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    if torch.backends.mps.is_available():
        rng["mps"] = torch.mps.get_rng_state()
    state = dict(optimizer=optimizer.state_dict(), rng=rng, step=step, **loop_state)
    if scaler is not None:
        state["scaler"] = scaler.state_dict()
    run.save_checkpoint(f"step_{step}", model, tokenizer, state, keep_last)


def resume(
    run: RunDir | None, model: torch.nn.Module, optimizer, scaler, lora: bool, dist: Dist = SINGLE
) -> dict[str, Any]:
    """Load the weights, optimizer, scaler and RNG of the newest usable step checkpoint into the
    given objects and return the loop's own saved fields ({} when the run starts fresh).
    `run.resume_from` becomes the checkpoint used. Under DDP `run` is None off rank 0."""
    device = str(next(model.parameters()).device)
    lora = routed_adapters(model) or lora  # a routed model: its adapters' names
    picked: dict[str, Any] = {}

    def pick() -> Path | None:  # rank 0: the newest checkpoint that reads whole
        if run and run.resume_from:
            picked["ckpt"], picked["state"], picked["weights"] = _usable_checkpoint(
                run, lora, device
            )
        return picked.get("ckpt")

    ckpt = distributed.rank0_decides(pick, dist)
    if ckpt is None:
        return {}
    if picked:  # rank 0 has read it whole already
        state, weights = picked["state"], picked["weights"]
    else:
        state = load_trainer_state(ckpt)
        weights = _read_weights(ckpt, lora, device)
    if run:
        run.resume_from = ckpt
    _load_weights(model, weights, _weights_path(ckpt, lora), lora)
    optimizer.load_state_dict(state.pop("optimizer"))
    scaler_state = state.pop("scaler", None)
    if scaler is not None and scaler_state is not None:
        scaler.load_state_dict(scaler_state)
    _restore_rng(state.pop("rng", None), dist)
    if run:
        run.log(f"resumed from {ckpt.name} at step {state['step']}", echo=True)
    return state


def _weights_path(ckpt: Path, lora: bool | list[str]) -> Path:
    """The weights file (a routed checkpoint, `lora` its adapters: the directory)."""
    return ckpt if isinstance(lora, list) else ckpt / (ADAPTER if lora else WEIGHTS)


def _read_weights(ckpt: Path, lora: bool | list[str], device: str) -> dict:
    """The checkpoint's tensors; a routed one's as {adapter: {name: tensor}}."""
    from safetensors.torch import load_file

    if isinstance(lora, list):
        return {a: load_file(ckpt / a / ADAPTER, device=device) for a in lora}
    return load_file(_weights_path(ckpt, lora), device=device)


def _restore_rng(rng: dict[str, Any] | None, dist: Dist) -> None:
    """torch's and Python's global streams, for what draws from them (dropout). Every rank seeds
    them alike and draws the same shapes, so under DDP they are equal on all ranks and rank 0's
    saved copy (of its own GPU, cuda:0) restores each rank's (`check_replicas` verifies it)."""
    if rng is None:
        return
    torch.set_rng_state(rng["cpu"])
    if rng.get("python") is not None:
        version, internal, gauss = rng["python"]
        random.setstate((version, tuple(internal), gauss))
    if rng.get("mps") is not None and torch.backends.mps.is_available():
        torch.mps.set_rng_state(rng["mps"])
    gpus = rng.get("cuda")
    if not gpus or not torch.cuda.is_available():
        return
    if dist.enabled:
        torch.cuda.set_rng_state(gpus[0], dist.device)
    else:  # as many GPUs as are here now
        for i, gpu_state in enumerate(gpus[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(gpu_state, i)


def _usable_checkpoint(run: RunDir, lora: bool | list[str], device: str) -> tuple[Path, dict, dict]:
    """The newest step checkpoint whose trainer state and weights read whole, falling back one
    checkpoint at a time (a line in the log for each skipped); a CheckpointError when none does."""
    skipped = []
    for ckpt in reversed(run.step_checkpoints()):
        if not (ckpt / TRAINER_STATE).exists():
            continue
        weights_path = _weights_path(ckpt, lora)
        try:
            state = load_trainer_state(ckpt)
            if not isinstance(state, dict) or not {"step", "optimizer"} <= state.keys():
                raise CheckpointError(f"{ckpt / TRAINER_STATE}: not a trainer state")
            try:
                weights = _read_weights(ckpt, lora, device)
            except Exception as e:
                raise CheckpointError(f"{weights_path}: unreadable ({one_line(e)})") from e
        except CheckpointError as e:
            skipped.append(str(e).replace(f"{run.ckpt_dir}{os.sep}", ""))
            run.log(f"checkpoint {ckpt.name} unusable, trying the one before: {e}", echo=True)
            continue
        return ckpt, state, weights
    raise CheckpointError(
        f"no usable checkpoint in {run.ckpt_dir}: {'; '.join(skipped)}; "
        "remove them (or the run directory) to start over"
    )


def _load_weights(
    model: torch.nn.Module, weights: dict, path: Path, lora: bool | list[str]
) -> None:
    """Strict: every tensor the model (or its adapter) has must be in the file and nothing else."""
    if isinstance(lora, list):
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        _check_keys(path, set(lora), set(weights))
        for a in lora:
            own = set(get_peft_model_state_dict(model, adapter_name=a))
            _check_keys(path / a / ADAPTER, own, set(weights[a]))
            set_peft_model_state_dict(model, weights[a], adapter_name=a)
        return
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
        parts = [
            f"{what} {_first(keys)}"
            for what, keys in (("missing", missing), ("unexpected", unexpected))
            if keys
        ]
        raise CheckpointError(f"{path} does not fit the model: {'; '.join(parts)}")


def _first(keys: list[str], n: int = 3) -> str:
    return ", ".join(keys[:n]) + (f" (+{len(keys) - n} more)" if len(keys) > n else "")
