"""The lean Llama forward against HF on the GPU: full, left-padded, incremental and LoRA in fp32
(TF32 off), and within the precision's tolerance under TF32 and bf16/fp16 autocast. The builders
are the CPU parity test's."""

from __future__ import annotations

import pytest
import torch

from smollab.engine.lean_llama import LeanLlama, positions_from_mask
from tests.engine.test_lean_llama import batch, lora_model, micro_llama
from tests.gpu.marks import GPU, bf16_ok

pytestmark = GPU

FP32 = 1e-4  # GPU kernels sum in other orders than the CPU's (whose test holds 1e-5)
TOL = {"tf32": 1e-2, "bf16": 1e-1, "fp16": 5e-2}  # vs the fp32 forward; the CPU bf16 test: 0.1


@pytest.fixture(autouse=True)
def tf32_off():
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def on_cuda(*tensors):
    return [t.cuda() for t in tensors]


@pytest.mark.parametrize("tie", [True, False])
def test_full_and_padded_forward_match_hf(tie):
    hf = micro_llama(tie).cuda()
    lean = LeanLlama.from_hf(hf)
    assert lean.wqkv.device.type == "cuda"
    ids, mask = on_cuda(*batch())
    real = mask.bool()
    with torch.inference_mode():
        torch.testing.assert_close(lean(ids), hf(ids).logits, atol=FP32, rtol=0)
        ref = hf(ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits
        torch.testing.assert_close(lean(ids, mask)[real], ref[real], atol=FP32, rtol=0)


def test_incremental_decode_matches_full_forward():
    lean = LeanLlama.from_hf(micro_llama(False).cuda())
    ids, mask = on_cuda(*batch())
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


def test_lora_forward_matches_peft():
    model, _ = lora_model()
    model = model.cuda()
    ids, mask = on_cuda(*batch())
    pos, real = positions_from_mask(mask), mask.bool()
    with torch.inference_mode():
        want = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got = LeanLlama.from_hf(model)(ids, mask)
        torch.testing.assert_close(got[real], want[real], atol=FP32, rtol=0)


@pytest.mark.parametrize("precision", ["tf32", "bf16", "fp16"])
def test_reduced_precision_stays_close_to_fp32(precision):
    if precision == "bf16" and not bf16_ok():
        pytest.skip("this GPU has no native bf16")
    hf = micro_llama().cuda()
    lean = LeanLlama.from_hf(hf)
    ids, mask = on_cuda(*batch())
    real = mask.bool()
    with torch.inference_mode():
        ref = hf(ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits[real]
        if precision == "tf32":
            torch.backends.cuda.matmul.allow_tf32 = True
            got, hf_got = (
                lean(ids, mask),
                hf(ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits,
            )
        else:
            dtype = torch.bfloat16 if precision == "bf16" else torch.float16
            with torch.autocast("cuda", dtype=dtype):
                got = lean(ids, mask)
                hf_got = hf(ids, attention_mask=mask, position_ids=positions_from_mask(mask)).logits
    for x in (got[real], hf_got[real]):  # ours and HF's, each within the precision's tolerance
        assert torch.isfinite(x).all()
        assert (x.float() - ref).abs().max() < TOL[precision]
