"""LaneLlama: each lane computes what its own policy computes (logits, decode, gradients), for
LoRA lanes on one base and for full lanes."""

from __future__ import annotations

import copy

import pytest
import torch

peft = pytest.importorskip("peft")

from smollab.engine.lane_llama import LaneLlama  # noqa: E402
from smollab.engine.lean_llama import LeanLlama, positions_from_mask  # noqa: E402
from smollab.engine.sampler import Sampler  # noqa: E402
from smollab.engine.token_logprobs import logprobs  # noqa: E402
from tests.engine.test_lean_llama import batch, micro_llama  # noqa: E402

TOL = 1e-5
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lane_policies(ranks=(2, 4, 4), targets=TARGETS):
    """PEFT policies on one base, each with its own random (non-zero) adapter."""
    base = micro_llama(tie=False)
    out = []
    for i, r in enumerate(ranks):
        cfg = peft.LoraConfig(r=r, lora_alpha=2.0 * r + i, target_modules=targets)
        policy = peft.get_peft_model(copy.deepcopy(base), cfg)
        g = torch.Generator().manual_seed(10 + i)
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        out.append(policy)
    return out


def full_policies(n: int = 3, tie: bool = True):
    """Full policies of one architecture, each its own perturbation of one base (norms too)."""
    base = micro_llama(tie=tie)
    return [perturbed(copy.deepcopy(base), 20 + i) for i in range(n)]


