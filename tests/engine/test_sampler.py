"""The rollout sampler: HF-exact greedy, EOS masks, seeds, log-probs, filters, GPT-2 fallback."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from smollab.engine.lean_llama import LeanLlama, positions_from_mask  # noqa: E402
from smollab.engine.rollout import Rollout, left_pad  # noqa: E402
from smollab.engine.sampler import Sampler  # noqa: E402
from smollab.engine.token_logprobs import logprobs  # noqa: E402

PROMPTS = [[1, 5, 6, 7, 8], [1, 9], [1, 10, 11], [1, 12, 13, 14]]


def micro_llama(seed: int = 0, **kw):
    torch.manual_seed(seed)
    kw = {"tie_word_embeddings": False, **kw}
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=45,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        **kw,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # a peakier distribution than the default init, like a trained model
        model.lm_head.weight.mul_(30.0)
    return model


def micro_gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=64,
        n_positions=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


def hf_greedy(model, prompts, n, eos, repetition_penalty=1.0):
    ids, mask = left_pad(prompts, 0)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=n,
            pad_token_id=0,
            eos_token_id=eos,
            repetition_penalty=repetition_penalty,
        )
    return out[:, ids.shape[1] :]


def check_logprobs(model, r: Rollout, temperature: float):
    """Sampler log-probs == log_softmax(HF logits / temperature) at the sampled tokens."""
    with torch.inference_mode():
        want = logprobs(model, r.input_ids, r.attention_mask, r.prompt_ids.shape[1], temperature)
    m = r.completion_mask.bool()
    torch.testing.assert_close(r.logprobs[m], want[m], atol=1e-5, rtol=0)
    assert (r.logprobs[~m] == 0).all()


def test_rollout_fields_and_greedy_equals_hf_generate():
    model = micro_llama()
    s = Sampler(model)
    assert s.backend == "lean"
    r = s.generate(PROMPTS, 12, temperature=0, stop_at_eos=False)
    B = len(PROMPTS)
    assert r.prompt_ids.shape == r.prompt_mask.shape == (B, 5)
    assert r.completion_ids.shape == r.completion_mask.shape == r.logprobs.shape == (B, 12)
    assert r.prompt_mask.tolist()[1] == [0, 0, 0, 1, 1] and r.prompt_ids[1, 0] == 0
    assert r.truncated.all() and r.completion_mask.all()
    assert not r.logprobs.is_inference()  # usable in a loss afterwards
    assert torch.equal(r.completion_ids, hf_greedy(model, PROMPTS, 12, eos=None))
    check_logprobs(model, r, 1.0)


def test_eos_stop_masks_truncation_and_early_exit():
    model = micro_llama()
    free = Sampler(model).generate(PROMPTS, 12, temperature=0, stop_at_eos=False)
    assert free.completion_ids.shape[1] == 12
    # Stop tokens that every row emits by step 3: all rows finish, the loop exits early.
    eos = sorted(set(free.completion_ids[:, 3].tolist()))
    r = Sampler(model, eos_token_id=eos, pad_token_id=0).generate(PROMPTS, 12, temperature=0)
    first = [next(i for i, t in enumerate(row) if t in eos) for row in free.completion_ids.tolist()]
    assert r.completion_ids.shape[1] == max(first) + 1 < 12
    for row, f in enumerate(first):
        assert r.completion_mask[row].tolist() == [1] * (f + 1) + [0] * (max(first) - f)
        assert r.completion_ids[row, : f + 1].tolist() == free.completion_ids[row, : f + 1].tolist()
        assert (r.completion_ids[row, f + 1 :] == 0).all()
    assert not r.truncated.any()
    assert torch.equal(r.completion_lengths, torch.tensor(first) + 1)
    check_logprobs(model, r, 1.0)
    # One stop token only: rows that never emit it are truncated and run to the end.
    one = free.completion_ids[0, 3].item()
    r1 = Sampler(model, eos_token_id=one, pad_token_id=0).generate(PROMPTS, 12, temperature=0)
    never = [one not in row for row in free.completion_ids.tolist()]
    assert r1.truncated.tolist() == never
    if any(never):
        assert r1.completion_ids.shape[1] == 12
    hf = hf_greedy(model, PROMPTS, 12, eos=one)
    assert torch.equal(r1.completion_ids[:, : hf.shape[1]], hf)


def test_seeds_reproduce_and_logprobs_match_at_temperature():
    model = micro_llama()
    s = Sampler(model)
    a = s.generate(PROMPTS, 10, temperature=0.7, seed=123)
    b = s.generate(PROMPTS, 10, temperature=0.7, generator=torch.Generator().manual_seed(123))
    c = s.generate(PROMPTS, 10, temperature=0.7, seed=124)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    check_logprobs(model, a, 0.7)


@pytest.mark.parametrize("make", [micro_llama, micro_gpt2])  # lean and HF backends
def test_repetition_penalty_is_hfs_and_the_logprobs_stay_the_policys(make):
    """Greedy with the penalty decodes what HF's generate decodes with it (HF's definition: a
    seen token's logit divided by p where positive, multiplied where negative); the returned
    log-probs are a plain forward's of the unpenalized policy, at any temperature, and a
    penalized decode keeps no record for the replay."""
    model = make()
    s = Sampler(model)
    plain = s.generate(PROMPTS, 12, temperature=0, stop_at_eos=False)
    r = s.generate(PROMPTS, 12, temperature=0, stop_at_eos=False, repetition_penalty=3.0)
    assert not torch.equal(r.completion_ids, plain.completion_ids)  # the penalty acts here
    assert torch.equal(r.completion_ids, hf_greedy(model, PROMPTS, 12, None, 3.0))
    check_logprobs(model, r, 1.0)
    a = s.generate(PROMPTS, 10, temperature=0.7, seed=3, repetition_penalty=1.1, record=True)
    assert a.record is None
    check_logprobs(model, a, 0.7)
    with pytest.raises(ValueError, match="repetition_penalty must be > 0"):
        s.generate(PROMPTS, 2, repetition_penalty=0.0)


def test_top_k_one_and_tiny_top_p_are_greedy():
    model = micro_llama()
    s = Sampler(model)
    greedy = s.generate(PROMPTS, 10, temperature=0, stop_at_eos=False)
    for kw in ({"top_k": 1}, {"top_p": 1e-6}, {"top_k": 5, "top_p": 1e-6}):
        r = s.generate(PROMPTS, 10, temperature=1.0, seed=3, stop_at_eos=False, **kw)
        assert torch.equal(r.completion_ids, greedy.completion_ids), kw


@pytest.mark.parametrize("kw", [{"top_k": 3}, {"top_p": 0.5}, {"top_k": 4, "top_p": 0.6}])
def test_filters_keep_samples_inside_the_kept_set(kw):
    model = micro_llama()
    model.lm_head.weight.data.div_(30.0)  # flat distribution: filters matter
    r = Sampler(model).generate(PROMPTS * 4, 10, seed=0, stop_at_eos=False, **kw)
    P = r.prompt_ids.shape[1]
    with torch.inference_mode():
        pos = positions_from_mask(r.attention_mask)
        logits = model(r.input_ids, attention_mask=r.attention_mask, position_ids=pos).logits
    probs = logits[:, P - 1 : -1].softmax(-1)
    sorted_p, _ = probs.sort(-1, descending=True)
    p_tok = probs.gather(-1, r.completion_ids[..., None]).squeeze(-1)
    rank = (probs > p_tok[..., None]).sum(-1)  # 0-based rank of the sampled token
    if "top_k" in kw:
        assert (rank < kw["top_k"]).all()
    if "top_p" in kw:
        top = sorted_p[..., : kw.get("top_k", 64)]
        top = top / top.sum(-1, keepdim=True)  # top-p acts on the renormalized top-k
        before = top.cumsum(-1) - top  # mass of the tokens ranked above
        mass_before = before.gather(-1, rank[..., None]).squeeze(-1)
        assert (mass_before < kw["top_p"] + 1e-4).all()
    check_logprobs(model, r, 1.0)


def test_load_weights_tracks_the_policy_and_lora():
    peft = pytest.importorskip("peft")
    model = micro_llama()
    s = Sampler(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    s.load_weights(model)
    r = s.generate(PROMPTS, 8, temperature=0, stop_at_eos=False)
    assert torch.equal(r.completion_ids, hf_greedy(model, PROMPTS, 8, eos=None))

    cfg = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"])
    cfg.init_lora_weights = False
    lora = peft.get_peft_model(model, cfg).eval()
    s = Sampler(lora)
    r = s.generate(PROMPTS, 8, temperature=0, stop_at_eos=False)
    assert torch.equal(r.completion_ids, hf_greedy(lora, PROMPTS, 8, eos=None))
    check_logprobs(lora, r, 1.0)
    ref = Sampler(lora, adapters=False)  # the GRPO reference: adapters off
    with lora.disable_adapter():
        want = hf_greedy(lora, PROMPTS, 8, eos=None)
    assert torch.equal(
        ref.generate(PROMPTS, 8, temperature=0, stop_at_eos=False).completion_ids, want
    )


def test_repeated_prompts_share_one_prefill_with_the_same_samples(monkeypatch):
    """GRPO batches repeat each prompt: the prefill runs once per distinct prompt."""
    import smollab.engine.lean_llama as lean_module

    model = micro_llama()
    prompts = [p for p in PROMPTS for _ in range(3)]  # left padding too
    ids, mask = left_pad(prompts, 0)
    u_ids, u_mask, rows = lean_module.distinct_prompts(ids, mask)
    assert u_ids.shape[0] == len(PROMPTS) and torch.equal(u_ids[rows], ids)
    assert torch.equal(u_mask[rows], mask)
    shared = Sampler(model).generate(prompts, 10, temperature=0.8, seed=5)
    monkeypatch.setattr(
        lean_module, "distinct_prompts", lambda i, m: (i, m, torch.arange(i.shape[0]))
    )
    alone = Sampler(model).generate(prompts, 10, temperature=0.8, seed=5)
    assert torch.equal(shared.completion_ids, alone.completion_ids)
    torch.testing.assert_close(shared.logprobs, alone.logprobs, atol=1e-5, rtol=0)
    check_logprobs(model, shared, 0.8)


def test_logprobs_helper_lean_equals_hf():
    model = micro_llama()
    r = Sampler(model).generate(PROMPTS, 8, seed=0, stop_at_eos=False)
    lean = LeanLlama.from_hf(model)
    with torch.inference_mode():
        a = logprobs(lean, r.input_ids, r.attention_mask, 5, 0.9)
        b = logprobs(model, r.input_ids, r.attention_mask, 5, 0.9)
    assert a.shape == (len(PROMPTS), 8)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_bf16_autocast_generates():
    model = micro_llama()
    s = Sampler(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        r = s.generate(PROMPTS, 6, seed=0)
    assert r.completion_ids.shape[0] == len(PROMPTS)
    assert torch.isfinite(r.logprobs).all()


def test_gpt2_falls_back_to_hf_generate():
    model = micro_gpt2()
    s = Sampler(model)
    assert s.backend == "hf"
    a = s.generate(PROMPTS, 7, temperature=0.8, top_k=10, seed=5)
    b = s.generate(PROMPTS, 7, temperature=0.8, top_k=10, seed=5)
    assert isinstance(a, Rollout)
    B = len(PROMPTS)
    assert a.prompt_ids.shape == (B, 5) and a.completion_ids.shape[0] == B
    assert a.completion_ids.shape[1] <= 7 and a.truncated.shape == (B,)
    assert torch.equal(a.completion_ids, b.completion_ids)
    check_logprobs(model, a, 0.8)
    g = s.generate(PROMPTS, 7, temperature=0, stop_at_eos=False)
    assert torch.equal(g.completion_ids, hf_greedy(model, PROMPTS, 7, eos=None))


@pytest.mark.parametrize("V", [512, 100])  # two-level CDF (V % 64 == 0) and the plain one
@pytest.mark.parametrize("kw", [{}, {"top_k": 50}, {"top_p": 0.8}])
def test_draw_frequencies_follow_the_distribution(V, kw):
    from smollab.engine.token_draw import TokenDraw

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, V, generator=g) * 2
    probs = logits.softmax(-1)[0]
    if kw.get("top_k"):
        keep = torch.zeros(V, dtype=torch.bool)
        keep[probs.topk(kw["top_k"]).indices] = True
        probs = torch.where(keep, probs, 0.0)
    if kw.get("top_p"):
        p, i = probs.sort(descending=True)
        keep = torch.zeros(V, dtype=torch.bool)
        keep[i[(p.cumsum(0) - p) < kw["top_p"]]] = True
        probs = torch.where(keep, probs, 0.0)
    probs = probs / probs.sum()
    B, n = 4000, 10
    draw = TokenDraw(1.0, kw.get("top_k", 0), kw.get("top_p", 1.0), g, B, "cpu")
    counts = torch.zeros(V)
    for _ in range(n):
        tok, lp = draw(logits.expand(B, V))
        counts += torch.bincount(tok[:, 0], minlength=V).float()
        full = logits.log_softmax(-1)[0]
        torch.testing.assert_close(lp[:, 0], full[tok[:, 0]], atol=1e-5, rtol=0)
    assert counts[probs == 0].sum() == 0  # nothing outside the kept set
    tv = 0.5 * (counts / counts.sum() - probs).abs().sum()
    assert tv < 0.03, tv


def test_gpt2_fallback_top_k_zero_means_no_top_k():
    """transformers 5 fills an unset top_k with 50; the fallback must not filter silently."""
    model = micro_gpt2()  # vocab 64, nearly flat at random init
    r = Sampler(model).generate(PROMPTS * 8, 20, seed=0, stop_at_eos=False)
    with torch.inference_mode():
        pos = positions_from_mask(r.attention_mask)
        logits = model(r.input_ids, attention_mask=r.attention_mask, position_ids=pos).logits
    probs = logits[:, r.prompt_ids.shape[1] - 1 : -1].softmax(-1)
    p_tok = probs.gather(-1, r.completion_ids[..., None])
    rank = (probs > p_tok).sum(-1)
    assert (rank >= 50).any()


def test_num_threads_is_restored_and_inputs_validated():
    model = micro_llama()
    before = torch.get_num_threads()
    r = Sampler(model, num_threads=1).generate(PROMPTS, 3, seed=0)
    assert torch.get_num_threads() == before and r.completion_ids.shape[0] == len(PROMPTS)
    s = Sampler(model)
    with pytest.raises(ValueError, match="empty prompt"):
        s.generate([[1, 2], []], 3)
    with pytest.raises(ValueError, match="top_p"):
        s.generate(PROMPTS, 3, top_p=0.0)
    ids, mask = left_pad(PROMPTS, 0)  # a pre-padded tensor gives the same rollout
    a = s.generate(ids, 5, prompt_mask=mask, seed=1)
    b = s.generate(PROMPTS, 5, seed=1)
    assert torch.equal(a.completion_ids, b.completion_ids)


def test_a_generator_on_another_device_is_refused_before_the_first_token():
    """What stopped GRPO on every GPU and Mac (a CPU generator, logits on the device), in one line."""
    from smollab.engine.token_draw import TokenDraw

    with pytest.raises(ValueError, match=r"generator is on cpu and the logits on meta.*seed="):
        TokenDraw(1.0, 0, 1.0, torch.Generator(device="cpu"), 2, "meta")
    TokenDraw(1.0, 0, 1.0, None, 2, "meta")  # torch's global stream: always on the right device
