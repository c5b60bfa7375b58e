"""GRPO with gradient accumulation (`train.grad_accum`): the micro-batched loss and backward give
the one-batch gradient, update and stats for every loss type; routing's masks follow the micro-
batches; `smollab grpo` runs with it; gradient checkpointing trains LoRA adapters."""

from __future__ import annotations

import functools

import pytest
import torch

from smollab.config import LoraConfig, ModelConfig, RoutingConfig
from smollab.config.load import load_config
from smollab.engine.sampler import Sampler
from smollab.errors import UserError
from smollab.models.loading import apply_lora, build_model, load_tokenizer_near
from smollab.models.routing import apply_routing
from smollab.rundir.rows import read_metrics
from smollab.train.grpo.loss import LOSS_TYPES, LossOptions
from smollab.train.grpo.policies import policy_forward
from smollab.train.grpo.routing import Router
from smollab.train.grpo.run import train
from smollab.train.grpo.update import Batch, RunRows, loss_backward, micro_batches

GROUPS, GEN, LEN = 4, 3, 10  # 12 completions: 1, 2 or 4 micro-batches of whole groups
LR = 1e-3
STATS = (
    "policy_loss",
    "kl",
    "clip_low",
    "clip_high",
    "clip_region",
    "ratio_mean",
    "ratio_min",
    "ratio_max",
    "advantage_mean",
    "num_tokens",
)


def _policy(micro_model, wrap=None):
    torch.manual_seed(0)
    model = build_model(ModelConfig(path=str(micro_model)))
    return wrap(model) if wrap else model


def _batch(policy, micro_model):
    """A rollout of GROUPS prompts x GEN completions, with made-up old and reference log-probs
    (so ratios leave 1 and clipping acts), advantages, and a mask of varied lengths."""
    tok = load_tokenizer_near(micro_model / "checkpoints" / "final")
    texts = ["Once upon a time", "The dog", "A girl named", "In the"]
    prompts = [tok(t)["input_ids"] for t in texts for _ in range(GEN)]
    eos = tok.eos_token_id
    r = Sampler(policy, eos_token_id=eos, pad_token_id=eos).generate(prompts, LEN, seed=3)
    g = torch.Generator().manual_seed(1)
    old = r.logprobs + 0.3 * torch.randn(r.logprobs.shape, generator=g)
    ref = r.logprobs + 0.2 * torch.randn(r.logprobs.shape, generator=g)
    adv = torch.randn(GROUPS * GEN, generator=g)
    mask = r.completion_mask.clone()
    for i in range(mask.shape[0]):  # lengths that differ (the micro model seldom ends early),
        mask[i, 2 + (5 * i) % (LEN - 2) :] = 0  # so a per-token and a per-sequence mean differ
    mask[1] = 0  # a masked-out (truncated) completion: zero tokens in its micro-batch row
    return r, adv, mask, old, ref


def _options(loss_type: str, level: str = "token") -> LossOptions:
    eps_high = 1.1 if loss_type == "cispo" else 0.28  # cispo: a cap some weights pass
    return LossOptions(
        beta=0.05,
        epsilon=0.2,
        epsilon_high=eps_high,
        loss_type=loss_type,
        max_completion_length=LEN,
        importance_sampling_level=level,
    )


def _step(policy, batch, accum, options, train_pass=None):
    """One optimizer step of `accum` micro-batches from fresh weights: (loss, stats, grads,
    updated weights)."""
    start = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    trainable = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=LR)
    policy.zero_grad(set_to_none=True)
    r, adv, mask, old, ref = batch
    tp = None if train_pass is None else functools.partial(train_pass, adv)
    [(loss, stats)] = loss_backward(
        policy_forward(policy, 1.0),
        Batch(r, adv, mask, old, ref),
        [RunRows(slice(0, GROUPS * GEN), options)],
        num_generations=GEN,
        grad_accum=accum,
        train_pass=tp,
    )
    grads = [p.grad.clone() for p in trainable]
    opt.step()
    after = [p.detach().clone() for p in trainable]
    policy.load_state_dict(start)
    return loss, stats, grads, after


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_micro_batches_give_the_one_batch_step_for_every_loss_type(micro_model, level):
    policy = _policy(micro_model)
    batch = _batch(policy, micro_model)
    policy.train()
    for loss_type in LOSS_TYPES:
        if loss_type == "vespo" and level == "sequence":
            continue  # refused by the config: vespo's weight is per sequence already
        options = _options(loss_type, level)
        loss1, stats1, grads1, after1 = _step(policy, batch, 1, options)
        assert any(g.abs().sum() > 0 for g in grads1), loss_type
        for accum in (2, 4):
            loss, stats, grads, after = _step(policy, batch, accum, options)
            what = f"{loss_type} {level} grad_accum={accum}"
            assert loss == pytest.approx(loss1, rel=1e-5, abs=1e-7), what
            for key in STATS:
                assert stats[key] == pytest.approx(stats1[key], rel=1e-5, abs=1e-7), (what, key)
            for g, g1 in zip(grads, grads1, strict=True):
                torch.testing.assert_close(g, g1, rtol=1e-4, atol=1e-7, msg=what)
            for w, w1 in zip(after, after1, strict=True):  # Adam's first step is about
                # lr * g / (|g| + 1e-8): on gradients near 1e-8 rounding moves it by ~1e-6
                torch.testing.assert_close(w, w1, rtol=1e-5, atol=1e-2 * LR, msg=what)
        # the metrics really move with the clipping: a wrong merge would show
        assert stats1["clip_region"] > 0 or loss_type in ("sapo", "vespo"), loss_type


