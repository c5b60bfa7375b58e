"""GRPO loss math against hand-computed values (numbers written out, not recomputed)."""

import math

import pytest
import torch

from smollab.errors import UserError
from smollab.train.grpo.loss import (
    CLIP_LOSSES,
    LOSS_TYPES,
    LossOptions,
    frac_reward_zero_std,
    group_advantages,
    grpo_loss,
    kl_k3,
)

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
    options = LossOptions(
        loss_type=loss_type, **{k: v for k, v in kwargs.items() if k != "num_items"}
    )
    loss, stats = grpo_loss(logp, None, None, adv, mask, options, kwargs.get("num_items"))
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    assert logp.grad.tolist() == [pytest.approx(row, abs=1e-6) for row in grad]
    assert stats["num_tokens"] == 3.0 and stats["ratio_mean"] == pytest.approx(1.0)
    assert stats["clip_region"] == 0.0 and "kl" not in stats


def test_dr_grpo_defaults_to_T_and_masked_rows():
    logp, adv, _ = _two_rows()
    # a truncated completion's row zeroed by the caller adds nothing; grpo still counts the row
    mask = torch.tensor([[1, 1], [0, 0]])
    assert grpo_loss(logp, None, None, adv, mask, LossOptions(loss_type="grpo"))[
        0
    ].item() == pytest.approx(-0.5)
    assert grpo_loss(logp, None, None, adv, mask, LossOptions(loss_type="bnpo"))[
        0
    ].item() == pytest.approx(-1.0)
    # max_completion_length None -> T = 2: -2 / (2 * 2)
    assert grpo_loss(logp, None, None, adv, mask, LossOptions(loss_type="dr_grpo"))[
        0
    ].item() == pytest.approx(-0.5)


def test_clipping_values_gradients_and_stats():
    # ratios 1.5, 1.5, 0.5, 0.5 (old logp 0) with A = +1, -1, +1, -1; eps 0.2
    logp = torch.tensor(
        [[math.log(1.5)], [math.log(1.5)], [math.log(0.5)], [math.log(0.5)]], requires_grad=True
    )
    old = torch.zeros(4, 1)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    mask = torch.ones(4, 1)
    loss, stats = grpo_loss(logp, old, None, adv, mask, LossOptions(epsilon=0.2, loss_type="bnpo"))
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
        logp, old, None, adv, mask, LossOptions(epsilon=0.2, epsilon_high=0.6, loss_type="bnpo")
    )
    assert loss.item() == pytest.approx((-1.5 + 1.5 - 0.5 + 0.8) / 4, abs=1e-6)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-0.375, 0.375, -0.125, 0.0], abs=1e-6)
    assert stats["clip_high"] == 0.0 and stats["clip_low"] == 0.25


def test_kl_penalty_value_gradient_and_stat():
    logp = torch.zeros(1, 2, requires_grad=True)
    ref = torch.tensor([[LN2, -LN2]])
    adv = torch.zeros(1)
    plain = LossOptions(beta=0.1, loss_type="bnpo", use_bias_correction_kl=False)
    loss, stats = grpo_loss(logp, None, ref, adv, torch.ones(1, 2), plain)
    # 0.1 * mean(0.30685282, 0.19314718) = 0.1 * 0.25
    assert loss.item() == pytest.approx(0.025, abs=1e-7)
    assert stats["kl"] == pytest.approx(0.25, abs=1e-6) and stats["policy_loss"] == 0.0
    loss.backward()
    # d/dlogp beta * (e^(ref-logp) - (ref-logp) - 1) = beta * (1 - e^(ref-logp)), / 2 tokens
    assert logp.grad.tolist() == [pytest.approx([-0.05, 0.025], abs=1e-6)]
    # TRL's default multiplies the term by w = exp(logp - sg(logp)): the value is the same on a
    # fresh batch, the gradient gains kl itself: beta * (1 - e^(ref-logp) + kl) / 2
    logp.grad = None
    loss, stats = grpo_loss(
        logp, None, ref, adv, torch.ones(1, 2), LossOptions(beta=0.1, loss_type="bnpo")
    )
    assert loss.item() == pytest.approx(0.025, abs=1e-7) and stats["kl"] == pytest.approx(0.25)
    loss.backward()
    assert logp.grad.tolist() == [pytest.approx([-0.05 * LN2, 0.05 * LN2], abs=1e-6)]
    # beta 0 with a reference: the KL is reported but not in the loss
    loss, stats = grpo_loss(logp, None, ref, adv, torch.ones(1, 2), LossOptions(beta=0.0))
    assert loss.item() == 0.0 and stats["kl"] == pytest.approx(0.25, abs=1e-6)


