"""TRL 1.16 as the oracle: its own `GRPOTrainer._compute_loss` on the same tensors as
`grpo_loss`, loss, gradient and logged metrics, in float64, for every loss type x importance level
x beta x use_bias_correction_kl x the entropy, off-policy and clipping settings.

The trainer is built without `__init__` (no model, no dataset, no training): only the attributes
`_compute_loss` reads, and its per-token log-prob function patched to return the given log-probs
and entropies, so a formula changed on either side fails here.
"""

from __future__ import annotations

import itertools
import zlib
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from smollab.train.grpo.loss import (
    LOSS_TYPES,
    EntropyControl,
    LossOptions,
    frac_reward_zero_std,
    grpo_loss,
    multi_objective_advantages,
)

N, T = 6, 5


@pytest.fixture(scope="module")
def trl_trainer():
    """A bare GRPOTrainer of TRL 1.16 whose `_compute_loss` runs on given tensors."""
    from accelerate import Accelerator
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir="unused", use_cpu=True, report_to=[], steps_per_generation=1)
    trainer = GRPOTrainer.__new__(GRPOTrainer)
    trainer.args = args
    trainer.accelerator = Accelerator(cpu=True)
    trainer.model = SimpleNamespace(training=True)
    trainer.current_gradient_accumulation_steps = 1
    trainer.use_vllm = False
    trainer.vllm_importance_sampling_correction = False
    trainer.aux_loss_enabled = False
    return trainer


def _trl(trainer, o: LossOptions, inputs: dict, entropy_coef: float = 0.0, adaptive=None):
    """Configure the bare trainer as `o` says, run `_compute_loss`, return (loss, metrics)."""
    eps_high = o.epsilon if o.epsilon_high is None else o.epsilon_high
    a = trainer.args
    a.use_bias_correction_kl, a.delta = o.use_bias_correction_kl, o.delta
    a.sapo_temperature_pos, a.sapo_temperature_neg = o.sapo_temperature_pos, o.sapo_temperature_neg
    a.vespo_k_pos, a.vespo_lambda_pos = o.vespo_k_pos, o.vespo_lambda_pos
    a.vespo_k_neg, a.vespo_lambda_neg = o.vespo_k_neg, o.vespo_lambda_neg
    t = trainer
    t.loss_type, t.beta, t.epsilon_low, t.epsilon_high = o.loss_type, o.beta, o.epsilon, eps_high
    t.importance_sampling_level = o.importance_sampling_level
    t.max_completion_length = o.max_completion_length
    t.top_entropy_quantile = o.top_entropy_quantile
    t.off_policy_mask_threshold = o.off_policy_mask_threshold
    t.entropy_coef = entropy_coef
    t.use_adaptive_entropy = adaptive is not None
    if adaptive is not None:
        a.entropy_target, a.entropy_coef_delta = adaptive.target, adaptive.delta
        a.entropy_coef_min, a.entropy_coef_max = adaptive.low, adaptive.high
    t._entropy_bonus_enabled = entropy_coef != 0.0 or adaptive is not None
    t._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    logp, entropies = inputs.pop("_logp"), inputs.pop("_entropies")
    t._get_per_token_logps_and_entropies = lambda *args, **kw: (logp, entropies, None)
    loss = t._compute_loss(None, inputs)
    return loss, {k: v[-1] for k, v in t._metrics["train"].items()}


