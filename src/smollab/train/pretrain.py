"""`smollab pretrain`: causal-LM pretraining over memmapped tokens, top to bottom like nanoGPT.

Batches are a pure function of (seed, step, rank), the LR a pure function of the step, so a
resumed run replays exactly what an uninterrupted one would have done.
"""

from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from smollab.config import PretrainConfig
from smollab.data.prepare import ensure_prepared
from smollab.data.tokens import eval_batches, get_batch, open_tokens
from smollab.device.mfu import peak_flops
from smollab.device.runtime import (
    make_adamw,
    maybe_compile,
    release_cache,
    setup_runtime,
    to_device,
)
from smollab.errors import UserError
from smollab.models.loading import align_special_tokens, build_model, check_model_source
from smollab.models.presets import count_parameters
from smollab.rundir.columns import PRETRAIN as COLUMNS
from smollab.rundir.runs import run_path
from smollab.train import checkpoints, distributed, scaffold
from smollab.train.crash_record import records_failure
from smollab.train.ledger import Ledger
from smollab.train.progress import Progress
from smollab.train.schedule import lr_at
from smollab.train.seeds import stream_seed


def run_dir_for(cfg: PretrainConfig) -> Path:
    source = Path(cfg.model.path).name if cfg.model.path else cfg.model.preset
    return run_path(
        cfg.run.dir, "pretrain", [cfg.run.name or source, f"lr{cfg.optim.lr:g}", f"s{cfg.run.seed}"]
    )


def batch_generator(seed: int, step: int, micro: int, rank: int) -> torch.Generator:
    """Batches are drawn on the CPU (the token file is there) and then copied to the device."""
    return torch.Generator(device="cpu").manual_seed(stream_seed(seed, step, micro, rank))


@torch.no_grad()
def evaluate(model, batches, rt) -> float:
    model.eval()
    total = 0.0
    for x, y in batches:
        x, y = to_device(x, rt.device), to_device(y, rt.device)
        with rt.autocast():
            logits = model(input_ids=x).logits
        total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).item()
    model.train()
    release_cache(rt.device)
    return total / max(len(batches), 1)


