"""The ledger pretrain and SFT share: when rows, evaluations and saves fall, what a row averages,
and what a step checkpoint carries of it."""

from __future__ import annotations

import time

import pytest
import torch

pytest.importorskip("transformers")

from smollab.config import PretrainTrainConfig  # noqa: E402
from smollab.rundir.runs import read_metrics  # noqa: E402
from smollab.rundir.writer import RunDir  # noqa: E402
from smollab.train.ledger import Ledger  # noqa: E402
from smollab.train.progress import Progress  # noqa: E402
from tests.engine.test_sampler import micro_llama  # noqa: E402

COLUMNS = ["step", "tokens", "train_loss", "val_loss"]


def _ledger(run, state=None, **train) -> Ledger:
    tc = PretrainTrainConfig(max_steps=10, seq_len=8, **train)
    model = micro_llama()
    return Ledger(
        run,
        state or {},
        tc,
        columns=COLUMNS,
        max_steps=tc.max_steps,
        model=model,
        tokenizer=None,
        peak_flops=None,
        t_start=time.time(),
    )


def _step(ledger: Ledger, *losses: float) -> None:
    t0 = time.perf_counter()
    for loss in losses:
        ledger.add_loss(torch.tensor(loss))
    ledger.step_done(16, t0)


def test_rows_fall_on_log_steps_the_first_evaluations_and_the_last():
    ledger = _ledger(None, log_interval=3, eval_interval=4)
    logged, evaluated = [], []
    while ledger.step < ledger.max_steps:
        _step(ledger, 1.0)
        if ledger.log_due():
            logged.append(ledger.step)
            ledger.log(
                1e-3,
                torch.tensor(0.5),
                Progress(10, enabled=False),
                evaluate=lambda: evaluated.append(ledger.step) or 2.0,
                line=str,
            )
    assert logged == [1, 3, 4, 6, 8, 9, 10]
    assert evaluated == [4, 8, 10] and ledger.val_loss == 2.0


def test_a_row_averages_its_window_and_a_checkpoint_carries_it(tmp_path):
    run = RunDir.start(tmp_path / "run", {"x": 1}, "auto", "test")
    ledger = _ledger(run, log_interval=2, eval_interval=0, save_interval=0)
    progress = Progress(10, enabled=False)
    _step(ledger, 3.0, 1.0)  # step 1: logged alone
    ledger.log(1e-3, torch.tensor(0.0), progress, evaluate=lambda: 0.0, line=str)
    _step(ledger, 2.0)
    _step(ledger, 4.0)
    state = {"step": ledger.step, **ledger.state()}
    ledger.log(1e-3, torch.tensor(0.0), progress, evaluate=lambda: 0.0, line=str)
    run.close()
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    assert [(r["step"], r["tokens"], r["train_loss"]) for r in rows] == [(1, 16, 4.0), (3, 48, 3.0)]

    again = _ledger(None, state)  # resumed between steps 3's loss and its row
    assert (again.step, again.tokens, again.start_loss) == (3, 48, 4.0)
    assert float(again.window_loss) == 6.0 and again.window_steps == 2