def _inputs(logp, entropies, adv, mask) -> dict:
    """What TRL's `_compute_loss` reads of a batch (ids unused: the log-probs are patched in)."""
    return {
        "prompt_ids": torch.zeros(N, 1, dtype=torch.long),
        "prompt_mask": torch.ones(N, 1, dtype=torch.long),
        "completion_ids": torch.zeros(N, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": adv,
        "num_items_in_batch": mask.sum(),
        "_logp": logp,
        "_entropies": entropies,
    }


def _tensors(seed: int, fresh: bool):
    g = torch.Generator().manual_seed(seed)
    d = torch.float64
    logp = (-torch.rand(N, T, generator=g, dtype=d) * 3).requires_grad_(True)
    old = None if fresh else logp.detach() + 0.3 * torch.randn(N, T, generator=g, dtype=d)
    ref = logp.detach() + 0.2 * torch.randn(N, T, generator=g, dtype=d)
    entropies = (torch.rand(N, T, generator=g, dtype=d) * 2).requires_grad_(True)
    adv = torch.randn(N, generator=g, dtype=d)
    mask = torch.ones(N, T, dtype=d)
    mask[1, 3:] = 0
    mask[4, 1:] = 0
    mask[5, :] = 0  # a completion with no loss token (masked as truncated)
    return logp, old, ref, entropies, adv, mask


def _options(loss_type, level, beta, bias, extra) -> LossOptions:
    kw = dict(
        loss_type=loss_type,
        beta=beta,
        importance_sampling_level=level,
        use_bias_correction_kl=bias,
        max_completion_length=T + 2,
    )
    if loss_type == "cispo":
        kw["epsilon_high"] = 1.5
        extra.pop("epsilon_high", None), extra.pop("delta", None)
    elif loss_type in ("grpo", "bnpo", "dr_grpo", "dapo", "luspo"):
        kw.update(epsilon=0.2, epsilon_high=extra.pop("epsilon_high", None))
        kw["delta"] = extra.pop("delta", None)
    else:
        extra.pop("epsilon_high", None), extra.pop("delta", None)
    return LossOptions(**kw, **extra)


# (name, LossOptions extras, entropy_coef, fresh batch)
SETTINGS = [
    ("fresh", {}, 0.0, True),
    ("reused", {"epsilon_high": 0.28}, 0.0, False),
    ("delta", {"delta": 1.4}, 0.0, False),
    ("off-policy mask", {"off_policy_mask_threshold": 0.05}, 0.0, False),
    ("top entropy", {"top_entropy_quantile": 0.4}, 0.0, False),
    ("entropy bonus", {}, 0.03, True),
    ("all", {"top_entropy_quantile": 0.5, "off_policy_mask_threshold": 0.02}, 0.01, False),
]
CASES = [
    (lt, level, beta, bias, s)
    for lt, level, beta, bias, s in itertools.product(
        LOSS_TYPES, ("token", "sequence"), (0.0, 0.04), (True, False), SETTINGS
    )
    if not (lt == "vespo" and level == "sequence") and not (beta == 0.0 and not bias)
]
# metric names: TRL's -> grpo_loss's
METRICS = {
    "kl": "kl",
    "entropy": "entropy",
    "clip_ratio/low_mean": "clip_low",
    "clip_ratio/high_mean": "clip_high",
    "clip_ratio/region_mean": "clip_region",
    "clip_ratio/low_min": "clip_low_min",
    "clip_ratio/high_max": "clip_high_max",
    "cispo_clip_ratio": "clip_high",
    "vespo/phi_seq_mean": "vespo_phi_mean",
}


@pytest.mark.parametrize(("loss_type", "level", "beta", "bias", "setting"), CASES)
def test_loss_gradient_and_metrics_equal_trls(trl_trainer, loss_type, level, beta, bias, setting):
    name, extra, coef, fresh = setting
    o = _options(loss_type, level, beta, bias, dict(extra))
    seed = zlib.crc32(repr((loss_type, level, beta, bias, name)).encode())
    logp, old, ref, entropies, adv, mask = _tensors(seed, fresh)
    ours, stats = grpo_loss(logp, old, ref if beta else None, adv, mask, o, None, entropies, coef)
    ours.backward()
    ours_grads = logp.grad.clone(), entropies.grad.clone() if coef else None
    logp.grad = entropies.grad = None
    inputs = _inputs(logp, entropies, adv, mask)
    if old is not None:
        inputs["old_per_token_logps"] = old
    if beta:
        inputs["ref_per_token_logps"] = ref
    theirs, metrics = _trl(trl_trainer, o, inputs, coef)
    theirs.backward()
    assert ours.dtype == torch.float64
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-12, abs=1e-14)
    torch.testing.assert_close(ours_grads[0], logp.grad, rtol=1e-10, atol=1e-13)
    if coef:
        torch.testing.assert_close(ours_grads[1], entropies.grad, rtol=1e-10, atol=1e-13)
    assert metrics, "TRL logged nothing"
    for key, value in metrics.items():
        if key in ("policy_loss", "entropy_coef"):
            continue
        assert stats[METRICS[key]] == pytest.approx(value, rel=1e-6, abs=1e-7, nan_ok=True), key


