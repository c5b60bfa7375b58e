"""What every training loop repeats around its own step: open or resume the run directory, take an
optimizer step, save resumable state, and wrap up. Loops call these in order, top to bottom; the
loop itself (batches, losses, metrics) stays in each loop's `train()`. Under DDP rank 0 alone
writes the run directory; every rank learns from it where to resume and loads the same state, and
at the end `check_replicas` confirms they still agree.

Resumable state is the optimizer, the GradScaler, torch's RNG streams and whatever the loop adds
(its step counters); weights are the checkpoint's safetensors (a LoRA run: its adapter only).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from smollab.config import DataConfig, ModelConfig, TrainingConfig, to_dict
from smollab.errors import UserError
from smollab.runs import RunDir, load_trainer_state
from smollab.train import distributed
from smollab.train.distributed import SINGLE, Dist


def open_run(
    path: Path, cfg: TrainingConfig, command: str, dist: Dist = SINGLE
) -> tuple[RunDir | None, dict | None]:
    """Start `path` or find where to resume it. The second value is the summary of a run that had
    already finished: the loop returns it and does nothing else. Under DDP rank 0 alone writes the
    directory (the others get None) and tells every rank whether it had finished, or why it
    refused to open (a changed config), so all return or raise together instead of hanging."""
    run, refused = None, None
    if dist.main:
        try:
            run = RunDir.start(path, to_dict(cfg), cfg.run.resume, command)
        except UserError as e:
            refused = str(e)
    refused, finished = distributed.broadcast_object(
        (refused, run.read_summary() if run and run.already_done else None), dist
    )
    if refused:
        raise UserError(refused)
    if finished is not None and run:
        print(f"run {run.path} already {finished['status']}; nothing to do", flush=True)
        run.close()
    return run, finished


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


def resume(
    run: RunDir | None, model: torch.nn.Module, optimizer, scaler, lora: bool, dist: Dist = SINGLE
) -> dict[str, Any]:
    """Load the weights, optimizer, scaler and RNG of `run.resume_from` into the given objects and
    return the loop's own saved fields ({} when the run starts fresh).

    Under DDP rank 0 picks the checkpoint and every rank loads it from the shared filesystem (the
    data directory is shared already), so replicas continue with the same optimizer, scaler and
    RNG: cheaper than broadcasting an optimizer state twice the model's size through pickles."""
    ckpt = distributed.broadcast_object(run.resume_from if run else None, dist)
    if not ckpt:
        return {}
    state = load_trainer_state(ckpt)
    _load_weights(model, ckpt, lora)
    optimizer.load_state_dict(state.pop("optimizer"))
    scaler_state = state.pop("scaler", None)
    if scaler is not None and scaler_state is not None:
        scaler.load_state_dict(scaler_state)
    _restore_rng(state.pop("rng", None), dist)
    if run:
        run.log(f"resumed from {ckpt.name} at step {state['step']}", echo=True)
    return state


def _restore_rng(rng: dict[str, Any] | None, dist: Dist) -> None:
    """torch's global streams, for what draws from them (dropout). Every rank seeds them alike and
    draws the same shapes, so under DDP they are equal on all ranks and rank 0's saved copy (of
    its own GPU, cuda:0) restores each rank's (`check_replicas` verifies this at the end)."""
    if rng is None:
        return
    torch.set_rng_state(rng["cpu"])
    gpus = rng.get("cuda")
    if not gpus or not torch.cuda.is_available():
        return
    if dist.enabled:
        torch.cuda.set_rng_state(gpus[0], dist.device)
    else:  # as many GPUs as are here now
        for i, gpu_state in enumerate(gpus[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(gpu_state, i)


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


def check_replicas(run: RunDir | None, dist: Dist, model, optimizer, scaler) -> None:
    """Under DDP, after every rank left the loop together: do all replicas hold the same weights,
    optimizer state, loss scale and RNG? Logged ("replicas agree") and kept in the summary as
    `replicas_agree`, so a drift (a bug) shows instead of averaging silently into the gradients."""
    if not dist.enabled:
        return
    held = [*model.parameters(), *model.buffers(), torch.get_rng_state()]
    held += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    if scaler is not None:
        held.append(torch.tensor(scaler.get_scale()))
    if dist.device.type == "cuda":
        held.append(torch.cuda.get_rng_state(dist.device))
    agree = distributed.replicas_agree(held, dist)
    if run:
        run.update_summary(replicas_agree=agree)
        what = "weights, optimizer state and RNG"
        run.log(f"replicas agree: {what} equal on all {dist.world} ranks" if agree else
                f"replicas DISAGREE: {what} differ between ranks (a bug: please report it)",
                echo=True)  # fmt: skip


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
