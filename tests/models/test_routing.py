"""Gradient routing's model: one routed pass equals the separate-pass definition, adapter modes
leave training state alone, and each adapter a routed run saves loads into PEFT and reproduces
its mode, from any working directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from smollab.config import ModelConfig, RoutingConfig  # noqa: E402
from smollab.engine.lean_llama import LeanLlama  # noqa: E402
from smollab.engine.token_logprobs import logprobs  # noqa: E402
from smollab.errors import UserError  # noqa: E402
from smollab.models.loading import build_model  # noqa: E402
from smollab.models.routing import (  # noqa: E402
    adapter_mode,
    apply_routing,
    load_routed,
    load_routed_dir,
    masks_for,
    routing_masks,
)

P = 4  # prompt columns


def _routed(micro_model, **kw):
    torch.manual_seed(0)
    base = build_model(ModelConfig(preset=None, path=str(micro_model)))
    cfg = RoutingConfig(enabled=True, retain_r=4, forget_r=2, forget_alpha=8.0, **kw)
    model = apply_routing(base, cfg)
    with torch.no_grad():  # B starts at zero: give both adapters something to say
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    return model


def _batch(B: int = 6, T: int = 11):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 256, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :2] = 0  # left padding in a prompt
    mask[4, :1] = 0
    return ids, mask


def _per_sample_loss(model, ids, mask):
    """L_i: a weighted sum of the row's completion log-probs (weights differ per row and token)."""
    lp = logprobs(model, ids, mask, P, share_prompts=False)
    w = torch.linspace(-1.0, 2.0, lp.numel()).view_as(lp)
    return (w * lp).sum(1)


def _grads(model, adapter: str) -> dict[str, torch.Tensor]:
    return {
        n: p.grad.clone()
        for n, p in model.named_parameters()
        if f".{adapter}." in n and p.grad is not None
    }


@pytest.mark.parametrize("mode", ["classic", "exclusive"])
def test_one_routed_pass_equals_the_separate_pass_definition(micro_model, mode):
    model = _routed(micro_model)
    ids, mask = _batch()
    flags = torch.tensor([1, 0, 0, 1, 0, 1], dtype=torch.bool)
    m_retain, m_forget = masks_for(flags, mode)
    plain = _per_sample_loss(model, ids, mask)
    with routing_masks(model, m_retain, m_forget):
        routed = _per_sample_loss(model, ids, mask)
        routed.sum().backward()
    torch.testing.assert_close(routed, plain, rtol=0, atol=0)  # the value is untouched
    one_pass = {a: _grads(model, a) for a in ("retain", "forget")}

    separate = {}
    for adapter, m in (("retain", m_retain), ("forget", m_forget)):
        model.zero_grad(set_to_none=True)
        m = torch.ones(len(flags)) if m is None else m
        (m * _per_sample_loss(model, ids, mask)).sum().backward()
        separate[adapter] = _grads(model, adapter)
    model.zero_grad(set_to_none=True)
    _per_sample_loss(model, ids, mask).sum().backward()
    unrouted = _grads(model, "retain")

    for adapter in ("retain", "forget"):
        assert one_pass[adapter].keys() == separate[adapter].keys() and one_pass[adapter]
        for name, g in separate[adapter].items():
            torch.testing.assert_close(one_pass[adapter][name], g, rtol=1e-5, atol=1e-6)
    # the masks did something: the retain adapter's gradient is not the unrouted one
    assert any(not torch.allclose(one_pass["retain"][n], g) for n, g in unrouted.items())


def test_masks_per_mode():
    flags = torch.tensor([True, False])
    assert masks_for(flags, "classic")[0].tolist() == [0.0, 1.0]
    assert masks_for(flags, "classic")[1] is None
    assert [m.tolist() for m in masks_for(flags, "exclusive")] == [[0.0, 1.0], [1.0, 0.0]]
    assert masks_for(flags, "none") == (None, None)


def test_adapter_modes_leave_training_state_as_it_was(micro_model):
    model = _routed(micro_model)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".retain." in n or ".forget." in n for n in trainable)
    ids, mask = _batch()
    out = {}
    for mode in ("both", "retain_only", "forget_only"):
        with torch.no_grad(), adapter_mode(model, mode):
            out[mode] = logprobs(model, ids, mask, P)
            lean = LeanLlama.from_hf(model)  # the sampler's copy sums the mode's adapters
            torch.testing.assert_close(logprobs(lean, ids, mask, P), out[mode])
    assert not torch.allclose(out["retain_only"], out["forget_only"])
    assert not torch.allclose(out["both"], out["retain_only"])
    assert [n for n, p in model.named_parameters() if p.requires_grad] == trainable
    assert list(model.base_model.active_adapters) == ["retain", "forget"]
    with torch.no_grad():
        torch.testing.assert_close(logprobs(model, ids, mask, P), out["both"])


