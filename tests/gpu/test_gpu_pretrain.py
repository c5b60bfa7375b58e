"""Micro pretraining on CUDA in each precision and compiled: it completes on the GPU, the loss is
finite and falls, and the run did what was asked (TF32 flag, autocast, compile)."""

from __future__ import annotations

import math

import pytest
import torch

from smollab.config.load import load_config
from smollab.rundir.runs import RunView
from tests.gpu.marks import GPU, bf16_ok, chosen, compile_toolchain_missing

pytestmark = GPU

VARIANTS = {
    "fp32": ["perf.precision=fp32", "perf.tf32=false"],
    "tf32": ["perf.precision=fp32", "perf.tf32=true"],
    "bf16": ["perf.precision=bf16"],
    "fp16": ["perf.precision=fp16"],  # autocast with a GradScaler
    "compile": ["perf.compile=true"],
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_pretrain_on_cuda(variant, micro_pretrain):
    from smollab.train.pretrain import train

    if variant == "bf16" and not bf16_ok():
        pytest.skip("this GPU has no native bf16")
    if variant == "compile" and (why := compile_toolchain_missing()):
        pytest.skip(why)
    cfg = load_config("pretrain", None, [*micro_pretrain, "perf.device=cuda", *VARIANTS[variant]])
    summary = train(cfg)
    assert summary["status"] == "completed", summary
    run = RunView(cfg.run.dir)
    assert run.summary()["device"].startswith("cuda")
    losses = [r["train_loss"] for r in run.metrics() if r.get("train_loss") is not None]
    assert len(losses) >= 3 and all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0], losses
    assert math.isfinite(run.summary()["final_val_loss"])
    said = chosen(run.log_lines())
    if variant in ("fp32", "tf32"):  # setup_runtime set it in this process
        want = "tf32" if variant == "tf32" else "ieee"
        assert torch.backends.cuda.matmul.fp32_precision == want
        assert torch.backends.cudnn.conv.fp32_precision == want
    if variant in ("bf16", "fp16"):
        assert variant in said, said
    if variant == "compile":
        assert "compile" in said, said
