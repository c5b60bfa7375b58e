"""The lean engine on every Hub family it reads (offline replicas, loaded in fp32): logits, greedy
decode, the replayed backward, LoRA, and lanes, each equal to HF's own."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from smollab.engine.lane_llama import LaneLlama  # noqa: E402
from smollab.engine.lean_llama import LeanLlama, positions_from_mask  # noqa: E402
from smollab.engine.replay import lanes_logprobs, replay_logprobs  # noqa: E402
from smollab.engine.rollout import left_pad  # noqa: E402
from smollab.engine.sampler import Sampler  # noqa: E402
from smollab.engine.token_logprobs import logprobs, rollout_logprobs  # noqa: E402
from tests.engine.test_lane_llama import assert_lanes_logits, perturbed  # noqa: E402
from tests.engine.test_lean_llama import batch as lean_batch  # noqa: E402
from tests.engine.test_replay import _loss_grads  # noqa: E402
from tests.engine.test_sampler import micro_llama  # noqa: E402
from tests.engine.test_token_logprobs import assert_grads_close  # noqa: E402
from tests.replicas import FAMILIES  # noqa: E402

# The replicas' logits reach +-30 (unit-variance embeddings, a tied head): fp32 rounding of
# another summation order is about 1e-6 of that.
TOL = 1e-4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPTS = [[40, 41, 42, 43, 44], [50, 51], [60, 61, 62], [70, 71, 72, 73]]


def load(path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def batch():
    return lean_batch(vocab=900)  # ids the replicas' tokenizers have


def with_lora(model, r: int = 4, seed: int = 0):
    """A PEFT model of `model` with LoRA on every linear, its adapters random (not zero)."""
    cfg = peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=TARGETS)
    policy = peft.get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return policy


@pytest.mark.parametrize("family", FAMILIES)
def test_lean_logits_equal_hf_full_padded_and_incremental(replica_dir, family):
    hf = load(replica_dir)
    lean = LeanLlama.from_hf(hf)
    ids, mask = batch()
    B, L = ids.shape
    pos = positions_from_mask(mask)
    real = mask.bool()
    with torch.inference_mode():
        torch.testing.assert_close(lean(ids), hf(ids).logits, atol=TOL, rtol=0)
        full = lean(ids, mask)
        ref = hf(ids, attention_mask=mask, position_ids=pos).logits
        torch.testing.assert_close(full[real], ref[real], atol=TOL, rtol=0)
        for row in range(B):  # a padded row scores like the same row unpadded
            n = int(mask[row].sum())
            alone = hf(ids[row : row + 1, -n:]).logits[0]
            torch.testing.assert_close(full[row, -n:], alone, atol=TOL, rtol=0)
        cache = lean.new_cache(B, L)
        first = lean(ids[:, :6], mask[:, :6], cache=cache, logits_to_keep=1)
        torch.testing.assert_close(first[:, 0], full[:, 5], atol=TOL, rtol=0)
        for t in range(6, 8):  # the sampler's hot path
            cos, sin = lean.rope(pos[:, t])
            step = lean.decode(ids[:, t], cos[:, None], sin[:, None], cache, t)
            torch.testing.assert_close(step, ref[:, t], atol=TOL, rtol=0)
        chunk = lean(ids[:, 8:], mask, cache=cache, cache_pos=8)
        torch.testing.assert_close(chunk, ref[:, 8:], atol=TOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_decode_equals_hf_generate(replica_dir, family):
    hf = load(replica_dir)
    eos = hf.generation_config.eos_token_id
    pad = hf.generation_config.pad_token_id
    pad = pad if pad is not None else (eos[0] if isinstance(eos, list) else eos)
    sampler = Sampler(hf, pad_token_id=pad)
    assert sampler.backend == "lean" and sampler.hf_reason is None
    r = sampler.generate(PROMPTS, 16, temperature=0)
    ids, mask = left_pad(PROMPTS, pad)
    with torch.inference_mode():
        out = hf.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=16,
            repetition_penalty=1.0,  # the replicas' generation configs set some
            pad_token_id=pad,
            eos_token_id=eos,
        )
    want = out[:, ids.shape[1] :]
    assert len(set(want.flatten().tolist())) > 4  # not one token over and over
    assert torch.equal(r.completion_ids, want)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("family", FAMILIES)
def test_replayed_gradients_equal_autograd(replica_dir, family, lora):
    """Full fine-tuning (every weight, biases, q/k norms and the tied head) or LoRA on all
    seven linears: the replayed backward gives the computed forward's log-probs and gradients,
    with shared prompts, left padding and rows ending at EOS."""
    model = load(replica_dir)
    if lora:
        model = with_lora(model)
    prompts = [p for p in PROMPTS for _ in range(2)]
    draw = Sampler(model, pad_token_id=0).generate(prompts, 10, seed=3, stop_at_eos=False)
    eos = int(draw.completion_ids[0, 4])  # the same draws end row 0 early at this "EOS"
    r = Sampler(model, eos_token_id=eos, pad_token_id=0).generate(prompts, 10, seed=3, record=True)
    assert r.record is not None and r.completion_mask.sum() < r.completion_mask.numel()
    model.train()
    got, g_got = _loss_grads(model, r, replay_logprobs, 1.0)
    want, g_want = _loss_grads(model, r, rollout_logprobs, 1.0)
    m = r.completion_mask.bool()
    torch.testing.assert_close(got[m], want[m], atol=1e-5, rtol=1e-5)
    assert_grads_close(g_got, g_want, rel=3e-5)
    if not lora:  # the family's own parameters are trained
        named = "".join(g_got)
        assert ("q_proj.bias" in named) == (family == "qwen2.5")
        assert ("q_norm" in named) == (family == "qwen3")


@pytest.mark.parametrize("family", FAMILIES)
def test_peft_lora_merge_and_adapters_off_match(replica_dir, family):
    base = load(replica_dir)
    pristine = copy.deepcopy(base)
    model = with_lora(base).eval()
    ids, mask = batch()
    pos = positions_from_mask(mask)
    real = mask.bool()
    with torch.inference_mode():
        want = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        base_want = pristine(ids, attention_mask=mask, position_ids=pos).logits
        assert (want - base_want).abs().max() > 1e-2  # the adapters do something
        lean = LeanLlama.from_hf(model)
        torch.testing.assert_close(lean(ids, mask)[real], want[real], atol=TOL, rtol=0)
        off = LeanLlama.from_hf(model, adapters=False)
        torch.testing.assert_close(off(ids, mask)[real], base_want[real], atol=TOL, rtol=0)
        model.merge_adapter()  # merged into the base weights: not added twice
        try:
            lean.load_from_hf(model)
            torch.testing.assert_close(lean(ids, mask)[real], want[real], atol=TOL, rtol=0)
        finally:
            model.unmerge_adapter()


def _lane_policies(path, kind: str, n: int = 2):
    """n policies of one base: LoRA on every linear (each its own adapter), or full copies each
    perturbed (biases and q/k norms too)."""
    base = load(path)
    if kind == "lora":
        return [with_lora(copy.deepcopy(base), r=2 + 2 * i, seed=10 + i) for i in range(n)]
    return [perturbed(copy.deepcopy(base), 20 + i) for i in range(n)]


@pytest.mark.parametrize("kind", ["lora", "full"])
@pytest.mark.parametrize("family", FAMILIES)
def test_lanes_logits_and_gradients_equal_each_policy_alone(replica_dir, family, kind):
    """Each lane's logits are its HF policy's, and its gradients, replayed from the lanes'
    decode, are those of its policy alone through HF's computed forward."""
    policies = _lane_policies(replica_dir, kind)
    alone = [copy.deepcopy(p) for p in policies]
    N = len(policies)
    lanes = LaneLlama.from_hf(policies[0], adapters=False)
    with torch.no_grad():
        lanes.load_lanes(policies)
    assert_lanes_logits(lanes, policies, *batch(), TOL)

    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[2], PROMPTS[3]]
    r = Sampler(lanes, eos_token_id=0).generate(prompts, 6, seed=[1, 2], record=True)
    assert r.record is not None
    weights = torch.randn(r.completion_ids.shape, generator=torch.Generator().manual_seed(4))
    lanes.load_lanes(policies)  # with grad
    lp = lanes_logprobs(lanes, r, 1.0)
    real = r.completion_mask.bool()
    torch.testing.assert_close(lp[real], r.logprobs[real], atol=1e-5, rtol=0)
    (lp * weights * r.completion_mask).sum().backward()
    b, P = len(prompts) // N, r.prompt_ids.shape[1]
    for lane, policy in enumerate(alone):
        rows = slice(lane * b, (lane + 1) * b)
        want = logprobs(policy, r.input_ids[rows], r.attention_mask[rows], P, 1.0)
        (want * weights[rows] * r.completion_mask[rows]).sum().backward()
        got = dict(policies[lane].named_parameters())
        grads = {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}
        assert grads and all(got[n].grad is not None for n in grads)
        assert_grads_close({n: got[n].grad for n in grads}, grads, rel=1e-4)


