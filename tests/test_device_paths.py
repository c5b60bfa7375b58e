"""Every command under the strict device mode (tests/strict_device.py): what would break on a GPU
or a Mac fails here on the CPU. A micro pretrain, GRPO (full and LoRA, the policy forward replayed
and computed), `sample` (lean and HF samplers), the demo's sampling and the child of a probe level
run with every tensor factory and generator of smollab's code checked for an explicit device, and
every draw for a generator on its tensor's device. The old GRPO, seeded with `torch.Generator()`,
failed here with "generator device: Tensor.uniform_ at smollab/engine/token_draw.py ... made at
smollab/train/grpo.py ..." as it failed on every GPU.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from strict_device import StrictDevice

from smollab.config.load import load_config


def _interrupt_at_second_step(monkeypatch, loop) -> None:
    """Stop the loop's run at its second step like Ctrl-C: it saved step 1, so a rerun resumes."""
    real, calls = loop.lr_at, []

    def lr_at(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            monkeypatch.setattr(loop, "lr_at", real)
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(loop, "lr_at", lr_at)


def _strict_ok(mode: StrictDevice) -> None:
    assert mode.draws > 0, "the run drew no random numbers: the check saw nothing"
    assert not mode.violations, "device violations:\n" + mode.report()


def test_the_strict_mode_catches_the_old_grpo_generator():
    """The check itself: a CPU generator with a buffer on the model's device (the old GRPO) is
    reported; a generator made on the tensor's device is not."""
    from smollab.engine.token_draw import TokenDraw

    logits = torch.zeros(2, 8, device="cpu")
    with StrictDevice() as bad:
        TokenDraw(1.0, 0, 1.0, torch.Generator().manual_seed(0), 2, "cpu")(logits)
    assert any(v.startswith("generator device: Tensor.uniform_") for v in bad.violations)
    with StrictDevice() as good:
        TokenDraw(1.0, 0, 1.0, torch.Generator(device="cpu").manual_seed(0), 2, "cpu")(logits)
    _strict_ok(good)


def test_pretrain_step_eval_and_resume(micro_data, tmp_path, monkeypatch):
    from smollab.train import pretrain

    over = [
        "model.preset=micro",
        f"data.dir={micro_data}",
        "data.num_stories=400",
        "data.vocab_size=256",
        "train.batch_size=2",
        "train.seq_len=16",
        "train.max_steps=2",
        "train.eval_interval=2",
        "train.eval_tokens=32",
        "train.save_interval=1",
        "perf.device=cpu",
        "optim.warmup_steps=0",
        "run.plots=false",
        f"run.dir={tmp_path / 'run'}",
    ]
    _interrupt_at_second_step(monkeypatch, pretrain)
    # The CPU's MFU peak is measured once per machine (seconds), by device/mfu.py alone.
    monkeypatch.setattr(pretrain, "peak_flops", lambda *args, **kwargs: None)
    with StrictDevice() as mode:
        with pytest.raises(KeyboardInterrupt):
            pretrain.train(load_config("pretrain", None, over))
        summary = pretrain.train(load_config("pretrain", None, over))  # resumes from step 1
    assert summary["status"] == "completed" and summary["steps"] == 2
    _strict_ok(mode)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("replay", [True, False], ids=["replay", "computed"])
def test_grpo_step(micro_model, micro_data, tmp_path, monkeypatch, lora, replay):
    from smollab.train.grpo import run_state
    from smollab.train.grpo.run import train

    over = [
        f"model.path={micro_model}",
        f"data.dir={micro_data}",
        "train.max_steps=2",
        "train.batch_size=4",
        "grpo.num_generations=2",
        "grpo.max_completion_length=6",
        "train.eval_interval=2",
        "grpo.eval_prompts=2",
        "train.save_interval=1",
        f"grpo.replay={str(replay).lower()}",
        "perf.device=cpu",
        "optim.warmup_steps=0",
        "run.plots=false",
        f"run.dir={tmp_path / 'grpo'}",
    ]
    if lora:
        over += ["model.lora.enabled=true", "model.lora.r=2"]
    _interrupt_at_second_step(monkeypatch, run_state)
    with StrictDevice() as mode:
        with pytest.raises(KeyboardInterrupt):
            train(load_config("grpo", None, over))
        summary = train(load_config("grpo", None, over))  # resumes from step 1
    assert summary["status"] == "completed" and summary["steps"] == 2
    _strict_ok(mode)


def test_sample_command(micro_model, capsys):
    from smollab.cli import main

    with StrictDevice() as mode:
        code = main(
            [
                "sample",
                str(micro_model),
                "--prompt",
                "one day",
                "--n",
                "2",
                "--max-new-tokens",
                "4",
                "--seed",
                "1",
                "--device",
                "cpu",
            ]
        )
    assert code == 0 and capsys.readouterr().out.count("[one day]") == 2
    _strict_ok(mode)


def test_hf_sampler(micro_model):
    """The HF `generate` fallback (GPT-2 and other models the lean forward does not cover)."""
    from smollab.config import ModelConfig
    from smollab.engine.sampler import Sampler
    from smollab.models.loading import build_model, resolve_model_dir

    model = build_model(ModelConfig(preset=None, path=str(resolve_model_dir(str(micro_model)))))
    sampler = Sampler(model.eval(), backend="hf")
    with StrictDevice() as mode:
        a = sampler.generate([[1, 2], [3]], 4, seed=5)
        b = sampler.generate([[1, 2], [3]], 4, seed=5)
    assert torch.equal(a.completion_ids, b.completion_ids)
    _strict_ok(mode)


def test_demo_samples_before_after(micro_model, micro_data):
    """The demo's own sampling (before and after RL); its stages are the pretrain and GRPO above."""
    from smollab.demo import samples_before_after

    cfg = load_config(
        "grpo",
        None,
        [
            f"model.path={micro_model}",
            f"data.dir={micro_data}",
            "grpo.max_completion_length=4",
            "perf.device=cpu",
        ],
    )
    with StrictDevice() as mode:
        rows = samples_before_after(cfg, micro_model, micro_model)
    assert rows and all(r["before"] == r["after"] for r in rows)  # same model, same seed
    _strict_ok(mode)


SITE = """
import sys
sys.path.insert(0, {tests!r})
import strict_device
strict_device.install_in_process({report!r} + f"/strict-{{__import__('os').getpid()}}.json")
"""


def test_probe_children(micro_model, micro_data, tmp_path, monkeypatch):
    """A probe level's child (`python -m smollab grpo ...`, the CLI path) under strict mode from a
    sitecustomize, measured by the probe's own `ProcessLevel`."""
    from smollab.lab.probe.measure import ProcessLevel
    from smollab.lab.probe.spec import ProbeSpec

    site, reports = tmp_path / "site", tmp_path / "reports"
    site.mkdir()
    reports.mkdir()
    (site / "sitecustomize.py").write_text(
        SITE.format(tests=str(Path(__file__).parent), report=str(reports))
    )
    src = str(Path(__import__("smollab").__file__).parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), src]))
    over = [
        f"model.path={micro_model}",
        f"data.dir={micro_data}",
        "perf.device=cpu",
        "train.batch_size=4",
        "grpo.num_generations=2",
        "grpo.max_completion_length=6",
        "train.max_steps=50",
        "train.eval_interval=0",
        "optim.warmup_steps=0",
    ]
    spec = ProbeSpec(
        command="grpo", dir=str(tmp_path / "probe"), max_k=1, warmup=0, steps=3, timeout_s=120
    )
    level = ProcessLevel(spec, over, tmp_path / "probe", out=lambda m: None, poll_s=0.05)
    (run,), _ = level(1, None)
    assert run.error is None and run.step_s is not None, run.error
    found = [json.loads(p.read_text()) for p in reports.glob("strict-*.json")]
    child = [f for f in found if f["draws"]]  # the training child (not helper interpreters)
    assert child, f"no strict report from the child ({found}); python {sys.executable}"
    for f in child:
        assert not f["violations"], "device violations:\n" + "\n".join(f["violations"])
