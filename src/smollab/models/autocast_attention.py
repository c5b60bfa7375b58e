"""SDPA attention kept in fp32 under CPU autocast, registered with transformers' attention interface.

Why: on the dev CPU (AVX-512 with bf16, no AMX) bf16 matmuls run 2.5-4.7x faster than fp32 at
smollab's shapes, but PyTorch's bf16 CPU attention kernels are far slower than its fp32 ones: a
GRPO policy forward and backward at the SimpleStories-1.25M shape (32 rows x 73 tokens, with a
padding mask) took 2.1 s with bf16 SDPA and 0.21 s with attention upcast to fp32 (0.24 s all in
fp32). So under CPU autocast the linear layers run in bf16 and attention in fp32. The name is
set on the loaded model only (`model.set_attn_implementation`), never saved into config.json.
"""

from __future__ import annotations

import torch

NAME = "smollab_sdpa_fp32"
_registered = False


def _sdpa_fp32(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.dtype == torch.float32:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    dtype = query.dtype
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask.float()
    with torch.autocast(query.device.type, enabled=False):
        out, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
    return out.to(dtype), weights


def register() -> str:
    """Register the fp32-attention SDPA variant with transformers (once); return its name."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask

        AttentionInterface.register(NAME, _sdpa_fp32)
        AttentionMaskInterface.register(NAME, sdpa_mask)
        _registered = True
    return NAME


def fit_attention(model, device: torch.device, autocast_dtype: torch.dtype | None) -> str | None:
    """Switch an SDPA model to fp32 attention when it will run under CPU autocast.

    Returns a note for the runtime log line when it switched, else None.
    """
    current = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if device.type != "cpu" or autocast_dtype is None or current != "sdpa":
        return None
    model.set_attn_implementation(register())
    return "attention in fp32 under CPU autocast (bf16 CPU attention kernels are slower)"