def test_masked_positions_do_not_matter():
    logp, adv, mask = _two_rows()
    other = logp.detach().clone()
    other[1, 1] = -40.0  # junk in the padded position
    other.requires_grad_(True)
    a, _ = grpo_loss(logp, logp.detach() + 0.1, None, adv, mask, LossOptions(loss_type="bnpo"))
    b, _ = grpo_loss(other, other.detach() + 0.1, None, adv, mask, LossOptions(loss_type="bnpo"))
    assert a.item() == pytest.approx(b.item())
    b.backward()
    assert other.grad[1, 1].item() == 0.0


def test_bad_arguments():
    logp, adv, mask = _two_rows()
    with pytest.raises(UserError, match="loss_type"):
        grpo_loss(logp, None, None, adv, mask, LossOptions(loss_type="ppo"))
    with pytest.raises(ValueError, match="beta > 0 needs ref_logp"):
        grpo_loss(logp, None, None, adv, mask, LossOptions(beta=0.1))
    with pytest.raises(ValueError, match="advantages shape"):
        grpo_loss(logp, None, None, adv[:1], mask)
    with pytest.raises(UserError, match="importance_sampling_level"):
        grpo_loss(logp, None, None, adv, mask, LossOptions(importance_sampling_level="group"))


def test_frac_reward_zero_std_counts_groups_whose_rewards_all_equal():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 1, 2, 3, 4])
    assert frac_reward_zero_std(r, 4) == 0.5  # groups 2 and 3 of 4
    # pairs [1,1] [0,1] [2,2] [2,2] [0,0] [0,0] [1,2] [3,4]: 5 of 8
    assert frac_reward_zero_std(r, 2) == 0.625
    assert frac_reward_zero_std(torch.tensor([1.0, 1.001]), 2) == 0.0


# Three completions, old log-probs 0 so logp is the log ratio d. Row 0: d = [ln 2, 0], A = +1;
# row 1: d = [ln 0.9, junk], one token, A = -1; row 2: d = [ln 1.21, 0], A = +1. epsilon 0.2.
def _three_rows(junk: float = 7.0):
    logp = torch.tensor(
        [[LN2, 0.0], [math.log(0.9), junk], [math.log(1.21), 0.0]], requires_grad=True
    )
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    return logp, torch.zeros(3, 2), torch.tensor([1.0, -1.0, 1.0]), mask


@pytest.mark.parametrize(
    "loss_type, expected, grad",
    [
        # GSPO weights exp(mean d): sqrt(2) = 1.41421356, 0.9, sqrt(1.21) = 1.1. Row 0: A > 0 and
        # w > 1.2, clipped: -1.2 per token, no gradient; row 1: -min(-0.9, -0.8) = 0.9; row 2:
        # -1.1. d(-A w)/d(d_t) = -A w / len: row 1 0.9, row 2 -0.55 per token.
        # grpo: mean of per-sequence means (-1.2 + 0.9 - 1.1) / 3; gradient / 3
        ("grpo", -1.4 / 3, [[0.0, 0.0], [0.3, 0.0], [-0.55 / 3, -0.55 / 3]]),
        # dapo: every token carries its sequence's loss, / 5 tokens: (-2.4 + 0.9 - 2.2) / 5;
        # row 2's two tokens both depend on each d_t: 2 * -0.55 / 5
        ("dapo", -0.74, [[0.0, 0.0], [0.18, 0.0], [-0.22, -0.22]]),
        # luspo: mean over sequences of their token sums, (-2.4 + 0.9 - 2.2) / 3
        ("luspo", -3.7 / 3, [[0.0, 0.0], [0.3, 0.0], [-1.1 / 3, -1.1 / 3]]),
    ],
)
def test_sequence_level_importance_sampling_hand_values(loss_type, expected, grad):
    logp, old, adv, mask = _three_rows()
    loss, stats = grpo_loss(
        logp,
        old,
        None,
        adv,
        mask,
        LossOptions(loss_type=loss_type, importance_sampling_level="sequence"),
    )
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    assert logp.grad.tolist() == [pytest.approx(row, abs=1e-6) for row in grad]
    # weight stats count sequences: row 0 clipped high, none low
    assert stats["clip_high"] == pytest.approx(1 / 3) and stats["clip_low"] == 0.0
    assert stats["ratio_mean"] == pytest.approx((1.41421356 + 0.9 + 1.1) / 3, abs=1e-6)
    assert stats["ratio_max"] == pytest.approx(1.41421356, abs=1e-6)
    assert stats["ratio_min"] == pytest.approx(0.9, abs=1e-6)