def perturbed(policy, seed: int):
    """`policy` with every parameter moved by its own noise (norms, biases and all)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return policy


def assert_lanes_logits(lanes: LaneLlama, policies, ids, mask, tol: float) -> None:
    """Each lane's logits of the left-padded batch (ids, mask) are its HF policy's."""
    N, real = len(policies), mask.bool()
    with torch.inference_mode():
        ours = lanes(ids.repeat(N, 1), mask.repeat(N, 1)).view(N, *ids.shape, -1)
        for lane, policy in enumerate(policies):
            ref = policy(
                input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)
            ).logits
            torch.testing.assert_close(ours[lane][real], ref[real], atol=tol, rtol=0)


def lanes_for(policies) -> LaneLlama:
    lanes = LaneLlama.from_hf(policies[0], adapters=False)
    with torch.no_grad():
        lanes.load_lanes(policies)
    return lanes


@pytest.mark.parametrize("targets", [TARGETS, ["q_proj", "v_proj", "down_proj"]])
def test_each_lane_gets_its_policys_logits(targets):
    policies = lane_policies(targets=targets)
    lanes = lanes_for(policies)
    ids, mask = batch()
    N = len(policies)
    with torch.inference_mode():
        ours = lanes(ids.repeat(N, 1), mask.repeat(N, 1)).view(N, *ids.shape, -1)
        real = mask.bool()
        for lane, policy in enumerate(policies):
            ref = policy(
                input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask)
            ).logits
            torch.testing.assert_close(ours[lane][real], ref[real], atol=TOL, rtol=0)
        base = LeanLlama.hidden(lanes, ids, mask)  # the inherited forward is the bare base
        with policies[0].disable_adapter():
            ref = (
                policies[0]
                .get_base_model()
                .model(input_ids=ids, attention_mask=mask, position_ids=positions_from_mask(mask))
                .last_hidden_state
            )
        weight = policies[0].get_base_model().model.norm.weight
        torch.testing.assert_close((base * weight)[real], ref[real], atol=TOL, rtol=0)


def test_lanes_decode_like_each_policy_alone():
    policies = lane_policies()
    lanes = lanes_for(policies)
    prompts = [[5, 6, 7], [9, 10], [11, 12, 13, 14]]
    together = Sampler(lanes, eos_token_id=2).generate(prompts * len(policies), 6, temperature=0)
    for lane, policy in enumerate(policies):
        alone = Sampler(LeanLlama.from_hf(policy), eos_token_id=2).generate(
            prompts, 6, temperature=0
        )
        rows = slice(lane * len(prompts), (lane + 1) * len(prompts))
        assert torch.equal(together.completion_ids[rows], alone.completion_ids)
        torch.testing.assert_close(together.logprobs[rows], alone.logprobs, atol=TOL, rtol=0)


def test_each_lanes_gradient_is_its_own():
    """A summed loss over the lanes gives each adapter the gradient of its own loss alone."""
    policies = lane_policies()
    alone = [copy.deepcopy(p) for p in policies]
    lanes = LaneLlama.from_hf(policies[0], adapters=False)
    ids, mask = batch()
    N, P = len(policies), 5  # every row has a prompt token (row 0 is padded up to 4)
    weights = torch.randn(
        N, ids.shape[0], ids.shape[1] - P, generator=torch.Generator().manual_seed(3)
    )
    lanes.load_lanes(policies)  # with grad
    lp = logprobs(lanes, ids.repeat(N, 1), mask.repeat(N, 1), P, 0.7, share_prompts=False)
    (lp.view(N, *weights.shape[1:]) * weights).sum().backward()
    for lane, policy in enumerate(alone):
        ref = logprobs(policy, ids, mask, P, 0.7, share_prompts=False)
        (ref * weights[lane]).sum().backward()
        got = dict(policies[lane].named_parameters())
        n = 0
        for name, p in policy.named_parameters():
            if p.requires_grad:
                torch.testing.assert_close(got[name].grad, p.grad, atol=1e-4, rtol=1e-4)
                n += 1
        assert n == 2 * len(TARGETS) * 2  # A and B of every target in both layers
        assert all(
            p.grad is None for name, p in policies[lane].named_parameters() if not p.requires_grad
        )


def test_a_seed_per_lane_draws_what_each_lane_alone_would():
    lean = LeanLlama.from_hf(micro_llama())
    prompts = [[5, 6, 7], [9, 10]]
    both = Sampler(lean, eos_token_id=2).generate(prompts * 2, 6, seed=[3, 5])
    for block, seed in enumerate((3, 5)):
        alone = Sampler(lean, eos_token_id=2).generate(prompts, 6, seed=seed)
        assert torch.equal(both.completion_ids[2 * block : 2 * block + 2], alone.completion_ids)


def test_a_lane_of_nan_logits_draws_in_range_and_leaves_the_others_alone():
    """A diverged lane's NaN logits must not crash the shared draw (nor change other rows)."""
    from smollab.engine.token_draw import TokenDraw

    logits = torch.randn(4, 256, generator=torch.Generator().manual_seed(0))
    bad = logits.clone()
    bad[2:] = float("nan")
    for V in (256, 200):  # the two-level and the one-level CDF
        draw = TokenDraw(1.0, 0, 1.0, [torch.Generator().manual_seed(1)] * 2, 4, "cpu")
        tok, lp = draw(bad[:, :V])
        assert ((tok >= 0) & (tok < V)).all() and lp[2:].isnan().all()
        ok = TokenDraw(1.0, 0, 1.0, [torch.Generator().manual_seed(1)] * 2, 4, "cpu")
        assert torch.equal(ok(logits[:, :V])[0][:2], tok[:2])


