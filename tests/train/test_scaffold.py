"""The run scaffold: one optimizer step, and state that resumes weights, optimizer, scaler, RNG."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

from smollab.rundir.writer import RunDir  # noqa: E402
from smollab.train import checkpoints, scaffold  # noqa: E402
from tests.engine.test_sampler import micro_llama  # noqa: E402


def _step(model, optimizer, scaler, clip: float) -> tuple[torch.Tensor, float]:
    loss = model(input_ids=torch.tensor([[1, 5, 6, 7]]), labels=torch.tensor([[1, 5, 6, 7]])).loss
    (scaler.scale(loss) if scaler else loss).backward()
    want = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in model.parameters()))
    if scaler:
        want /= scaler.get_scale()
    return scaffold.optimizer_step(list(model.parameters()), optimizer, scaler, clip), want


def test_optimizer_step_measures_without_clipping_at_zero_and_zeroes_grads():
    model = micro_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    norm, want = _step(model, opt, None, 0.0)
    assert norm == pytest.approx(want, rel=1e-4) and want > 1.0
    assert all(p.grad is None for p in model.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    norm, want = _step(model, opt, scaler, 0.5)
    assert norm == pytest.approx(want, rel=1e-4)  # the unscaled norm, before clipping


def test_save_state_then_resume_restores_everything(tmp_path):
    model = micro_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    _step(model, opt, scaler, 1.0)
    run = RunDir.start(tmp_path / "run", {"x": 1}, "auto", "test")
    torch.manual_seed(123)
    checkpoints.save_state(run, 3, model, None, opt, scaler, keep_last=2, tokens=42)
    after_save = torch.rand(4)
    run.close()

    fresh = micro_llama(seed=1)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    fresh_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    again = RunDir.start(tmp_path / "run", {"x": 1}, "auto", "test")
    state = checkpoints.resume(again, fresh, fresh_opt, fresh_scaler, lora=False)
    again.close()
    assert state == {"step": 3, "tokens": 42}
    torch.testing.assert_close(torch.rand(4), after_save)  # RNG continues where it was saved
    assert fresh_scaler.get_scale() == scaler.get_scale()
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    got, want = fresh_opt.state_dict()["state"], opt.state_dict()["state"]
    torch.testing.assert_close(got[0]["exp_avg"], want[0]["exp_avg"])
