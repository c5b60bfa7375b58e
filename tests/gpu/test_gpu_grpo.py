"""Micro GRPO on CUDA, full and LoRA, with the replayed first forward and without, and under bf16
autocast: it completes on the GPU, rewards are computed (a reward with spread, so the policy
gradient is not zero), and the forward path was the one asked for."""

from __future__ import annotations

import math

import pytest
import yaml

from smollab.config.load import load_config
from smollab.rundir.runs import RunView
from tests.gpu.marks import GPU, bf16_ok

pytestmark = GPU

REWARD = {
    "reward": [
        {"name": "sentence_length", "params": {"target": 6, "unit": "words", "mode": "smooth"}}
    ]
}


def grpo(tmp_path, micro_grpo, *extra):
    from smollab.train.grpo.run import train

    recipe = tmp_path / "grpo.yaml"
    recipe.write_text(yaml.safe_dump(REWARD))
    cfg = load_config("grpo", str(recipe), [*micro_grpo, "perf.device=cuda", *extra])
    summary = train(cfg)
    assert summary["status"] == "completed", summary
    run = RunView(cfg.run.dir)
    assert run.summary()["device"].startswith("cuda")
    rows = run.metrics()
    assert len(rows) == cfg.train.max_steps
    for key in ("reward_mean", "kl", "loss", "grad_norm"):
        assert all(r[key] is not None and math.isfinite(r[key]) for r in rows), (key, rows)
    assert any(r["reward_std"] > 0 for r in rows)  # rewards differ within groups
    assert any(r["grad_norm"] > 0 for r in rows)  # so the policy gradient is not zero
    return run


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("replay", [True, False], ids=["replay", "no-replay"])
def test_grpo_on_cuda(lora, replay, micro_grpo, tmp_path):
    extra = [f"grpo.replay={str(replay).lower()}"] + (["model.lora.enabled=true"] if lora else [])
    run = grpo(tmp_path, micro_grpo, *extra)
    log = "\n".join(run.log_lines())
    if replay:
        assert "replayed from the decode" in log, log
    else:
        assert "grpo.replay=false" in log, log
    s = run.summary()
    if lora:
        assert 0 < s["params_trainable"] < s["params_total"]
    else:
        assert s["params_trainable"] == s["params_total"]


def test_grpo_bf16_autocast_on_cuda(micro_grpo, tmp_path):
    if not bf16_ok():
        pytest.skip("this GPU has no native bf16")
    run = grpo(tmp_path, micro_grpo, "perf.precision=bf16")
    assert "computed (autocast)" in "\n".join(run.log_lines())
