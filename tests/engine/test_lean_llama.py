"""LeanLlama reads HF Llama weights exactly: logit parity for full, padded, incremental and LoRA."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from smollab.engine.lean_llama import LeanLlama, positions_from_mask  # noqa: E402

TOL = 1e-5


def micro_llama(tie: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=45,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
        rope_theta=500.0,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # non-trivial norms, so a mixed-up norm weight shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def batch(seed: int = 1, vocab: int = 64):
    """Token ids [3, 10] in [3, vocab), rows 0 and 1 left-padded by 4 and 1."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (3, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[1, :1] = 0
    return ids, mask


@pytest.mark.parametrize("tie", [True, False])
def test_full_forward_matches_hf(tie):
    hf = micro_llama(tie)
    lean = LeanLlama.from_hf(hf)
    assert lean.mlp_width == 48  # 45 padded with zero weights: the padding must change nothing
    assert (
        not lean.wgu[:, 45:48].any() and not lean.wgu[:, 93:].any() and not lean.wd[..., 45:].any()
    )
    ids, _ = batch()
    with torch.inference_mode():
        torch.testing.assert_close(lean(ids), hf(ids).logits, atol=TOL, rtol=0)
        last = lean(ids, logits_to_keep=3)
        torch.testing.assert_close(last, hf(ids).logits[:, -3:], atol=TOL, rtol=0)


@pytest.mark.parametrize("tie", [True, False])
def test_left_padded_forward_matches_hf_and_unpadded_rows(tie):
    hf = micro_llama(tie)
    lean = LeanLlama.from_hf(hf)
    ids, mask = batch()
    with torch.inference_mode():
        ours = lean(ids, mask)
        ref = hf(ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits
        assert torch.isfinite(ours).all()
        real = mask.bool()
        torch.testing.assert_close(ours[real], ref[real], atol=TOL, rtol=0)
        for row in range(ids.shape[0]):  # a padded row scores like the same row unpadded
            n = int(mask[row].sum())
            alone = hf(ids[row : row + 1, -n:]).logits[0]
            torch.testing.assert_close(ours[row, -n:], alone, atol=TOL, rtol=0)


def test_incremental_decode_matches_full_forward():
    hf = micro_llama(False)
    lean = LeanLlama.from_hf(hf)
    ids, mask = batch()
    B, L = ids.shape
    with torch.inference_mode():
        full = lean(ids, mask)
        cache = lean.new_cache(B, L)
        first = lean(ids[:, :6], mask[:, :6], cache=cache, logits_to_keep=1)
        torch.testing.assert_close(first[:, 0], full[:, 5], atol=TOL, rtol=0)
        pos = positions_from_mask(mask)
        for t in range(6, 8):  # the sampler's hot path
            cos, sin = lean.rope(pos[:, t])
            step = lean.decode(ids[:, t], cos[:, None], sin[:, None], cache, t)
            torch.testing.assert_close(step, full[:, t], atol=TOL, rtol=0)
        chunk = lean(ids[:, 8:], mask, cache=cache, cache_pos=8)  # multi-token with a cache
        torch.testing.assert_close(chunk, full[:, 8:], atol=TOL, rtol=0)
        ref = hf(ids, attention_mask=mask, position_ids=pos).logits
        real = mask.bool()
        torch.testing.assert_close(full[real], ref[real], atol=TOL, rtol=0)


def lora_model(tie: bool = False):
    peft = pytest.importorskip("peft")
    base = micro_llama(tie)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    cfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, init_lora_weights=False)
    pristine = copy.deepcopy(base)
    return peft.get_peft_model(base, cfg).eval(), pristine


def test_lora_merge_and_adapters_off_match_peft():
    model, pristine = lora_model()
    ids, mask = batch()
    pos = positions_from_mask(mask)
    real = mask.bool()
    with torch.inference_mode():
        lean = LeanLlama.from_hf(model)
        want = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        base_want = pristine(ids, attention_mask=mask, position_ids=pos).logits
        assert (want - base_want).abs().max() > 1e-3  # the adapters do something
        torch.testing.assert_close(lean(ids, mask)[real], want[real], atol=TOL, rtol=0)

        base = LeanLlama.from_hf(model, adapters=False)
        torch.testing.assert_close(base(ids, mask)[real], base_want[real], atol=TOL, rtol=0)
        with model.disable_adapter():
            off = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            torch.testing.assert_close(off[real], base_want[real], atol=TOL, rtol=0)
            lean.load_from_hf(model)  # adapters disabled on the model: base weights
        torch.testing.assert_close(lean(ids, mask)[real], base_want[real], atol=TOL, rtol=0)

        model.merge_adapter()  # merged into the base weights: not added twice, removable
        try:
            lean.load_from_hf(model)
            torch.testing.assert_close(lean(ids, mask)[real], want[real], atol=TOL, rtol=0)
            lean.load_from_hf(model, adapters=False)
            torch.testing.assert_close(lean(ids, mask)[real], base_want[real], atol=TOL, rtol=0)
        finally:
            model.unmerge_adapter()


def test_scaled_rope_is_read_and_other_models_raise():
    """RoPE scaled at init (here linear) is transformers' own: the logits stay HF's (the other
    types and the refusals: test_families.py)."""
    torch.manual_seed(0)
    cfg = micro_llama().config
    cfg.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}
    hf = transformers.LlamaForCausalLM(cfg).eval()
    ids, _ = batch()
    with torch.inference_mode():
        torch.testing.assert_close(LeanLlama.from_hf(hf)(ids), hf(ids).logits, atol=TOL, rtol=0)
    gpt2 = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)
    with pytest.raises(NotImplementedError, match="not 'gpt2'"):
        LeanLlama(gpt2)


def test_dtype_change_and_bf16_autocast():
    hf = micro_llama()
    lean = LeanLlama.from_hf(hf)
    ids, mask = batch()
    with torch.inference_mode():
        ref = lean(ids, mask)
        lean64 = copy.deepcopy(lean).double()  # views are rebuilt after .to()/.double()
        torch.testing.assert_close(lean64(ids, mask).float(), ref, atol=TOL, rtol=0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = lean(ids, mask)
        assert torch.isfinite(low).all()
        assert (low.float() - ref).abs().max() < 0.1
