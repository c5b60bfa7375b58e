"""fp32 attention under CPU autocast: same results as SDPA, switched only where it applies."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from smollab.models.autocast_attention import NAME, fit_attention  # noqa: E402
from tests.engine.test_sampler import micro_llama  # noqa: E402


def _padded_batch():
    ids = torch.randint(3, 64, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0  # left padding
    mask[1, -2:] = 0  # masked completion tail
    return ids, mask


def test_fit_attention_switches_only_sdpa_under_cpu_autocast():
    model = micro_llama(attn_implementation="sdpa")
    assert fit_attention(model, torch.device("cpu"), None) is None
    assert fit_attention(model, torch.device("cuda"), torch.bfloat16) is None
    assert model.config._attn_implementation == "sdpa"
    assert "fp32" in fit_attention(model, torch.device("cpu"), torch.bfloat16)
    assert model.config._attn_implementation == NAME
    eager = micro_llama(attn_implementation="eager")
    assert fit_attention(eager, torch.device("cpu"), torch.bfloat16) is None


def test_fp32_attention_equals_sdpa_and_tracks_fp32_under_autocast():
    ids, mask = _padded_batch()
    sdpa = micro_llama(attn_implementation="sdpa")
    fitted = micro_llama(attn_implementation="sdpa")
    fit_attention(fitted, torch.device("cpu"), torch.bfloat16)
    with torch.no_grad():
        want = sdpa(input_ids=ids, attention_mask=mask).logits
        torch.testing.assert_close(fitted(input_ids=ids, attention_mask=mask).logits, want)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = fitted(input_ids=ids, attention_mask=mask).logits.float()
    keep = mask.bool()
    assert torch.isfinite(low).all()
    # bf16 linear layers: close to the fp32 logits at real tokens (logits here reach ~30)
    assert (low[keep] - want[keep]).abs().max() < 1.0
    assert (low[keep].argmax(-1) == want[keep].argmax(-1)).float().mean() > 0.9