def _rel(got: dict, want: dict) -> float:
    """|got - want| / |want| over all the gradients together."""
    num = sum(float(((got[n].float() - w.float()) ** 2).sum()) for n, w in want.items())
    return (num / sum(float((w.float() ** 2).sum()) for w in want.values())) ** 0.5


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3", "smollm3"])
def test_a_bf16_policy_samples_and_replays_in_bf16(replicas, family):
    """A policy held in bf16 (model.dtype=bf16, as published) gets a bf16 lean copy, KV cache and
    decode record, and a bf16 lean reference. Its replayed log-probs and gradients are finite
    and as close to the fp32 computation (the same weights upcast) as HF's own bf16 autograd is,
    and close to that autograd."""
    from smollab.engine.reference import build_reference

    model = load(replicas(family), dtype=torch.bfloat16)
    exact = load(replicas(family))  # the same bf16-stored weights, in fp32
    sampler = Sampler(model, pad_token_id=0)
    assert sampler.lean.embed.dtype == torch.bfloat16
    prompts = [p for p in PROMPTS for _ in range(2)]
    r = sampler.generate(prompts, 8, seed=3, stop_at_eos=False, record=True)
    assert r.record.qkv.dtype == r.record.x_mlp.dtype == sampler._cache.dtype == torch.bfloat16
    model.train()
    exact.train()
    got, g_got = _loss_grads(model, r, replay_logprobs, 1.0)
    want, g_want = _loss_grads(model, r, rollout_logprobs, 1.0)
    ref, g_ref = _loss_grads(exact, r, rollout_logprobs, 1.0)
    assert torch.isfinite(got).all() and all(torch.isfinite(g).all() for g in g_got.values())
    assert g_got.keys() == g_want.keys() == g_ref.keys()
    # bf16 logits of +-30 are rounded to 1/8: both are off by a few hundredths on average
    assert (got - ref).abs().mean() < 2 * (want - ref).abs().mean() + 0.01
    assert _rel(g_got, g_ref) < 2 * _rel(g_want, g_ref) + 0.01
    assert _rel(g_got, g_want) < 0.1
    with torch.inference_mode():
        reference = build_reference(model, lora=False, on_cpu=False)
        assert (reference(r, 1.0) - ref).abs().mean() < 2 * (want - ref).abs().mean() + 0.01