def test_sequence_level_differs_from_token_level_and_ignores_padding():
    # token level, grpo: row 0 w = [2, 1] -> [-1.2 (clipped), -1]; row 2 w = [1.21, 1] ->
    # [-1.2 (clipped), -1]; row 1 0.9: (-1.1 + 0.9 - 1.1) / 3; the unclipped tokens' gradient
    # -A * w / len / 3 rows: -1 / 2 / 3 and 0.9 / 3
    logp, old, adv, mask = _three_rows()
    loss, _ = grpo_loss(logp, old, None, adv, mask, LossOptions(loss_type="grpo"))
    assert loss.item() == pytest.approx(-1.3 / 3, abs=1e-6)
    loss.backward()
    assert logp.grad.tolist() == [
        pytest.approx(row, abs=1e-6) for row in [[0.0, -0.5 / 3], [0.3, 0.0], [0.0, -0.5 / 3]]
    ]
    # whatever the padded position holds, the sequence weight is the same
    a, b = _three_rows(40.0)[0], _three_rows(-40.0)[0]
    la, _ = grpo_loss(a, old, None, adv, mask, LossOptions(importance_sampling_level="sequence"))
    lb, _ = grpo_loss(b, old, None, adv, mask, LossOptions(importance_sampling_level="sequence"))
    assert la.item() == pytest.approx(lb.item())
    lb.backward()
    assert b.grad[1, 1].item() == 0.0


def test_delta_caps_the_unclipped_term():
    # ratio 3 (old logp 0), A = -1: -min(-3, -0.8 clipped) = 3 with gradient -A * w = 3;
    # delta 2 caps w at 2: loss 2, no gradient. A = +1 is clipped at 1.2 either way.
    for delta, expected, grad in ((None, 3.0, 3.0), (2.0, 2.0, 0.0)):
        logp = torch.tensor([[math.log(3.0)], [math.log(3.0)]], requires_grad=True)
        adv = torch.tensor([-1.0, 1.0])
        loss, _ = grpo_loss(
            logp, torch.zeros(2, 1), None, adv, torch.ones(2, 1), LossOptions(delta=delta)
        )
        assert loss.item() == pytest.approx((expected - 1.2) / 2, abs=1e-6)
        loss.backward()
        assert logp.grad.flatten().tolist() == pytest.approx([grad / 2, 0.0], abs=1e-6)


def _cispo_rows():
    # row 0: d = [ln 2, ln 0.5], A = +1; row 1: d = [ln 3, junk], A = -2; old logp 0
    logp = torch.tensor([[LN2, -LN2], [math.log(3.0), 9.0]], requires_grad=True)
    return logp, torch.zeros(2, 2), torch.tensor([1.0, -2.0]), torch.tensor([[1, 1], [1, 0]])


def test_cispo_hand_values():
    logp, old, adv, mask = _cispo_rows()
    loss, stats = grpo_loss(
        logp, old, None, adv, mask, LossOptions(loss_type="cispo", epsilon_high=1.5)
    )
    # weights min(w, 1.5), no gradient: 1.5, 0.5, 1.5. -w * A * logp:
    # -1.5 * 0.69314718 = -1.03972077, -0.5 * -0.69314718 = 0.34657359,
    # -1.5 * -2 * 1.09861229 = 3.29583687; dapo: / 3 tokens
    assert loss.item() == pytest.approx((-1.03972077 + 0.34657359 + 3.29583687) / 3, abs=1e-6)
    loss.backward()
    # -w * A / 3: the truncated tokens keep their gradient (the point of CISPO)
    assert logp.grad.tolist() == [
        pytest.approx([-0.5, -0.5 / 3], abs=1e-6),
        pytest.approx([1.0, 0.0], abs=1e-6),
    ]
    # TRL's cispo_clip_ratio: w above the cap with A > 0 (row 0 token 0 only)
    assert stats["clip_region"] == pytest.approx(1 / 3) and stats["clip_low"] == 0.0
    # epsilon_high unset: the cap is epsilon (TRL's fallback), 0.2 for every token
    logp.grad = None
    loss, _ = grpo_loss(logp, old, None, adv, mask, LossOptions(loss_type="cispo"))
    loss.backward()
    assert logp.grad.tolist() == [
        pytest.approx([-0.2 / 3, -0.2 / 3], abs=1e-6),
        pytest.approx([0.4 / 3, 0.0], abs=1e-6),
    ]