def test_routing_masks_follow_the_micro_batches(micro_model):
    cfg = RoutingConfig(enabled=True, mode="exclusive", retain_r=2, forget_r=2)
    policy = _policy(micro_model, lambda m: apply_routing(m, cfg))
    batch = _batch(policy, micro_model)
    router = Router(cfg, seed=0, rewards=[])
    router.routed = torch.tensor([i % 5 == 0 for i in range(GROUPS * GEN)])  # rows 0, 5, 10

    def train_pass(advantages, rows):
        return router.passes(policy, 1, advantages, rows)

    policy.train()
    _, _, grads1, _ = _step(policy, batch, 1, _options("dapo"), train_pass)
    _, _, grads2, _ = _step(policy, batch, 2, _options("dapo"), train_pass)
    for g, g1 in zip(grads2, grads1, strict=True):
        torch.testing.assert_close(g, g1, rtol=1e-4, atol=1e-7)
    # and the masks did act: without them the forget adapter learns from every row
    router.routed = torch.zeros(GROUPS * GEN, dtype=torch.bool)
    _, _, unrouted, _ = _step(policy, batch, 2, _options("dapo"), train_pass)
    assert any(not torch.allclose(g, u) for g, u in zip(grads1, unrouted, strict=True))


def test_grad_accum_must_split_the_batch_into_whole_groups(micro_grpo):
    with pytest.raises(
        UserError, match=r"^config: train.grad_accum=3 must divide the 2 prompt groups"
    ):
        load_config("grpo", None, [*micro_grpo, "train.grad_accum=3"])
    with pytest.raises(UserError, match="micro-batches of whole groups"):
        micro_batches(12, 3, 3)
    assert micro_batches(12, 3, 2) == [slice(0, 6), slice(6, 12)]


def test_grpo_end_to_end_with_grad_accum(micro_grpo, tmp_path):
    """Step 1 (same rollout, same weights) agrees with the one-batch run; replay is off under
    accumulation, with the reason in the log."""
    rows = {}
    for accum in (1, 2):
        out = tmp_path / f"a{accum}"
        summary = train(
            load_config(
                "grpo",
                None,
                [
                    *micro_grpo,
                    f"train.grad_accum={accum}",
                    "train.max_steps=3",
                    "grpo.replay=false" if accum == 1 else "grpo.replay=true",
                    "grpo.beta=0.04",
                    "train.eval_interval=100",
                    f"run.dir={out}",
                ],
            )
        )
        assert summary["status"] == "completed" and summary["steps"] == 3
        rows[accum] = read_metrics(out / "metrics.csv")
        log = (out / "training.log").read_text()
    assert "policy forward computed (train.grad_accum=2 (micro-batches))" in log
    one, two = rows[1][0], rows[2][0]
    assert one["reward_mean"] == two["reward_mean"]
    for key in ("loss", "kl", "grad_norm", "clip_frac"):
        assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-7), key
    assert all(r["grad_norm"] > 0 for r in rows[2])


