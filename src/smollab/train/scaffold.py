"""What every training loop repeats around its own step: open the run directory (or find it
finished, or refuse a changed config), find the tokenizer, take an optimizer step, check that DDP
replicas agree, and wrap up. Loops call these in order, top to bottom, with `checkpoints.resume`
and `checkpoints.save_state` between; the loop itself (batches, losses, metrics) stays in each
loop's `train()`, which `crash_record.records_failure` decorates (pretrain and SFT keep their
counters and metrics rows in a `ledger.Ledger`). Under DDP rank 0 alone writes the run directory
and every decision it takes reaches the other ranks.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from smollab.config import DataConfig, ModelConfig, TrainingConfig
from smollab.config.load import to_dict
from smollab.errors import UserError
from smollab.rundir.writer import RunDir
from smollab.train import crash_record, distributed
from smollab.train.distributed import SINGLE, Dist
from smollab.train.schedule import schedule_note


def open_run(
    path: Path, cfg: TrainingConfig, command: str, dist: Dist = SINGLE
) -> tuple[RunDir | None, dict | None]:
    """Start `path` or find where to resume it. The second value is the summary of a run that had
    already finished: the loop returns it and does nothing else. A run that goes on is marked
    running (an earlier failure's evidence cleared), cleaned of what a killed writer left, its
    trackers (`run.report_to`) attached, a warmup longer than the run noted in its log, and from
    here on a crash is recorded into it. Under DDP rank 0 alone opens the directory (the others
    get None) and every rank learns whether it had finished or was refused."""
    from smollab.trackers import open_trackers

    opened: list[RunDir] = []

    def start() -> dict | None:
        opened.append(RunDir.start(path, to_dict(cfg), cfg.run.resume, command))
        return opened[0].read_summary() if opened[0].already_done else None

    finished = distributed.rank0_decides(start, dist)
    run = opened[0] if opened else None
    if run and finished is not None:
        print(f"run {run.path} already {finished['status']}; nothing to do", flush=True)
        run.close()
    elif run:
        crash_record.opened(run)
        for done in run.clean_leftovers():
            run.log(f"leftover of an interrupted write: {done}")
        run.update_summary(status="running", evidence=None)
        open_trackers(run, cfg.run.report_to, to_dict(cfg), cfg.run.group)
        if note := schedule_note(cfg.optim, cfg.train.max_steps):
            run.log(note, echo=True)
    return run, finished


def load_tokenizer_for(model_cfg: ModelConfig, data_cfg: DataConfig | None, data_tokens: bool):
    """The tokenizer of a run. Pretraining (`data_tokens`, data already prepared) reads the data
    directory's, since its tokens are the data. Fine-tuning reads the one saved beside the model,
    else the data directory's, preparing that directory if it holds nothing yet; without a data
    directory (`data_cfg` None: SFT's records) the model must have one."""
    from smollab.data.prepare import ensure_prepared
    from smollab.data.tokenizer import load_tokenizer
    from smollab.models.loading import load_tokenizer_near, resolve_model_dir

    if not data_tokens:
        where = resolve_model_dir(model_cfg.path) if model_cfg.path else None
        if isinstance(where, str) or (where and (where / "tokenizer_config.json").exists()):
            return load_tokenizer_near(where)  # a hub id, or a directory that has one
        if data_cfg is None:
            raise UserError(
                f"model.path {model_cfg.path}: no tokenizer beside the model "
                f"({where}); the records are tokenized with the model's own"
            )
        ensure_prepared(data_cfg, exact=False)
    return load_tokenizer(Path(data_cfg.dir) / "tokenizer")


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


def check_replicas(run: RunDir | None, dist: Dist, model, optimizer, scaler) -> None:
    """Under DDP, after every rank left the loop together: do all replicas hold the same weights,
    optimizer state, loss scale and RNG? Logged ("replicas agree") and kept in the summary as
    `replicas_agree`, so a drift (a bug) shows instead of averaging silently into the gradients."""
    if not dist.enabled:
        return
    held = [*model.parameters(), *model.buffers(), torch.get_rng_state()]
    held += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    if scaler is not None:
        held.append(torch.tensor(scaler.get_scale(), device="cpu"))
    if dist.device.type == "cuda":
        held.append(torch.cuda.get_rng_state(dist.device))
    agree = distributed.replicas_agree(held, dist)
    if run:
        run.update_summary(replicas_agree=agree)
        what = "weights, optimizer state and RNG"
        run.log(
            f"replicas agree: {what} equal on all {dist.world} ranks"
            if agree
            else f"replicas DISAGREE: {what} differ between ranks (a bug: please report it)",
            echo=True,
        )


def finish(
    run: RunDir,
    status: str,
    model,
    tokenizer,
    log_line: str,
    *,
    plots: bool,
    merged: bool = False,
    **summary: Any,
) -> dict[str, Any]:
    """Final checkpoint (also `final_merged/` for LoRA with `merged`) unless interrupted, the
    summary, plots (`run.plots`), closing lines. The loop re-raises an interrupt after this
    returns."""
    if status != "interrupted":
        run.save_checkpoint("final", model, tokenizer)
        if merged:
            run.save_checkpoint("final_merged", model.merge_and_unload(), tokenizer)
    out = run.update_summary(status=status, **summary)
    run.log(log_line, echo=True)
    if plots:
        from smollab.report.plots import plot_run

        plot_run(run.path)
    run.close()
    crash_record.closed(run)
    print(f"run directory: {run.path}", flush=True)
    return out
