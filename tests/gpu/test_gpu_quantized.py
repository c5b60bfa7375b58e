"""`model.load_in=4bit` on CUDA: the micro model (a few pretraining steps from random weights)
loads with bitsandbytes 4-bit linears, and LoRA GRPO steps run on it through HF generate (the
lean forward reads full-precision weights only) with a policy gradient that moves the adapters.
Needs the `quant` extra (pip install 'smollab[quant]'); skipped without it."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from smollab.config import FinetuneModelConfig
from smollab.models.loading import apply_lora, build_model
from tests.gpu.marks import GPU
from tests.gpu.test_gpu_grpo import grpo

pytestmark = GPU


def test_4bit_base_with_lora_runs_grpo_steps(micro_grpo, micro_model, tmp_path):
    bnb = pytest.importorskip("bitsandbytes", reason="pip install 'smollab[quant]'")
    cfg = FinetuneModelConfig(
        preset=None, path=str(micro_model), load_in="4bit", lora={"enabled": True}
    )
    model = build_model(cfg, device=torch.device("cuda"))
    linears = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert linears and all(m.weight.device.type == "cuda" for m in linears)
    peft = apply_lora(model, cfg.lora)
    trainable = [p for p in peft.parameters() if p.requires_grad]
    assert trainable and all(p.device.type == "cuda" for p in trainable)

    run = grpo(
        tmp_path,
        micro_grpo,
        "model.lora.enabled=true",
        "model.load_in=4bit",
        "train.max_steps=2",
        "train.save_interval=0",
    )
    log = "\n".join(run.log_lines())
    assert "HF sampler" in log, log  # no lean copy of 4-bit weights
    assert all(r["peak_mem_mb"] > 0 for r in run.metrics())
    adapter = load_file(run.checkpoints_dir / "final" / "adapter_model.safetensors")
    lora_b = [t for k, t in adapter.items() if "lora_B" in k]
    assert lora_b and any(t.abs().sum() > 0 for t in lora_b)  # zero at init: the steps moved it