def test_forget_scale_runs_from_retain_only_to_both(micro_model):
    """The forget adapter times s: at 0 the log-probs are retain_only's, at 1 both's (forward and
    the lean sampler's copy), in between neither; the scaling comes back on exit."""
    from smollab.models.routing import forget_scale

    model = _routed(micro_model)
    ids, mask = _batch()
    with torch.no_grad():
        want = {}
        for mode in ("both", "retain_only"):
            with adapter_mode(model, mode):
                want[mode] = logprobs(model, ids, mask, P)
        for s, mode in ((0.0, "retain_only"), (1.0, "both")):
            with forget_scale(model, s):
                torch.testing.assert_close(logprobs(model, ids, mask, P), want[mode])
                lean = LeanLlama.from_hf(model)
                torch.testing.assert_close(logprobs(lean, ids, mask, P), want[mode])
        with forget_scale(model, 0.5):
            half = logprobs(model, ids, mask, P)
        assert not torch.allclose(half, want["both"]) and not torch.allclose(
            half, want["retain_only"]
        )
        torch.testing.assert_close(logprobs(model, ids, mask, P), want["both"])
    with (
        pytest.raises(UserError, match=r"forget scale must be in \[0, 1\]"),
        forget_scale(model, 1.5),
    ):
        pass


@pytest.fixture(scope="module")
def routed_run(micro_model, micro_data, tmp_path_factory) -> Path:
    """A micro routed GRPO run whose model.path is relative (`run`, from micro_model's parent),
    as a user typing `model.path=runs/x` makes it; adapters on layer 0 only (layer_stride=2)."""
    from smollab.config.load import load_config
    from smollab.train.grpo import run as grpo

    out = tmp_path_factory.mktemp("routed") / "grpo"
    here = os.getcwd()
    os.chdir(micro_model.parent)
    try:
        grpo.train(
            load_config(
                "grpo",
                None,
                [
                    f"model.path={micro_model.name}",
                    f"data.dir={micro_data}",
                    "train.max_steps=2",
                    "train.batch_size=8",
                    "grpo.num_generations=4",
                    "grpo.max_completion_length=8",
                    "train.eval_interval=0",
                    "optim.lr=3e-2",
                    f"run.dir={out}",
                    "grpo.routing.enabled=true",
                    "grpo.routing.retain_r=4",
                    "grpo.routing.forget_r=2",
                    "grpo.routing.layer_stride=2",
                    "grpo.routing.targets=[q,v,down]",
                    "grpo.routing.eval_interval=0",
                    "reward=[{name: happy_binary}]",
                ],
            )
        )
    finally:
        os.chdir(here)
    return out


def test_saved_adapters_load_into_peft_and_reproduce_each_mode(routed_run, tmp_path, monkeypatch):
    from peft import PeftModel

    final = routed_run / "checkpoints" / "final"
    monkeypatch.chdir(tmp_path)  # the base is found from anywhere (recorded absolute)
    ids, mask = _batch()
    both = load_routed(_base(final), final).eval()
    with torch.no_grad():
        out = {}
        for mode, adapter in (("retain_only", "retain"), ("forget_only", "forget")):
            with adapter_mode(both, mode):
                out[mode] = want = logprobs(both, ids, mask, P)
            alone = PeftModel.from_pretrained(_base(final), str(final / adapter)).eval()
            torch.testing.assert_close(logprobs(alone, ids, mask, P), want)
            merged = load_routed_dir(final, mode)
            torch.testing.assert_close(logprobs(merged, ids, mask, P), want, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(out["retain_only"], out["forget_only"])  # trained apart
        zero = load_routed_dir(final, scale=0.0)  # smollab sample --forget-scale 0
        got = logprobs(zero, ids, mask, P)
        torch.testing.assert_close(got, out["retain_only"], rtol=1e-5, atol=1e-5)
        whole = build_model(ModelConfig(preset=None, path=str(routed_run)))  # both merged
        torch.testing.assert_close(
            logprobs(whole, ids, mask, P), logprobs(both, ids, mask, P), rtol=1e-5, atol=1e-5
        )
    names = [n for n, _ in both.named_parameters() if "lora_A" in n]
    assert names and all(".layers.0." in n for n in names)  # layer_stride=2 on 2 layers


def _base(final: Path):
    """The base model the adapters name, loaded as they record it."""
    import json

    from transformers import AutoModelForCausalLM

    cfg = json.loads((final / "retain" / "adapter_config.json").read_text())
    assert Path(cfg["base_model_name_or_path"]).is_absolute()
    return AutoModelForCausalLM.from_pretrained(cfg["base_model_name_or_path"])


def test_sample_a_routed_run_from_another_working_directory(
    routed_run, tmp_path, monkeypatch, capsys
):
    from smollab.cli import main

    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    for mode in ("both", "retain_only", "forget_only"):
        argv = ["sample", str(routed_run), "--prompt", "Once", "--max-new-tokens", "3"]
        assert main([*argv, "--mode", mode]) == 0, capsys.readouterr().err
        assert capsys.readouterr().out.startswith("[Once] Once")


def test_wrapping_in_peft_prints_no_checkpointing_deprecation():
    """PEFT reads transformers' deprecated `is_gradient_checkpointing` when it wraps a model:
    a FutureWarning on every run that smollab, which reads the new name, silences there."""
    import warnings

    from smollab.config import LoraConfig
    from smollab.models.loading import apply_lora

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply_routing(
            build_model(ModelConfig(preset="micro"), vocab_size=300),
            RoutingConfig(enabled=True, retain_r=2, forget_r=2),
        )
        apply_lora(
            build_model(ModelConfig(preset="micro"), vocab_size=300), LoraConfig(enabled=True, r=2)
        )
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]
