"""`smollab sft`: supervised fine-tuning on prompt/completion records, top to bottom like pretrain.

The loss is on completion tokens only (prompt tokens carry label -100; `sft.completion_only_loss`
false puts it on every token), summed over the optimizer step's micro-batches and divided by
their label tokens, so `train.grad_accum` changes memory, not the step. Micro-batch m is a pure
function of (seed, m) (`data.sft_batches`) and the LR of the step, so a resumed run replays
exactly what an uninterrupted one would have done. One process (no DDP yet).
"""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from smollab.config.sft import SFTConfig
from smollab.data.sft_batches import IGNORE, MicroBatches, eval_batches, loader, tokenize
from smollab.data.sft_records import load_records
from smollab.device.mfu import peak_flops
from smollab.device.runtime import (
    make_adamw,
    maybe_compile,
    release_cache,
    setup_runtime,
    to_device,
)
from smollab.errors import UserError
from smollab.models.loading import align_special_tokens, apply_lora, build_model, check_model_source
from smollab.models.presets import count_parameters
from smollab.rundir.columns import SFT as COLUMNS
from smollab.rundir.runs import run_path
from smollab.train import checkpoints, distributed, scaffold
from smollab.train.crash_record import records_failure
from smollab.train.ledger import Ledger
from smollab.train.progress import Progress
from smollab.train.schedule import lr_at
from smollab.train.seeds import stream_seed


def run_dir_for(cfg: SFTConfig) -> Path:
    source = Path(cfg.data.train_file or cfg.data.hf_dataset or "sft").stem
    kind = f"lora{cfg.model.lora.r}" if cfg.model.lora.enabled else "full"
    return run_path(
        cfg.run.dir,
        "sft",
        [cfg.run.name or source, kind, f"lr{cfg.optim.lr:g}", f"s{cfg.run.seed}"],
    )


def label_loss(model, batch: dict[str, torch.Tensor], rt) -> torch.Tensor:
    """Summed cross-entropy of the batch's labelled tokens (each predicted from the one before).
    `use_cache=False` is what keeps packed examples apart: with a KV cache (HF's default, even in
    train mode) transformers skips reading restarts in position_ids as example boundaries."""
    x, y, pos = (to_device(batch[k], rt.device) for k in ("input_ids", "labels", "position_ids"))
    with rt.autocast():
        logits = model(input_ids=x, position_ids=pos, use_cache=False).logits
    return F.cross_entropy(
        logits[:, :-1].float().flatten(0, 1),
        y[:, 1:].flatten(),
        ignore_index=IGNORE,
        reduction="sum",
    )


def count_labels(batch: dict[str, torch.Tensor]) -> int:
    return int((batch["labels"][:, 1:] != IGNORE).sum())


@torch.no_grad()
def evaluate(model, batches, rt) -> float:
    """Mean loss per labelled token over the whole held-out set."""
    model.eval()
    total = sum(label_loss(model, b, rt).item() for b in batches)
    model.train()
    release_cache(rt.device)
    return total / max(sum(count_labels(b) for b in batches), 1)


