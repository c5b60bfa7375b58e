"""The replayed policy forward: the same log-probs and gradients as the computed one."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from smollab.engine.replay import replay_logprobs, replay_unsupported  # noqa: E402
from smollab.engine.sampler import Sampler  # noqa: E402
from smollab.engine.token_logprobs import rollout_logprobs  # noqa: E402
from smollab.train.grpo.loss import LossOptions, grpo_loss  # noqa: E402
from tests.engine.test_sampler import PROMPTS, micro_llama  # noqa: E402
from tests.engine.test_token_logprobs import assert_grads_close  # noqa: E402


def _lora(model, dropout=0.0):
    from peft import LoraConfig, get_peft_model

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    cfg = LoraConfig(
        r=4, lora_alpha=8, target_modules=targets, lora_dropout=dropout, init_lora_weights=False
    )
    return get_peft_model(model, cfg)


def _loss_grads(model, r, logp_fn, temperature):
    model.zero_grad(set_to_none=True)
    logp = logp_fn(model, r, temperature)
    adv = torch.linspace(-1, 1, r.completion_ids.shape[0])
    ref = (r.logprobs - 0.1).detach()
    loss, _ = grpo_loss(
        logp,
        None,
        ref,
        adv,
        r.completion_mask,
        LossOptions(
            beta=0.05, epsilon=0.2, epsilon_high=0.2, loss_type="dapo", max_completion_length=16
        ),
    )
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), grads


@pytest.mark.parametrize("temperature", [1.0, 0.8])
@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("repeats", [1, 3])  # 3: each prompt runs once for its 3 completions
def test_replay_equals_the_computed_forward(lora, repeats, temperature):
    model = micro_llama(tie_word_embeddings=not lora)  # full fine-tuning trains a tied head
    if lora:
        model = _lora(model)
    assert replay_unsupported(model) is None
    prompts = [p for p in PROMPTS for _ in range(repeats)]  # left padding: lengths 2 to 5
    draw = Sampler(model, pad_token_id=0).generate(
        prompts, 12, temperature=temperature, seed=3, stop_at_eos=False
    )
    eos = int(draw.completion_ids[0, 4])  # the same draws end row 0 early at this "EOS"
    sampler = Sampler(model, eos_token_id=eos, pad_token_id=0)
    r = sampler.generate(prompts, 12, temperature=temperature, seed=3, record=True)
    assert r.record is not None and r.record.steps == r.completion_ids.shape[1] - 1
    assert r.completion_mask.sum() < r.completion_mask.numel()  # some rows end at EOS
    model.train()
    got, g_got = _loss_grads(model, r, replay_logprobs, temperature)
    want, g_want = _loss_grads(model, r, rollout_logprobs, temperature)
    m = r.completion_mask.bool()
    torch.testing.assert_close(got[m], want[m], atol=1e-5, rtol=1e-5)
    assert_grads_close(g_got, g_want, rel=3e-5)  # recorded values: rounding of another order


def test_record_leaves_the_samples_unchanged_and_is_optional():
    model = micro_llama()
    sampler = Sampler(model, eos_token_id=2, pad_token_id=0)
    a = sampler.generate(PROMPTS, 10, seed=5, record=True)
    b = sampler.generate(PROMPTS, 10, seed=5)
    assert b.record is None
    assert torch.equal(a.completion_ids, b.completion_ids)
    torch.testing.assert_close(a.logprobs, b.logprobs)
    assert sampler.generate(PROMPTS, 10, temperature=0, record=True).record is None  # greedy
    with pytest.raises(ValueError, match="record=True"):
        replay_logprobs(model, b, 1.0)


def test_replay_unsupported_names_the_reason():
    assert replay_unsupported(_lora(micro_llama(), dropout=0.1)) == "LoRA dropout"
    assert replay_unsupported(micro_llama(attention_dropout=0.1)) == "attention dropout"
    checkpointed = micro_llama()
    checkpointed.gradient_checkpointing_enable()
    assert replay_unsupported(checkpointed) == "activation checkpointing"


def test_replay_of_one_token_completions_runs_the_prompts_only():
    model = micro_llama(tie_word_embeddings=True)
    r = Sampler(model, eos_token_id=2, pad_token_id=0).generate(PROMPTS, 1, seed=3, record=True)
    assert r.record.steps == 0
    model.train()
    got, g_got = _loss_grads(model, r, replay_logprobs, 1.0)
    want, g_want = _loss_grads(model, r, rollout_logprobs, 1.0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert_grads_close(g_got, g_want, rel=3e-5)
