"""The bookkeeping pretrain and SFT keep beside their update step, written once: the counters
(step, tokens, train seconds), the running-loss window between two metrics rows, the cadence of
`train.log_interval`, `eval_interval` and `save_interval`, the divergence rule, the best held-out
loss and the run's status. The loop keeps the step itself (batches, forward, loss, backward,
optimizer step) and asks the ledger, top to bottom:

    ledger.add_loss(loss)                 # each micro-batch
    ledger.step_done(n_tokens, t0)        # after the optimizer step
    if ledger.log_due():
        ledger.log(lr, grad_norm, progress, evaluate=held_out_loss, line=_line)
    ledger.maybe_save(optimizer, scaler)
    ...
    summary = ledger.finish(plots=...)

The window sums losses as a device tensor, so a step waits for the device only at its clock
(`synchronize`) and reads the loss (`.item()`) only when a row is logged. A step checkpoint holds
the ledger's state (`state()`) and a resumed run starts from it, so it logs the rows an
uninterrupted run would have.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from smollab.config import TrainConfig
from smollab.device.mfu import flops_per_token
from smollab.device.runtime import peak_memory_mb, synchronize
from smollab.rundir.runs import RunView
from smollab.rundir.writer import RunDir
from smollab.train import checkpoints, distributed, scaffold
from smollab.train.distributed import SINGLE, Dist
from smollab.train.failure_rules import diverged_loss


class Ledger:
    """One run's counters, loss window and cadence. `state` is what `checkpoints.resume`
    returned ({} on a fresh start); metrics.csv is opened here with `columns`, cut back to that
    step. `train` is the run's `train` section (intervals, `seq_len`, `grad_accum`,
    `diverge_factor`, `keep_last`). `model` and `tokenizer` are what best/ and the step
    checkpoints save (the model itself, not a DDP or compiled wrapper); MFU counts the model's
    FLOPs per token against `peak_flops`; `wall_s` counts from `t_start` (`time.time()`).
    `micro_per_epoch` (micro-batches in one pass over the data) adds an epoch to each row and to
    the summary. Under DDP `run` is None off rank 0: those ranks count, reduce the loss and
    evaluate alike, and write nothing."""

    def __init__(
        self,
        run: RunDir | None,
        state: dict[str, Any],
        train: TrainConfig,
        *,
        columns: list[str],
        max_steps: int,
        model: torch.nn.Module,
        tokenizer,
        peak_flops: float | None,
        t_start: float,
        dist: Dist = SINGLE,
        micro_per_epoch: int | None = None,
    ):
        self.run, self.train, self.max_steps, self.dist = run, train, max_steps, dist
        self.model, self.tokenizer, self.device = model, tokenizer, next(model.parameters()).device
        self.flops_per_token = flops_per_token(model.config, train.seq_len)
        self.peak_flops, self.t_start = peak_flops, t_start
        self.micro_per_epoch = micro_per_epoch
        self.step, self.tokens = int(state.get("step", 0)), int(state.get("tokens", 0))
        self.train_s = float(state.get("train_s", 0.0))
        self.best_val = float(state.get("best_val", math.inf))
        self.start_loss: float | None = state.get("start_loss")
        self.status, self.evidence = "completed", None
        self.val_loss: float | None = None  # the last evaluation's
        # The window: what the next row averages, since the last row.
        self.window_loss = torch.full((), float(state.get("window_loss", 0.0)), device=self.device)
        self.window_steps = int(state.get("window_steps", 0))
        self.window_s, self.window_tokens = 0.0, 0
        if run:  # rows after the resumed step go: they will be logged again
            run.open_metrics(columns, resume_step=self.step if run.resume_from else None)

    # ---- during a step --------------------------------------------------------------------
    def add_loss(self, loss: torch.Tensor) -> None:
        """A micro-batch's share of the step's loss, kept on the device."""
        self.window_loss += loss.detach()

    def step_done(self, n_tokens: int, t0: float) -> None:
        """Count the step that started at `t0` (`time.perf_counter`) and trained on `n_tokens`;
        its time runs until the device has finished it."""
        self.step += 1
        self.tokens += n_tokens
        self.window_steps += 1
        self.window_tokens += n_tokens
        synchronize(self.device)
        dt = time.perf_counter() - t0
        self.train_s += dt
        self.window_s += dt

    # ---- the cadence ----------------------------------------------------------------------
    def _last(self) -> bool:
        return self.step >= self.max_steps

    def _eval_step(self) -> bool:
        every = self.train.eval_interval  # 0: never
        return bool(every) and (self.step % every == 0 or self._last())

    def log_due(self) -> bool:
        """Every `log_interval` steps, the first, every evaluation step and the last."""
        every = self.train.log_interval
        return self.step % every == 0 or self.step == 1 or self._eval_step() or self._last()

    # ---- a row ----------------------------------------------------------------------------
    def epochs(self) -> float:
        """Passes over the data so far (SFT)."""
        return self.step * self.train.grad_accum / self.micro_per_epoch

    def log(
        self,
        lr: float,
        grad_norm: torch.Tensor,
        progress,
        *,
        evaluate: Callable[[], float],
        line: Callable[[dict[str, Any]], str],
    ) -> None:
        """A metrics row over the window, which then starts again. The mean loss (over all
        ranks) is checked against its start (`train.diverge_factor`); at evaluation steps
        `evaluate()` adds the held-out loss, after the row's clocks are read (`wall_s` leaves it
        out) and unless the run has just diverged. The row goes to metrics.csv, the progress bar
        and the log (`line(row)`); a new best held-out loss saves best/; a divergence is logged.
        Off rank 0 the loss is reduced (and the model evaluated) alike, and nothing written."""
        mean = self.window_loss / self.window_steps
        loss = distributed.all_reduce_mean(mean, self.dist).item()
        self.start_loss = loss if self.start_loss is None else self.start_loss
        failure = diverged_loss(loss, self.start_loss, self.train.diverge_factor, self.step)
        if failure:
            self.status, self.evidence = failure.status, failure.evidence
        tps = self.window_tokens / self.window_s if self.window_s > 0 else 0.0
        row: dict[str, Any] = dict(step=self.step)
        if self.micro_per_epoch:
            row["epoch"] = self.epochs()
        row.update(
            tokens=self.tokens,
            wall_s=time.time() - self.t_start,
            train_s=self.train_s,
            lr=lr,
            train_loss=loss,
            grad_norm=float(grad_norm),
            tokens_per_s=tps,
            mfu=(self.flops_per_token * tps / self.peak_flops) if self.peak_flops else None,
            peak_mem_mb=peak_memory_mb(self.device),
        )
        if self._eval_step() and self.status == "completed":
            self.val_loss = row["val_loss"] = evaluate()
        self.window_loss.zero_()
        self.window_steps, self.window_s, self.window_tokens = 0, 0.0, 0
        if self.run is None:
            return
        self.run.metrics.append(row)
        progress.update(self.step, loss=loss, tps=tps, val=self.val_loss)
        self.run.log(line(row), echo=not progress.live)
        if row.get("val_loss") is not None and self.val_loss < self.best_val:
            self.best_val = self.val_loss
            self.run.save_checkpoint("best", self.model, self.tokenizer)
        if self.status == "diverged":
            self.run.log(f"diverged: {self.evidence}", echo=True)

    def interrupted(self) -> None:
        """Ctrl-C: the run ends as interrupted (no final checkpoint); the loop re-raises."""
        self.status, self.evidence = "interrupted", f"interrupted at step {self.step}"

    # ---- checkpoints and the end ----------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What a step checkpoint holds of the ledger beside its step (the window's clock
        starts again on resume)."""
        return dict(
            tokens=self.tokens,
            train_s=self.train_s,
            best_val=self.best_val,
            start_loss=self.start_loss,
            window_loss=float(self.window_loss),
            window_steps=self.window_steps,
        )

    def maybe_save(self, optimizer, scaler) -> None:
        """checkpoints/step_<step>/ every `train.save_interval` steps (the last `keep_last` kept)
        but at the last step (the final checkpoint follows), while the run goes well, where this
        rank writes."""
        every = self.train.save_interval  # 0: never
        periodic = bool(every) and self.step % every == 0 and not self._last()
        if self.run is None or self.status != "completed" or not periodic:
            return
        checkpoints.save_state(
            self.run,
            self.step,
            self.model,
            self.tokenizer,
            optimizer,
            scaler,
            self.train.keep_last,
            **self.state(),
        )

    def finish(self, *, plots: bool) -> dict[str, Any]:
        """`scaffold.finish` with the summary of a loss-trained run: steps (and epochs), tokens,
        final and best losses, seconds, throughput and the FLOPs that MFU was measured by."""
        epochs = {"epochs": self.epochs()} if self.micro_per_epoch else {}
        passes = f" ({epochs['epochs']:.2f} epochs)" if epochs else ""
        return scaffold.finish(
            self.run,
            self.status,
            self.model,
            self.tokenizer,
            f"{self.status}: {self.step} steps{passes}, {self.tokens:,} tokens in "
            f"{self.train_s:.1f}s train time; val loss {self.val_loss}",
            plots=plots,
            evidence=self.evidence,
            steps=self.step,
            **epochs,
            tokens=self.tokens,
            final_train_loss=RunView(self.run.path).last("train_loss"),
            final_val_loss=self.val_loss,
            best_val_loss=None if self.best_val == math.inf else self.best_val,
            train_seconds=self.train_s,
            wall_seconds=time.time() - self.t_start,
            tokens_per_s=self.tokens / self.train_s if self.train_s else None,
            flops_per_token=self.flops_per_token,
            peak_flops=self.peak_flops,
        )
