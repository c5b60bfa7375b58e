"""The static decode step: the same tokens, log-probs and decode record as the eager step (lean,
each Hub family, lanes), through torch.compile once, and which decode `auto` picks."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from smollab.engine.lean_llama import LeanLlama  # noqa: E402
from smollab.engine.sampler import Sampler  # noqa: E402
from smollab.engine.static_decode import choose_decode  # noqa: E402
from tests.engine.test_lane_llama import lane_policies, lanes_for  # noqa: E402
from tests.engine.test_sampler import micro_llama  # noqa: E402

# left padding, different lengths, a repeated prompt (its prefill shared), an EOS-prone model
PROMPTS = [[1, 5, 6, 7, 8], [1, 9], [1, 10, 11], [1, 5, 6, 7, 8], [1, 12, 13, 14], [1, 9]]
RECORDED = ("qkv", "gu", "x_attn", "x_mlp", "probs")


def rollouts(model, decodes, prompts=PROMPTS, seed=3, **kw):
    """{decode: its Rollout} of one seed's draws of `prompts` (8 new tokens, recorded)."""
    kw = {"record": True, "temperature": 1.0, **kw}
    out = {}
    for d in decodes:
        sampler = Sampler(model, eos_token_id=2, decode=d)
        out[d] = sampler.generate(prompts, 8, seed=seed, **kw)
    return out


def assert_same_rollout(a, b) -> None:
    """The same tokens and masks, log-probs and records equal to float rounding."""
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.completion_mask, b.completion_mask)
    torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
    if a.record is None:
        assert b.record is None
        return
    assert a.record.steps == b.record.steps
    steps = a.record.steps  # columns written: the rest is uninitialized
    for name in RECORDED:
        got, want = getattr(b.record, name), getattr(a.record, name)
        if name == "probs":
            got, want = got[: steps + 1], want[: steps + 1]
        else:
            got, want = got[:, :steps], want[:, :steps]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", [3, 4])
def test_static_draws_what_eager_draws(seed):
    r = rollouts(micro_llama(), ("eager", "static"), seed=seed)
    assert r["eager"].completion_mask.sum() > 0
    assert_same_rollout(r["eager"], r["static"])


def test_static_stops_at_eos_like_eager_and_reuses_a_longer_cache():
    model = micro_llama()
    sampler = Sampler(model, eos_token_id=2, decode="static")
    long = sampler.generate(PROMPTS, 30, seed=1, stop_at_eos=False)  # a 48-slot cache
    assert sampler._cache.max_len == 48  # bucketed to 16 slots
    short = sampler.generate(PROMPTS, 8, seed=5, record=True)  # reads the longer cache
    eager = Sampler(model, eos_token_id=2, decode="eager").generate(PROMPTS, 8, seed=5, record=True)
    assert long.completion_ids.shape[1] == 30
    assert_same_rollout(eager, short)


@pytest.mark.parametrize("kw", [{"temperature": 0.0}, {"top_k": 5}, {"repetition_penalty": 1.3}])
def test_static_matches_eager_with_every_draw(kw):
    r = rollouts(micro_llama(), ("eager", "static"), **kw)
    assert_same_rollout(r["eager"], r["static"])


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3", "smollm3"])  # biases, q/k norm, NoPE
def test_static_matches_eager_on_the_families(replicas, family):
    model = transformers.AutoModelForCausalLM.from_pretrained(
        replicas(family), dtype=torch.float32
    ).eval()
    r = rollouts(LeanLlama.from_hf(model), ("eager", "static"))
    assert_same_rollout(r["eager"], r["static"])


def test_static_lanes_draw_what_eager_lanes_draw():
    lanes = lanes_for(lane_policies())
    prompts = PROMPTS[:4] * 3  # lane-major: 4 rows a lane
    r = rollouts(lanes, ("eager", "static"), prompts=prompts, seed=[3, 4, 5])
    assert_same_rollout(r["eager"], r["static"])


def test_compiled_draws_what_eager_draws_and_a_nearby_prompt_length_reuses_its_graph():
    from torch._dynamo.utils import counters

    model = micro_llama()
    r = rollouts(model, ("eager", "compiled"))
    assert_same_rollout(r["eager"], r["compiled"])
    graphs = counters["stats"]["unique_graphs"]
    sampler = Sampler(model, eos_token_id=2, decode="compiled")
    longer = [[1, 3, *p] for p in PROMPTS]  # 2 more slots: the same 16-slot bucket
    sampler.generate(longer, 8, seed=3, record=True)
    assert counters["stats"]["unique_graphs"] == graphs


def test_auto_is_the_measured_best_and_says_why():
    assert choose_decode("auto", torch.device("cpu"))[0] == "eager"
    assert "measured" in choose_decode("auto", torch.device("cpu"))[1]
    assert choose_decode("static", torch.device("cpu")) == ("static", "decode=static as configured")
    sampler = Sampler(micro_llama(), eos_token_id=2)
    decode, reason = choose_decode("auto", torch.device("cpu"))
    assert sampler.decode == decode
    assert sampler.decode_reason == f"{reason}; {sampler.lean.head_reason(decode)}"
    with pytest.raises(ValueError, match="decode must be one of auto, eager, static, compiled"):
        Sampler(micro_llama(), eos_token_id=2, decode="graphs")
