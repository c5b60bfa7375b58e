"""GRPO loss math against hand-computed values (numbers written out, not recomputed)."""

import math

import pytest
import torch

from smollab.errors import UserError
from smollab.train.grpo_loss import group_advantages, grpo_loss, kl_k3

LN2 = math.log(2.0)


def test_group_advantages_each_scaling():
    r = torch.tensor([1.0, 3.0, 2.0, 2.0])  # groups [1, 3] (mean 2) and [2, 2] (mean 2)
    # centred: [-1, 1, 0, 0]; unbiased std of [1, 3] is sqrt(2), of [2, 2] is 0
    # group: +-1 / (1.41421356 + 1e-4) = +-0.70705678; the constant group stays 0
    got = group_advantages(r, 2, "group")
    assert got.tolist() == pytest.approx([-0.70705678, 0.70705678, 0.0, 0.0], abs=1e-6)
    # batch: unbiased std of [1, 3, 2, 2] is sqrt(2/3) = 0.81649658 -> +-1 / 0.81659658
    got = group_advantages(r, 2, "batch")
    assert got.tolist() == pytest.approx([-1.22459489, 1.22459489, 0.0, 0.0], abs=1e-6)
    assert group_advantages(r, 2, "none").tolist() == [-1.0, 1.0, 0.0, 0.0]
    # one group of 4: mean 2, same batch std
    assert group_advantages(r, 4, "group").tolist() == pytest.approx(
        [-1.22459489, 1.22459489, 0.0, 0.0], abs=1e-6
    )


def test_group_advantages_errors():
    with pytest.raises(UserError, match="scale_rewards"):
        group_advantages(torch.zeros(4), 2, "global")
    with pytest.raises(UserError, match="num_generations"):
        group_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError, match="groups"):
        group_advantages(torch.zeros(5), 2)


def test_kl_k3_hand_values_and_non_negative():
    logp = torch.zeros(3)
    ref = torch.tensor([LN2, -LN2, 0.0])
    # d = ref - logp: e^d - d - 1 = 2 - 0.693147 - 1, 0.5 + 0.693147 - 1, 0
    assert kl_k3(logp, ref).tolist() == pytest.approx([0.30685282, 0.19314718, 0.0], abs=1e-6)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(1000, generator=g) * 3, torch.randn(1000, generator=g) * 3
    assert (kl_k3(a, b) >= 0).all()


def _two_rows():
    # A = [1, -3]; row 0 has 2 tokens, row 1 has 1 (its 2nd position is padding with junk logp)
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 5.0]], requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    return logp, torch.tensor([1.0, -3.0]), mask


@pytest.mark.parametrize(
    "loss_type, kwargs, expected, grad",
    [
        # ratio 1 everywhere: per-token loss -A = [[-1, -1], [3, .]]; gradient -A / denominator
        ("grpo", {}, 1.0, [[-0.25, -0.25], [1.5, 0.0]]),  # ((-2)/2 + 3/1) / 2
        ("bnpo", {}, 1 / 3, [[-1 / 3, -1 / 3], [1.0, 0.0]]),  # (-2 + 3) / 3 tokens
        (
            "dr_grpo",
            {"max_completion_length": 4},
            0.125,
            [[-0.125, -0.125], [0.375, 0.0]],
        ),  # 1 / (2 * 4)
        ("dapo", {}, 1 / 3, [[-1 / 3, -1 / 3], [1.0, 0.0]]),  # one batch: the same as bnpo
        ("dapo", {"num_items": 10}, 0.1, [[-0.1, -0.1], [0.3, 0.0]]),  # global token count 10
    ],
)
def test_loss_types_hand_values(loss_type, kwargs, expected, grad):
    logp, adv, mask = _two_rows()
    loss, stats = grpo_loss(logp, None, None, adv, mask, loss_type=loss_type, **kwargs)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    assert logp.grad.tolist() == [pytest.approx(row, abs=1e-6) for row in grad]
    assert stats["num_tokens"] == 3.0 and stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["clip_region"] == 0.0 and "kl" not in stats


def test_dr_grpo_defaults_to_T_and_masked_rows():
    logp, adv, _ = _two_rows()
    # a truncated completion's row zeroed by the caller adds nothing; grpo still counts the row
    mask = torch.tensor([[1, 1], [0, 0]])
    assert grpo_loss(logp, None, None, adv, mask, loss_type="grpo")[0].item() == pytest.approx(-0.5)
    assert grpo_loss(logp, None, None, adv, mask, loss_type="bnpo")[0].item() == pytest.approx(-1.0)
    # max_completion_length None -> T = 2: -2 / (2 * 2)
    assert grpo_loss(logp, None, None, adv, mask, loss_type="dr_grpo")[0].item() == pytest.approx(
        -0.5
    )


