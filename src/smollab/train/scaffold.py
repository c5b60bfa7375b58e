"""What every training loop repeats around its own step: open or resume the run directory, take an
optimizer step, save resumable state, and wrap up. Loops call these in order, top to bottom; the
loop itself (batches, losses, metrics) stays in each loop's `train()`.

Resumable state is the optimizer, the GradScaler, torch's RNG streams and whatever the loop adds
(its step counters); weights are the checkpoint's safetensors (a LoRA run: its adapter only).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from smollab.config import DataConfig, ModelConfig, TrainingConfig, to_dict
from smollab.runs import RunDir, load_trainer_state


def open_run(path: Path, cfg: TrainingConfig, command: str) -> tuple[RunDir, dict | None]:
    """Start `path` or find where to resume it. The second value is the summary of a run that had
    already finished: the loop returns it and does nothing else."""
    run = RunDir.start(path, to_dict(cfg), cfg.run.resume, command)
    if not run.already_done:
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
    """Load the weights, optimizer, scaler and RNG of `run.resume_from` into the given objects and
    return the loop's own saved fields ({} when the run starts fresh)."""
    if not run.resume_from:
        return {}
    state = load_trainer_state(run.resume_from)
    _load_weights(model, run.resume_from, lora)
    optimizer.load_state_dict(state.pop("optimizer"))
    scaler_state = state.pop("scaler", None)
    if scaler is not None and scaler_state is not None:
        scaler.load_state_dict(scaler_state)
    rng = state.pop("rng", None)
    if rng is not None:
        torch.set_rng_state(rng["cpu"])
        if rng.get("cuda") and torch.cuda.is_available():  # as many GPUs as are here now
            for i, gpu_state in enumerate(rng["cuda"][: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(gpu_state, i)
    run.log(f"resumed from {run.resume_from.name} at step {state['step']}", echo=True)
    return state


def _load_weights(model: torch.nn.Module, ckpt: Path, lora: bool) -> None:
    from safetensors.torch import load_file, load_model

    if lora:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(ckpt / "adapter_model.safetensors"))
    else:
        device = next(model.parameters()).device
        load_model(model, ckpt / "model.safetensors", strict=False, device=str(device))


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
    rng = {"cpu": torch.get_rng_state()}
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
    print(f"run directory: {run.path}", flush=True)
    return out