def test_a_bf16_lora_base_runs_lanes_in_bf16(replicas):
    """fp32 adapters on a bf16 base: the lanes compute in the base's dtype (the adapters cast),
    their logits as close to the fp32 ones as each PEFT policy's own bf16 forward is."""
    base = load(replicas("qwen2.5"), dtype=torch.bfloat16)
    policies = [with_lora(copy.deepcopy(base), r=2, seed=s) for s in (1, 2)]
    lanes = LaneLlama.from_hf(policies[0], adapters=False)
    ids, mask = batch()
    pos, real = positions_from_mask(mask), mask.bool()
    with torch.inference_mode():
        lanes.load_lanes(policies)
        assert lanes.embed.dtype == lanes._lane_layers[0][0][0].dtype == torch.bfloat16
        ours = lanes(ids.repeat(2, 1), mask.repeat(2, 1)).view(2, *ids.shape, -1).float()
        for lane, policy in enumerate(policies):
            theirs = policy(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()
            exact = copy.deepcopy(policy).float()
            want = exact(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            err = (ours[lane] - want)[real].abs().mean()
            assert err < 2 * (theirs - want)[real].abs().mean() + 0.01
    r = Sampler(lanes, eos_token_id=0).generate(PROMPTS * 2, 6, temperature=0)
    assert r.completion_ids.shape == (8, 6)


# ---- what the lean engine refuses, and the RoPE types it reads -------------------------------


ROPES = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
}


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_rope_types_fixed_at_init_match_hf(rope):
    """Scaled RoPE whose frequencies transformers fixes at init (yarn's attention factor on cos
    and sin included) gives HF's logits; a bias on every linear too (attention_bias, mlp_bias)."""
    hf = micro_llama(
        rope_parameters={"rope_theta": 500.0, **ROPES[rope]}, attention_bias=True, mlp_bias=True
    )
    with torch.no_grad():  # HF initializes biases to zero: give them values
        for name, p in hf.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.3)
    lean = LeanLlama.from_hf(hf)
    assert not lean.spec.plain and lean.bqkv is not None and lean.bd is not None
    ids, mask = lean_batch()
    pos = positions_from_mask(mask)
    with torch.inference_mode():
        want = hf(ids, attention_mask=mask, position_ids=pos).logits
        real = mask.bool()
        torch.testing.assert_close(lean(ids, mask)[real], want[real], atol=1e-5, rtol=0)