def test_adaptive_entropy_control_follows_trls(trl_trainer):
    """Five optimizer steps of adaptive entropy control: the coefficient each step applies, the
    one it moves to, and so the loss, as TRL's controller (which keeps its state on the trainer)."""
    ctrl = EntropyControl(coef=0.02, adaptive=True, target=0.9, delta=0.01, low=0.0, high=0.025)
    trl_trainer._last_world_entropy, trl_trainer._entropy_window_stats = float("inf"), None
    trl_coef = ctrl.coef
    o = LossOptions(loss_type="dapo")
    for step in range(5):
        logp, _, _, entropies, adv, mask = _tensors(100 + step, True)
        entropies = (entropies * (0.4 + 0.3 * step)).detach().requires_grad_(True)
        ours, stats = grpo_loss(logp, None, None, adv, mask, o, None, entropies, ctrl.applied())
        ctrl.update(stats["entropy_sum"] / stats["entropy_tokens"])
        inputs = _inputs(logp, entropies, adv, mask)
        theirs, metrics = _trl(trl_trainer, o, inputs, trl_coef, adaptive=ctrl)
        trl_coef = trl_trainer.entropy_coef
        assert ours.item() == pytest.approx(theirs.item(), rel=1e-12)
        assert ctrl.coef == pytest.approx(metrics["entropy_coef"], rel=1e-12)
        assert ctrl.last == pytest.approx(trl_trainer._last_world_entropy, rel=1e-6)
    assert ctrl.coef not in (0.02, 0.025)  # it moved both ways


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
def test_advantages_and_frac_reward_zero_std_equal_trls(trl_trainer, scale_rewards, aggregation):
    """TRL's `_generate_and_score_completions` (generation and rewards patched to given values)
    against `multi_objective_advantages` and `frac_reward_zero_std`: the advantages it hands the
    loss and the frac_reward_zero_std it logs."""
    G, prompts = 4, 3
    g = torch.Generator().manual_seed(7)
    per_fn = torch.randint(0, 3, (G * prompts, 2), generator=g).double()
    per_fn[:G] = torch.tensor([1.0, 2.0])  # a group whose rewards all equal
    weights = torch.tensor([1.0, 0.5], dtype=torch.float64)
    t = trl_trainer
    t.model = SimpleNamespace(training=True, is_gradient_checkpointing=False)
    for key, value in dict(
        environment_factories=None,
        tools=None,
        environments=None,
        mask_truncated_completions=False,
        pad_to_multiple_of=None,
        num_iterations=1,
        beta=0.0,
        num_generations=G,
        scale_rewards=scale_rewards,
        multi_objective_aggregation=aggregation,
        reward_weights=weights,
        reward_func_names=["a", "b"],
        reward_funcs=[None, None],
        log_multimodal=False,
        _tokenizer=SimpleNamespace(pad_token_id=0),
        _logs={"prompt": [], "completion": [], "rewards": defaultdict(list), "advantages": []},
        _pending_extra_logs={},
        _pending_metrics={},
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    ).items():
        setattr(t, key, value)
    t.args.gradient_accumulation_steps = 1
    n = G * prompts
    t._generate = lambda prompts: (
        [[1]] * n,
        [[2, 3]] * n,
        None,
        ["x"] * n,
        None,
        {},
        None,
        None,
    )
    t._calculate_rewards = lambda *a: per_fn
    out = t._generate_and_score_completions([{"prompt": "p"}] * n)
    ours, zero = multi_objective_advantages(per_fn, weights, G, scale_rewards, aggregation)
    torch.testing.assert_close(ours, out["advantages"].double(), rtol=1e-6, atol=1e-6)
    assert zero == pytest.approx(t._metrics["train"]["frac_reward_zero_std"][-1])
    if aggregation == "sum_then_normalize":
        total = (per_fn * weights).sum(1)
        assert frac_reward_zero_std(total, G, scale_rewards) == pytest.approx(zero)


@pytest.mark.parametrize("loss_type", ["dapo", "cispo", "vespo"])
def test_several_steps_per_generation_normalize_as_trls(trl_trainer, loss_type):
    """steps_per_generation = 3: TRL's num_items spans the generated batch and is divided by the
    optimizer steps it serves; `grpo_loss` takes that quotient as its `num_items`."""
    o = _options(loss_type, "token", 0.04, True, {"epsilon_high": 0.28})
    logp, old, ref, entropies, adv, mask = _tensors(11, False)
    generated = 3 * float(mask.sum()) + 7.0  # the other steps' rows hold other lengths
    ours, _ = grpo_loss(logp, old, ref, adv, mask, o, generated / 3)
    inputs = _inputs(logp, entropies, adv, mask)
    inputs.update(
        old_per_token_logps=old,
        ref_per_token_logps=ref,
        num_items_in_batch=torch.tensor(generated, dtype=torch.float64),
    )
    trl_trainer.args.steps_per_generation = 3
    try:
        theirs, _ = _trl(trl_trainer, o, inputs)
    finally:
        trl_trainer.args.steps_per_generation = 1
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-12)