def test_gradient_checkpointing_trains_lora(micro_model, micro_grpo, tmp_path):
    """LoRA under activation checkpointing: the same loss and non-zero adapter gradients as
    without it on the same batch, and a `smollab grpo` run trains the adapters."""
    lora = LoraConfig(enabled=True, r=4)
    policy = _policy(micro_model, lambda m: apply_lora(m, lora))
    batch = _batch(policy, micro_model)
    with torch.no_grad():  # B starts at 0, which would leave A without gradient
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    policy.train()
    loss0, _, grads0, _ = _step(policy, batch, 1, _options("dapo"))
    policy.activation_checkpointing_enable()
    loss1, _, grads1, _ = _step(policy, batch, 2, _options("dapo"))
    assert loss1 == pytest.approx(loss0, rel=1e-5)
    assert all(g.abs().sum() > 0 for g in grads1)
    for g, g0 in zip(grads1, grads0, strict=True):
        torch.testing.assert_close(g, g0, rtol=1e-4, atol=1e-7)

    out = tmp_path / "ckpt"
    summary = train(
        load_config(
            "grpo",
            None,
            [
                *micro_grpo,
                "model.lora.enabled=true",
                "model.lora.r=4",
                "perf.grad_checkpointing=true",
                "train.grad_accum=2",
                "train.max_steps=2",
                "train.eval_interval=100",
                f"run.dir={out}",
            ],
        )
    )
    assert summary["status"] == "completed"
    assert all(r["grad_norm"] > 0 for r in read_metrics(out / "metrics.csv"))
    assert "activation checkpointing" in (out / "training.log").read_text()


@pytest.mark.parametrize("mode", ["classic", "exclusive"])
def test_penalty_passes_give_each_adapter_its_own_advantages_gradient(micro_model, mode):
    """retain_advantage=penalty against gradients taken by hand: retain's is the gradient of the
    plain GRPO loss on the penalized rewards' advantages over every row, forget's that of the
    loss on the full-group advantages over every row (classic) or over the flagged rows,
    weighted by their share (exclusive), as small-rl's separate passes take them; the same in
    two micro-batches."""
    from smollab.train.grpo.loss import group_advantages, grpo_loss

    cfg = RoutingConfig(
        enabled=True,
        mode=mode,
        retain_r=2,
        forget_r=2,
        retain_advantage="penalty",
        retain_penalty=0.7,
    )
    policy = _policy(micro_model, lambda m: apply_routing(m, cfg))
    r, _, mask, old, ref = _batch(policy, micro_model)
    router = Router(cfg, seed=0, rewards=[])
    flagged = torch.tensor([i % 5 == 0 for i in range(GROUPS * GEN)])  # rows 0, 5, 10
    router.routed = flagged
    total = torch.rand(GROUPS * GEN, generator=torch.Generator().manual_seed(4))
    full = group_advantages(total, GEN, "group")
    assert torch.equal(router.advantages(total, full, GEN, "group"), full)
    penalized = group_advantages(total - 0.7 * flagged.float(), GEN, "group")
    torch.testing.assert_close(router.retain_advantages, penalized)

    def train_pass(advantages, rows):
        return router.passes(policy, 1, advantages, rows)

    options = _options("grpo")
    policy.train()
    names = [n for n, p in policy.named_parameters() if p.requires_grad]
    trainable = [p for p in policy.parameters() if p.requires_grad]
    by_hand = dict.fromkeys(names)
    every = torch.ones(GROUPS * GEN, dtype=torch.bool)
    forget_rows = flagged if mode == "exclusive" else every
    for which, advantages, rows in (("retain", penalized, every), ("forget", full, forget_rows)):
        logp, _ = policy_forward(policy, 1.0)(r, False)
        loss, _ = grpo_loss(logp[rows], old[rows], ref[rows], advantages[rows], mask[rows], options)
        loss = loss * float(rows.sum()) / (GROUPS * GEN)  # a subset's share of the rows
        mine = [(n, p) for n, p in zip(names, trainable, strict=True) if f".{which}." in n]
        grads = torch.autograd.grad(loss, [p for _, p in mine])
        by_hand.update({n: g for (n, _), g in zip(mine, grads, strict=True)})
    assert all(g is not None for g in by_hand.values())
    with torch.no_grad():
        logp, _ = policy_forward(policy, 1.0)(r, False)
    for accum in (1, 2):
        loss, stats, grads, _ = _step(policy, (r, full, mask, old, ref), accum, options, train_pass)
        for n, g in zip(names, grads, strict=True):
            torch.testing.assert_close(g, by_hand[n], rtol=1e-4, atol=1e-7, msg=f"{n} {accum}")
        # the reported loss is the forget pass's: the full-group loss over every row
        full_loss, _ = grpo_loss(logp, old, ref, full, mask, options)
        assert loss == pytest.approx(float(full_loss), rel=1e-5)