@records_failure
def train(cfg: SFTConfig) -> dict:
    """Run (or resume, or report the finished result of) one SFT run; returns its summary."""
    t_start = time.time()
    distributed.single_process_only("sft")
    dc, tc, oc = cfg.data, cfg.train, cfg.optim
    lora = cfg.model.lora.enabled
    if not cfg.model.path:
        raise UserError(
            "model.path: sft fine-tunes a trained model (a run directory, HF model "
            "directory or hub id) and tokenizes with its tokenizer"
        )
    check_model_source(cfg.model)
    rt = setup_runtime(cfg.perf)
    if dc.pin_memory and rt.device.type != "cuda":
        raise UserError(
            f"data.pin_memory: pinned memory speeds host-to-GPU copies; the device "
            f"is {rt.device.type}"
        )

    # ---- records, tokenizer, rows ---------------------------------------------------------
    tokenizer = scaffold.load_tokenizer_for(cfg.model, None, data_tokens=False)
    records = load_records(dc)
    tok = (tokenizer, tc.seq_len, cfg.sft.completion_only_loss, cfg.sft.packing)
    train_set, eval_set = tokenize(records.train, *tok), tokenize(records.eval, *tok)
    if not train_set.rows:
        raise UserError(
            f"{records.source}: no example keeps a labelled token within train.seq_len={tc.seq_len}"
        )
    if tc.eval_interval and not eval_set.rows:
        raise UserError(f"held-out set ({records.held_out}): no example keeps a labelled token")
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    per_epoch = math.ceil(len(train_set.rows) / tc.batch_size)  # micro-batches
    max_steps = math.ceil(tc.epochs * per_epoch / tc.grad_accum) if tc.epochs else tc.max_steps

    # ---- model and optimizer ------------------------------------------------------------
    torch.manual_seed(cfg.run.seed)
    model = build_model(
        cfg.model, attn_implementation=cfg.perf.attn_implementation, notes=rt.chosen
    )
    max_pos = getattr(model.config, "max_position_embeddings", None) or model.config.n_positions
    if tc.seq_len > max_pos:
        raise UserError(f"train.seq_len={tc.seq_len} exceeds the model's context of {max_pos}")
    if len(tokenizer) > model.config.vocab_size:
        raise UserError(
            f"model.path {cfg.model.path}: tokenizer has {len(tokenizer)} entries, "
            f"the model only {model.config.vocab_size}"
        )
    align_special_tokens(model, tokenizer)
    if lora:
        model = apply_lora(model, cfg.model.lora)
    model.to(rt.device)
    if cfg.perf.grad_checkpointing:
        model.activation_checkpointing_enable()  # the name since transformers 5

    # ---- run directory: resume or start ---------------------------------------------------
    run, finished = scaffold.open_run(run_dir_for(cfg), cfg, "sft")
    if finished is not None:
        return finished
    run.log(rt.describe(), echo=True)

    total_params, _ = count_parameters(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if p.dim() >= 2], "weight_decay": oc.weight_decay},
        {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = make_adamw(groups, rt, oc.lr, (oc.beta1, oc.beta2), oc.eps)

    # The MFU peak: measured once per machine, before resume restores the RNG it draws from.
    peak = peak_flops(rt.device, rt.autocast_dtype, may_measure=True)
    state = checkpoints.resume(run, model, optimizer, rt.scaler, lora=lora)
    ledger = Ledger(
        run,
        state,
        tc,
        columns=COLUMNS,
        max_steps=max_steps,
        model=model,
        tokenizer=tokenizer,
        peak_flops=peak,
        t_start=t_start,
        micro_per_epoch=per_epoch,
    )
    n_trainable = sum(p.numel() for p in trainable)
    data_note = dict(
        data=records.source,
        held_out=records.held_out,
        train_examples=train_set.examples,
        train_rows=len(train_set.rows),
        eval_examples=eval_set.examples,
        truncated_examples=train_set.truncated + eval_set.truncated,
        dropped_examples=train_set.dropped + eval_set.dropped,
        label_tokens=train_set.label_tokens,
        steps_planned=max_steps,
    )
    run.update_summary(
        params_total=total_params,
        params_trainable=n_trainable,
        device=str(rt.device),
        **data_note,
    )
    run.log(
        f"model {cfg.model.path}: {total_params:,} parameters, {n_trainable:,} trainable "
        f"({'LoRA r' + str(cfg.model.lora.r) if lora else 'full'})",
        echo=True,
    )
    run.log(
        f"data {records.source}: {train_set.examples:,} examples in {len(train_set.rows):,} "
        f"rows{' (packed)' if cfg.sft.packing else ''}, {train_set.label_tokens:,} labelled "
        f"tokens; held out: {records.held_out}, {eval_set.examples} examples; cut to "
        f"train.seq_len={tc.seq_len}: {data_note['truncated_examples']}, dropped (no "
        f"labelled token left): {data_note['dropped_examples']}; {max_steps} steps = "
        f"{max_steps * tc.grad_accum / per_epoch:.2f} epochs",
        echo=True,
    )
    compiled = maybe_compile(model, rt)

    val_batches = eval_batches(eval_set.rows, tc.batch_size, pad_id) if tc.eval_interval else None
    held_out_loss = functools.partial(evaluate, compiled, val_batches, rt)
    batches = MicroBatches(
        train_set.rows,
        tc.batch_size,
        functools.partial(stream_seed, cfg.run.seed),
        pad_id,
        max_steps * tc.grad_accum,
    )
    done = ledger.step * tc.grad_accum  # micro-batches trained before a resume
    micro_batches = iter(loader(batches, done, dc.num_workers, dc.pin_memory, dc.prefetch_factor))
    progress = Progress(max_steps, start=ledger.step, label="sft")

    # ---- the loop -----------------------------------------------------------------------
    try:
        while ledger.step < max_steps and ledger.status == "completed":
            if tc.max_time and ledger.train_s >= tc.max_time:
                break
            t0 = time.perf_counter()  # the wait for the loader counts: workers shorten it
            lr = lr_at(ledger.step, oc, max_steps)
            for g in optimizer.param_groups:
                g["lr"] = lr
            micro = [next(micro_batches) for _ in range(tc.grad_accum)]
            n_labels = max(sum(count_labels(b) for b in micro), 1)
            for batch in micro:
                loss = label_loss(compiled, batch, rt) / n_labels
                (rt.scaler.scale(loss) if rt.scaler else loss).backward()
                ledger.add_loss(loss)
            grad_norm = scaffold.optimizer_step(trainable, optimizer, rt.scaler, oc.grad_clip)
            ledger.step_done(sum(int(b["n_tokens"]) for b in micro), t0)

            if ledger.log_due():
                ledger.log(lr, grad_norm, progress, evaluate=held_out_loss, line=_line)
            ledger.maybe_save(optimizer, rt.scaler)
    except KeyboardInterrupt:
        ledger.interrupted()
    finally:
        progress.close()
        del micro_batches  # stops the loader's workers

    # ---- wrap up ------------------------------------------------------------------------
    summary = ledger.finish(plots=cfg.run.plots)
    if ledger.status == "interrupted":
        raise KeyboardInterrupt
    return summary


def _line(row: dict) -> str:
    parts = [f"step {row['step']}", f"epoch {row['epoch']:.2f}", f"loss {row['train_loss']:.4f}"]
    if row.get("val_loss") is not None:
        parts.append(f"val {row['val_loss']:.4f}")
    parts += [f"lr {row['lr']:.2e}", f"{row['tokens_per_s']:,.0f} tok/s"]
    return " | ".join(parts)
