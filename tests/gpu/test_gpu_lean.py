"""The lean Llama forward against HF on each accelerator (CUDA, Apple's MPS): full, left-padded,
incremental and LoRA in fp32 (TF32 off), and within the precision's tolerance under TF32 (CUDA)
and bf16/fp16 autocast where the device runs them natively. The builders are the CPU parity
test's."""

from __future__ import annotations

import pytest
import torch

from smollab.device.runtime import precision_unsupported, tf32_matmuls
from smollab.engine.lean_llama import LeanLlama, positions_from_mask
from tests.engine.test_lean_llama import batch, lora_model, micro_llama
from tests.gpu.marks import ON_ACCELERATORS

pytestmark = ON_ACCELERATORS

FP32 = 1e-4  # GPU kernels sum in other orders than the CPU's (whose test holds 1e-5)
TOL = {"tf32": 1e-2, "bf16": 1e-1, "fp16": 5e-2}  # vs the fp32 forward; the CPU bf16 test: 0.1


@pytest.fixture(autouse=True)
def tf32_off(device):
    """CUDA's fp32 matmuls in full fp32 (MPS has no TF32 to switch off)."""
    if device != "cuda":
        yield
        return
    with tf32_matmuls(False):
        old = torch.backends.cudnn.conv.fp32_precision
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        yield
        torch.backends.cudnn.conv.fp32_precision = old


def on(device, *tensors):
    return [t.to(device) for t in tensors]


@pytest.mark.parametrize("tie", [True, False])
def test_full_and_padded_forward_match_hf(device, tie):
    hf = micro_llama(tie).to(device)
    lean = LeanLlama.from_hf(hf)
    assert lean.wqkv.device.type == device
    ids, mask = on(device, *batch())
    real = mask.bool()
    with torch.inference_mode():
        torch.testing.assert_close(lean(ids), hf(ids).logits, atol=FP32, rtol=0)
        ref = hf(ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits
        torch.testing.assert_close(lean(ids, mask)[real], ref[real], atol=FP32, rtol=0)


def test_incremental_decode_matches_full_forward(device):
    lean = LeanLlama.from_hf(micro_llama(False).to(device))
    ids, mask = on(device, *batch())
    B, L = ids.shape
    with torch.inference_mode():
        full = lean(ids, mask)
        cache = lean.new_cache(B, L)
        first = lean(ids[:, :6], mask[:, :6], cache=cache, logits_to_keep=1)
        torch.testing.assert_close(first[:, 0], full[:, 5], atol=FP32, rtol=0)
        pos = positions_from_mask(mask)
        for t in range(6, L):
            cos, sin = lean.rope(pos[:, t])
            step = lean.decode(ids[:, t], cos[:, None], sin[:, None], cache, t)
            torch.testing.assert_close(step, full[:, t], atol=FP32, rtol=0)


def test_lora_forward_matches_peft(device):
    model, _ = lora_model()
    model = model.to(device)
    ids, mask = on(device, *batch())
    pos, real = positions_from_mask(mask), mask.bool()
    with torch.inference_mode():
        want = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got = LeanLlama.from_hf(model)(ids, mask)
        torch.testing.assert_close(got[real], want[real], atol=FP32, rtol=0)


@pytest.mark.parametrize("precision", ["tf32", "bf16", "fp16"])
def test_reduced_precision_stays_close_to_fp32(device, precision):
    if precision == "tf32" and device != "cuda":
        pytest.skip("TF32 is a CUDA tensor-core mode")
    if precision != "tf32" and (why := precision_unsupported(torch.device(device), precision)):
        pytest.skip(why)
    hf = micro_llama().to(device)
    lean = LeanLlama.from_hf(hf)
    ids, mask = on(device, *batch())
    real = mask.bool()
    with torch.inference_mode():
        ref = hf(ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits[real]
        if precision == "tf32":
            with tf32_matmuls(True):
                got, hf_got = (
                    lean(ids, mask),
                    hf(ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits,
                )
        else:
            dtype = torch.bfloat16 if precision == "bf16" else torch.float16
            with torch.autocast(device, dtype=dtype):
                got = lean(ids, mask)
                hf_got = hf(ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits
    for x in (got[real], hf_got[real]):  # ours and HF's, each within the precision's tolerance
        assert torch.isfinite(x).all()
        assert (x.float() - ref).abs().max() < TOL[precision]
