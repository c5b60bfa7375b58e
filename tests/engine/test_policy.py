"""The policy log-prob entry point: replay once from a record, then compute; why not replay."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from smollab.engine.policy import policy_logprobs, replay_blocker  # noqa: E402
from smollab.engine.sampler import Sampler  # noqa: E402
from smollab.engine.token_logprobs import rollout_logprobs  # noqa: E402
from tests.engine.test_sampler import PROMPTS, micro_gpt2, micro_llama  # noqa: E402


def test_a_record_is_replayed_once_then_released():
    model = micro_llama()
    sampler = Sampler(model, eos_token_id=2, pad_token_id=0)
    r = sampler.generate(PROMPTS * 2, 6, seed=0, record=True)
    assert r.record is not None
    replayed = policy_logprobs(model, r, 1.0)
    assert r.record is None  # the graph holds what the backward needs
    computed = policy_logprobs(model, r, 1.0)
    torch.testing.assert_close(replayed, computed, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(computed, rollout_logprobs(model, r, 1.0))


def test_replay_blocker_names_the_reason():
    model = micro_llama()
    lean = Sampler(model, eos_token_id=2, pad_token_id=0)
    kw = dict(batch_size=8, max_new_tokens=6)
    assert replay_blocker(model, lean, enabled=True, autocast=False, **kw) is None
    assert replay_blocker(model, lean, enabled=False, autocast=False, **kw) == "grpo.replay=false"
    assert replay_blocker(model, lean, enabled=True, autocast=True, **kw) == "autocast"
    hf = Sampler(micro_gpt2(), eos_token_id=2, pad_token_id=0)
    why = replay_blocker(model, hf, enabled=False, autocast=False, **kw)  # said first
    assert why.startswith("HF sampler: LeanLlama reads model_type 'llama'") and "not 'gpt2'" in why
    huge = dict(batch_size=1 << 16, max_new_tokens=64)
    assert "over the budget" in replay_blocker(model, lean, enabled=True, autocast=False, **huge)


def test_the_record_budget_grows_with_the_model(monkeypatch):
    """A record may hold as many numbers as the weights (a 0.5B model's 16 x 64 record replays),
    never less than the floor."""
    import smollab.engine.policy as policy_mod
    from smollab.engine.decode_record import DecodeRecord

    model = micro_llama()
    lean = Sampler(model, eos_token_id=2, pad_token_id=0)
    weights = sum(p.numel() for p in model.parameters())
    monkeypatch.setattr(policy_mod, "RECORD_BUDGET_ELEMS", 1)  # the weights decide

    def rows_within(limit: int) -> int:
        b = 1
        while DecodeRecord.elements(lean.lean, 2 * b, 6) <= limit:
            b *= 2
        return b

    fits, over = rows_within(weights), 2 * rows_within(weights)
    assert (
        replay_blocker(model, lean, enabled=True, autocast=False, batch_size=fits, max_new_tokens=6)
        is None
    )
    why = replay_blocker(
        model, lean, enabled=True, autocast=False, batch_size=over, max_new_tokens=6
    )
    assert f"over the budget of {weights:,}" in why