@records_failure
def train(cfg: PretrainConfig) -> dict:
    """Run (or resume, or report the finished result of) one pretraining run; returns its summary."""
    t_start = time.time()
    check_model_source(cfg.model)  # before any data is prepared
    rt = setup_runtime(cfg.perf)
    tc, oc = cfg.train, cfg.optim

    # ---- data and tokenizer: every rank before it joins the group (the directory's lock lets
    # one build it, the rest reuse it), so none waits in a collective meanwhile ----------------
    meta = ensure_prepared(cfg.data, log=print if distributed.launch_rank() == 0 else _quiet)
    dist, rt.device = distributed.setup(rt.device)
    data_dir = Path(cfg.data.dir)
    tokenizer = scaffold.load_tokenizer_for(cfg.model, cfg.data, data_tokens=True)
    train_tokens = open_tokens(data_dir / "train.bin")
    val_tokens = open_tokens(data_dir / "val.bin")

    # ---- model and optimizer ------------------------------------------------------------
    torch.manual_seed(cfg.run.seed)
    model = build_model(
        cfg.model,
        vocab_size=meta["vocab_size"],
        attn_implementation=cfg.perf.attn_implementation,
        notes=rt.chosen,
    )
    max_pos = getattr(model.config, "max_position_embeddings", None) or model.config.n_positions
    if tc.seq_len > max_pos:
        raise UserError(f"train.seq_len={tc.seq_len} exceeds the model's context of {max_pos}")
    align_special_tokens(model, tokenizer)
    if meta["vocab_size"] > model.config.vocab_size:
        raise UserError(
            f"data.dir {cfg.data.dir}: tokenizer has {meta['vocab_size']} entries, "
            f"the model only {model.config.vocab_size}"
        )
    if cfg.perf.grad_checkpointing:
        model.gradient_checkpointing_enable()
    model.to(rt.device)

    # ---- run directory: resume or start (rank 0 writes it; every rank resumes alike) -----
    run, finished = scaffold.open_run(run_dir_for(cfg), cfg, "pretrain", dist)
    if finished is not None:
        distributed.teardown(dist)
        return finished
    log = run.log if run else (lambda *a, **k: None)
    log(rt.describe(), echo=True)

    total_params, non_embed = count_parameters(model)
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": oc.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    optimizer = make_adamw(groups, rt, oc.lr, (oc.beta1, oc.beta2), oc.eps)

    # The MFU peak: measured once per machine, before resume restores the RNG it draws from.
    peak = peak_flops(rt.device, rt.autocast_dtype, may_measure=not dist.enabled)  # ranks compete
    state = checkpoints.resume(run, model, optimizer, rt.scaler, lora=False, dist=dist)
    ledger = Ledger(
        run,
        state,
        tc,
        columns=COLUMNS,
        max_steps=tc.max_steps,
        model=model,
        tokenizer=tokenizer,
        peak_flops=peak,
        t_start=t_start,
        dist=dist,
    )
    if run:
        run.update_summary(
            params_total=total_params,
            params_non_embedding=non_embed,
            device=str(rt.device),
            world_size=dist.world,
            data=meta.get("source"),
        )
        log(
            f"model {cfg.model.path or cfg.model.preset}: {total_params:,} parameters "
            f"({non_embed:,} non-embedding)",
            echo=True,
        )
    ddp_model = maybe_compile(distributed.wrap(model, dist), rt)  # compile(DDP(model))

    tokens_per_step = tc.batch_size * tc.seq_len * tc.grad_accum * dist.world
    val_batches = (  # train.eval_interval=0: no evaluation, so no val_loss and no best/
        eval_batches(val_tokens, tc.batch_size, tc.seq_len, tc.eval_tokens)
        if tc.eval_interval
        else None
    )
    held_out_loss = functools.partial(evaluate, ddp_model, val_batches, rt)
    progress = Progress(tc.max_steps, enabled=dist.main, start=ledger.step)

    # ---- the loop -----------------------------------------------------------------------
    params = list(model.parameters())
    try:
        while ledger.step < tc.max_steps:
            # Ranks leave together, on one all-reduced flag: train_s is each rank's own clock.
            over_budget = (tc.max_tokens and ledger.tokens >= tc.max_tokens) or (
                tc.max_time and ledger.train_s >= tc.max_time
            )
            if distributed.any_rank(over_budget or ledger.status != "completed", dist):
                break
            t0 = time.perf_counter()
            lr = lr_at(ledger.step, oc, tc.max_steps)
            for g in optimizer.param_groups:
                g["lr"] = lr
            for micro in range(tc.grad_accum):
                x, y = get_batch(
                    train_tokens,
                    tc.batch_size,
                    tc.seq_len,
                    batch_generator(cfg.run.seed, ledger.step, micro, dist.rank),
                )
                x, y = to_device(x, rt.device), to_device(y, rt.device)
                last_micro = micro == tc.grad_accum - 1
                with (
                    contextlib.nullcontext()
                    if last_micro or not dist.enabled
                    else ddp_model.no_sync()
                ):
                    with rt.autocast():
                        logits = ddp_model(input_ids=x).logits
                        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
                    loss = loss / tc.grad_accum
                    (rt.scaler.scale(loss) if rt.scaler else loss).backward()
                ledger.add_loss(loss)
            grad_norm = scaffold.optimizer_step(params, optimizer, rt.scaler, oc.grad_clip)
            ledger.step_done(tokens_per_step, t0)

            if ledger.log_due():
                ledger.log(lr, grad_norm, progress, evaluate=held_out_loss, line=_line)
            ledger.maybe_save(optimizer, rt.scaler)
        scaffold.check_replicas(run, dist, model, optimizer, rt.scaler)
    except KeyboardInterrupt:
        ledger.interrupted()
    finally:
        progress.close()

    # ---- wrap up ------------------------------------------------------------------------
    summary = ledger.finish(plots=cfg.run.plots) if run else {}
    distributed.teardown(dist)
    if ledger.status == "interrupted":
        raise KeyboardInterrupt
    return summary


def _quiet(_: str) -> None:
    """The data's log on ranks other than 0: rank 0 says it once."""


def _line(row: dict) -> str:
    parts = [f"step {row['step']}", f"loss {row['train_loss']:.4f}"]
    if row.get("val_loss") is not None:
        parts.append(f"val {row['val_loss']:.4f}")
    parts += [f"lr {row['lr']:.2e}", f"{row['tokens_per_s']:,.0f} tok/s"]
    if row.get("mfu") is not None:
        parts.append(f"mfu {100 * row['mfu']:.1f}%")
    return " | ".join(parts)