def test_sapo_hand_values():
    # row 0: d = [ln 2, 0], A = +1 (tau_pos 1); row 1: d = [ln 0.5, junk], A = -1 (tau_neg 1.05).
    # gate s(w) = sigmoid(tau (w - 1)) * 4 / tau; loss -s(w) * A, grpo aggregation
    logp = torch.tensor([[LN2, 0.0], [-LN2, 3.0]], requires_grad=True)
    adv, mask = torch.tensor([1.0, -1.0]), torch.tensor([[1, 1], [1, 0]])
    loss, stats = grpo_loss(logp, torch.zeros(2, 2), None, adv, mask, LossOptions(loss_type="sapo"))
    # s(2) = 4 * sigmoid(1) = 2.92423431, s(1) = 2: row 0 mean -2.46211716;
    # sigmoid(1.05 * -0.5) = 0.37168381, * 4 / 1.05 = 1.41593833: row 1 +1.41593833
    assert loss.item() == pytest.approx((-2.46211716 + 1.41593833) / 2, abs=1e-6)
    loss.backward()
    # ds/dd = 4 sigmoid (1 - sigmoid) * w (tau cancels): 1.57289547 at w 2, 1 at w 1,
    # 4 * 0.37168381 * 0.62831619 * 0.5 = 0.46706991 at w 0.5; times -A / 2 rows / len
    assert logp.grad.tolist() == [
        pytest.approx([-1.57289547 / 4, -1 / 4], abs=1e-6),
        pytest.approx([0.46706991 / 2, 0.0], abs=1e-6),
    ]
    assert stats["clip_region"] == 0.0
    # other temperatures: w = 1, tau 2 for A > 0: s = 2 / 2, loss -1 (value), gradient -1
    one = torch.zeros(1, 1, requires_grad=True)
    loss, _ = grpo_loss(
        one,
        torch.zeros(1, 1),
        None,
        torch.ones(1),
        torch.ones(1, 1),
        LossOptions(loss_type="sapo", sapo_temperature_pos=2.0),
    )
    assert loss.item() == pytest.approx(-1.0)
    loss.backward()
    assert one.grad.item() == pytest.approx(-1.0)


def test_vespo_hand_values():
    # logp -1 everywhere; d = logp - old. Row 0: d = [ln 2, 0], A = +1 (k 2, lambda 3):
    # W = 2, phi = e^(3 + 2 ln 2 - 6) = 4 e^-3 = 0.19914827. Row 1: d = [ln 0.5, junk], A = -1
    # (k 3, lambda 2): W = 0.5, phi = e^(2 + 3 ln 0.5 - 1) = e / 8 = 0.33978523. Row 2: d = 0,
    # A = +2: phi(1) = 1. Loss -phi * A * logp = phi * A per token, / 4 tokens (dapo).
    logp = torch.full((3, 2), -1.0, requires_grad=True)
    old = torch.tensor([[-1 - LN2, -1.0], [-1 + LN2, 5.0], [-1.0, -1.0]])
    adv, mask = torch.tensor([1.0, -1.0, 2.0]), torch.tensor([[1, 1], [1, 0], [1, 0]])
    loss, stats = grpo_loss(logp, old, None, adv, mask, LossOptions(loss_type="vespo"))
    assert loss.item() == pytest.approx((2 * 0.19914827 - 0.33978523 + 2) / 4, abs=1e-6)
    loss.backward()
    # phi is a constant: gradient -phi * A / 4
    assert logp.grad.tolist() == [
        pytest.approx([-0.19914827 / 4] * 2, abs=1e-6),
        pytest.approx([0.33978523 / 4, 0.0], abs=1e-6),
        pytest.approx([-0.5, 0.0], abs=1e-6),
    ]
    assert stats["vespo_phi_mean"] == pytest.approx((0.19914827 + 0.33978523 + 1) / 3, abs=1e-6)
    # other parameters, row 0: k_pos 1, lambda_pos 1: phi = e^(1 + ln 2 - 2) = 2 / e
    logp.grad = None
    loss, _ = grpo_loss(
        logp,
        old,
        None,
        adv,
        mask,
        LossOptions(loss_type="vespo", vespo_k_pos=1.0, vespo_lambda_pos=1.0),
    )
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-2 / math.e / 4] * 2, abs=1e-6)


def test_the_config_offers_these_loss_types():
    from typing import get_args

    from smollab.config import GRPOSection
    from smollab.config import grpo as config_rules

    assert set(get_args(GRPOSection.model_fields["loss_type"].annotation)) == set(LOSS_TYPES)
    assert config_rules._CLIP_LOSSES == CLIP_LOSSES