def test_a_plain_llama_holds_no_extras():
    """The families' extras exist only where a model has them: a plain Llama's lean copy has no
    biases, q/k norms or NoPE layers, so its forward runs the same ops as before."""
    lean = LeanLlama.from_hf(micro_llama())
    assert lean.spec.plain
    assert all(t is None for t in (lean.bqkv, lean.bo, lean.bgu, lean.bd, lean.qk_norm))
    assert all(b == (None,) * 4 for b in lean._biases)
    assert lean._heads == [(None, True)] * 2


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        (
            lambda: micro_llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0}).config,
            "dynamic",
        ),
        (
            lambda: transformers.Qwen2Config(
                num_hidden_layers=4, use_sliding_window=True, sliding_window=8, max_window_layers=2
            ),
            r"layers \[2, 3\] are 'sliding_attention' \(sliding_window=8\)",
        ),
        (
            lambda: transformers.SmolLM3Config(
                num_hidden_layers=4, use_sliding_window=True, sliding_window=8
            ),
            r"layers \[3\] are 'sliding_attention'",
        ),
        (lambda: transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2), "not 'gpt2'"),
        (lambda: micro_llama(hidden_act="gelu").config, "hidden_act"),
    ],
    ids=["dynamic-rope", "qwen2-sliding", "smollm3-sliding", "gpt2", "gelu"],
)
def test_what_the_lean_engine_refuses_in_one_line(config, reason):
    from smollab.engine.lean_config import check_lean_compatible

    with pytest.raises(NotImplementedError, match=reason) as err:
        check_lean_compatible(config())
    assert "\n" not in str(err.value)


def test_qwen2_sliding_window_set_but_off_is_read():
    """Qwen2.5 publishes sliding_window=32768 with use_sliding_window=false: no layer slides,
    so the lean engine reads it; an HF sampler says why it samples in the log line's words."""
    from smollab.engine.lean_config import check_lean_compatible
    from smollab.engine.policy import replay_blocker

    cfg = transformers.Qwen2Config(
        num_hidden_layers=2, use_sliding_window=False, sliding_window=32768, max_window_layers=1
    )
    check_lean_compatible(cfg)
    hf = micro_llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0})
    sampler = Sampler(hf, eos_token_id=2, pad_token_id=0)
    assert sampler.backend == "hf" and "dynamic" in sampler.hf_reason
    why = replay_blocker(hf, sampler, enabled=True, autocast=False, batch_size=4, max_new_tokens=4)
    assert why.startswith("HF sampler: LeanLlama does not implement rope_type='dynamic'")


def test_a_large_lora_policy_is_its_own_reference(replicas, monkeypatch):
    """Past the size where a lean copy saves time, a LoRA policy's KL reference is the policy with
    its adapters off: no copy is built, and its log-probs equal the lean copy's."""
    import smollab.engine.reference as reference

    policy = with_lora(load(replicas("qwen2.5")), r=4, seed=1)
    r = Sampler(policy, pad_token_id=0).generate(PROMPTS, 8, seed=3, stop_at_eos=False)
    with torch.inference_mode():
        copied = reference.build_reference(policy, lora=True, on_cpu=False)(r, 1.0)
    assert reference.shares_policy(policy, lora=True, on_cpu=False) is None
    monkeypatch.setattr(reference, "LEAN_COPY_MAX_PARAMS", 0)
    assert "over 0 parameters" in reference.shares_policy(policy, lora=True, on_cpu=False)
    assert reference.shares_policy(policy, lora=True, on_cpu=True) is None  # a CPU copy asked
    assert reference.shares_policy(policy, lora=False, on_cpu=False) is None

    def no_copy(*a, **k):
        raise AssertionError("a lean copy was built")

    monkeypatch.setattr(LeanLlama, "from_hf", no_copy)
    with torch.inference_mode():
        shared = reference.build_reference(policy, lora=True, on_cpu=False)(r, 1.0)
    torch.testing.assert_close(shared, copied, atol=1e-5, rtol=1e-5)