@pytest.mark.parametrize("tie", [True, False])
def test_full_lanes_compute_each_policys_logits_decode_and_gradients(tie):
    """Full lanes (every weight the lane's own, tied embeddings or not): each lane's logits and
    greedy decode are its policy's, and a summed loss gives each policy its own gradient of
    every parameter (norms and embeddings included)."""
    policies = full_policies(tie=tie)
    alone = [copy.deepcopy(p) for p in policies]
    lanes = lanes_for(policies)
    ids, mask = batch()
    N = len(policies)
    assert_lanes_logits(lanes, policies, ids, mask, TOL)
    prompts = [[5, 6, 7], [9, 10], [11, 12, 13, 14]]
    together = Sampler(lanes, eos_token_id=2).generate(prompts * N, 6, temperature=0)
    P = 5
    weights = torch.randn(
        N, ids.shape[0], ids.shape[1] - P, generator=torch.Generator().manual_seed(3)
    )
    lanes.load_lanes(policies)  # with grad
    lp = logprobs(lanes, ids.repeat(N, 1), mask.repeat(N, 1), P, 0.7, share_prompts=False)
    (lp.view(N, *weights.shape[1:]) * weights).sum().backward()
    for lane, policy in enumerate(alone):
        solo = Sampler(LeanLlama.from_hf(policy), eos_token_id=2).generate(
            prompts, 6, temperature=0
        )
        assert torch.equal(together.completion_ids[lane * 3 : lane * 3 + 3], solo.completion_ids)
        (logprobs(policy, ids, mask, P, 0.7, share_prompts=False) * weights[lane]).sum().backward()
        got = dict(policies[lane].named_parameters())
        for name, p in policy.named_parameters():
            assert got[name].grad.abs().sum() > 0, name
            torch.testing.assert_close(got[name].grad, p.grad, atol=1e-4, rtol=1e-4)


def test_lanes_are_all_lora_or_all_full():
    with pytest.raises(ValueError, match="not a mix"):
        lanes_for([*lane_policies(ranks=(2,)), *full_policies(1)])


@pytest.mark.parametrize("kind", ["lora", "lora-some", "full"])
def test_the_lanes_replay_gives_the_computed_forwards_gradients(kind):
    """Replayed from the decode record, or computed with each lane's distinct prompts run once,
    each lane's gradients are those of the plain computed forward through the lanes (and so of
    its policy alone): with LoRA on every projection, or on some
    (fused weights the lanes leave to the base), or full lanes (each lane's every weight), rows
    ending early at EOS included."""
    from smollab.engine.replay import lanes_logprobs

    targets = ["q_proj", "v_proj", "down_proj"] if kind == "lora-some" else TARGETS
    policies = full_policies() if kind == "full" else lane_policies(targets=targets)
    lanes = lanes_for(policies)
    a, b, c = [5, 6, 7], [9, 10], [11, 12, 13, 14]
    prompts = [a, a, b, a, b, c, c, c, c]  # lanes repeat prompts differently (shared per lane)
    N = len(policies)
    # 36: an id these lanes draw early in some rows, so completions end at different steps
    r = Sampler(lanes, eos_token_id=36).generate(
        prompts, 7, temperature=1.5, seed=[1, 2, 3], record=True
    )
    assert r.record is not None
    assert r.completion_lengths.min() < 7 and r.completion_lengths.max() == 7
    weights = torch.randn(r.completion_ids.shape, generator=torch.Generator().manual_seed(4))
    grads, record = [], r.record
    for mode in ("replayed", "computed, prompts once per lane", "computed"):
        for p in policies:
            p.zero_grad(set_to_none=True)
        lanes.load_lanes(policies)  # with grad
        r.record = record if mode == "replayed" else None
        if mode != "computed":
            lp = lanes_logprobs(lanes, r, 1.5)
        else:
            lp = logprobs(
                lanes,
                r.input_ids,
                r.attention_mask,
                r.prompt_ids.shape[1],
                1.5,
                share_prompts=False,
            )
        real = r.completion_mask.bool()
        torch.testing.assert_close(lp[real], r.logprobs[real], atol=TOL, rtol=0)
        (lp * weights * r.completion_mask).sum().backward()
        grads.append(
            [p.grad.clone() for pol in policies for p in pol.parameters() if p.requires_grad]
        )
    per_lane = len(list(policies[0].parameters())) if kind == "full" else 2 * len(targets) * 2
    assert len(grads[0]) == N * per_lane
    for got, *want in zip(*grads, strict=True):
        assert got.abs().sum() > 0
        for other in want:
            torch.testing.assert_close(got, other, atol=1e-5, rtol=1e-4)