def test_clipping_values_gradients_and_stats():
    # ratios 1.5, 1.5, 0.5, 0.5 (old logp 0) with A = +1, -1, +1, -1; eps 0.2
    logp = torch.tensor(
        [[math.log(1.5)], [math.log(1.5)], [math.log(0.5)], [math.log(0.5)]], requires_grad=True
    )
    old = torch.zeros(4, 1)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    mask = torch.ones(4, 1)
    loss, stats = grpo_loss(logp, old, None, adv, mask, epsilon=0.2, loss_type="bnpo")
    # per token: -min(1.5, 1.2) = -1.2 (clipped), -min(-1.5, -1.2) = 1.5, -min(.5, .8) = -0.5,
    # -min(-.5, -.8) = 0.8 (clipped): mean 0.6 / 4
    assert loss.item() == pytest.approx(0.15, abs=1e-6)
    loss.backward()
    # clipped tokens get no gradient; the others -ratio * A / 4
    assert logp.grad.flatten().tolist() == pytest.approx([0.0, 0.375, -0.125, 0.0], abs=1e-6)
    assert stats["clip_low"] == 0.25 and stats["clip_high"] == 0.25 and stats["clip_region"] == 0.5
    assert stats["ratio_mean"] == pytest.approx(1.0) and stats["ratio_max"] == pytest.approx(1.5)
    assert stats["ratio_min"] == pytest.approx(0.5)

    # epsilon_high 0.6: ratio 1.5 < 1.6 is no longer clipped for A > 0
    logp.grad = None
    loss, stats = grpo_loss(
        logp, old, None, adv, mask, epsilon=0.2, epsilon_high=0.6, loss_type="bnpo"
    )
    assert loss.item() == pytest.approx((-1.5 + 1.5 - 0.5 + 0.8) / 4, abs=1e-6)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-0.375, 0.375, -0.125, 0.0], abs=1e-6)
    assert stats["clip_high"] == 0.0 and stats["clip_low"] == 0.25


def test_kl_penalty_value_gradient_and_stat():
    logp = torch.zeros(1, 2, requires_grad=True)
    ref = torch.tensor([[LN2, -LN2]])
    adv = torch.zeros(1)
    loss, stats = grpo_loss(logp, None, ref, adv, torch.ones(1, 2), beta=0.1, loss_type="bnpo")
    # 0.1 * mean(0.30685282, 0.19314718) = 0.1 * 0.25
    assert loss.item() == pytest.approx(0.025, abs=1e-7)
    assert stats["kl"] == pytest.approx(0.25, abs=1e-6) and stats["policy_loss"] == 0.0
    loss.backward()
    # d/dlogp beta * (e^(ref-logp) - (ref-logp) - 1) = beta * (1 - e^(ref-logp)), / 2 tokens
    assert logp.grad.tolist() == [pytest.approx([-0.05, 0.025], abs=1e-6)]
    # beta 0 with a reference: the KL is reported but not in the loss
    loss, stats = grpo_loss(logp, None, ref, adv, torch.ones(1, 2), beta=0.0)
    assert loss.item() == 0.0 and stats["kl"] == pytest.approx(0.25, abs=1e-6)


def test_masked_positions_do_not_matter():
    logp, adv, mask = _two_rows()
    other = logp.detach().clone()
    other[1, 1] = -40.0  # junk in the padded position
    other.requires_grad_(True)
    a, _ = grpo_loss(logp, logp.detach() + 0.1, None, adv, mask, loss_type="bnpo")
    b, _ = grpo_loss(other, other.detach() + 0.1, None, adv, mask, loss_type="bnpo")
    assert a.item() == pytest.approx(b.item())
    b.backward()
    assert other.grad[1, 1].item() == 0.0


def test_bad_arguments():
    logp, adv, mask = _two_rows()
    with pytest.raises(UserError, match="loss_type"):
        grpo_loss(logp, None, None, adv, mask, loss_type="ppo")
    with pytest.raises(ValueError, match="beta > 0 needs ref_logp"):
        grpo_loss(logp, None, None, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="advantages shape"):
        grpo_loss(logp, None, None, adv[:1], mask)
