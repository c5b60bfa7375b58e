"""The frozen reference for the KL penalty, built once from the starting policy.

LoRA: the base with adapters off, read into a lean copy (no second HF model in memory), or, for a
model past `LEAN_COPY_MAX_PARAMS`, the policy itself with its adapters off (no copy at all). Full
fine-tuning: a frozen lean copy of the starting policy, optionally on the CPU. The copy holds
the policy's own dtype (`LeanLlama.from_hf`). Models the lean forward does not cover use a frozen HF copy (full FT) or the PEFT model with adapters off.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from smollab.engine.lean_config import check_lean_compatible
from smollab.engine.lean_llama import LeanLlama
from smollab.engine.rollout import Rollout
from smollab.engine.token_logprobs import logprobs
from smollab.models.hf_weights import unwrap_hf

Reference = Callable[[Rollout, float], torch.Tensor]


# A LoRA policy's base is frozen, so its reference can be the policy itself with its adapters off,
# at no memory. A lean copy of the base is faster only while a forward is bound by per-op
# overhead; a 0.5B model's forward is bound by its matmuls (Qwen2.5-0.5B shape, fp32, CPU: the
# lean log-prob forward 0.97x HF's), where the copy would cost the model's whole size for nothing.
LEAN_COPY_MAX_PARAMS = 100_000_000


def shares_policy(policy: nn.Module, lora: bool, on_cpu: bool) -> str | None:
    """Why the reference is the LoRA policy itself with its adapters off, no copy (None: it is a
    copy): a model past `LEAN_COPY_MAX_PARAMS`, unless the reference is asked onto the CPU."""
    if not lora or on_cpu or not hasattr(policy, "disable_adapter"):
        return None
    if sum(p.numel() for p in policy.parameters()) <= LEAN_COPY_MAX_PARAMS:
        return None
    return f"over {LEAN_COPY_MAX_PARAMS:,} parameters a lean copy saves no time"


def build_reference(policy: nn.Module, lora: bool, on_cpu: bool) -> Reference:
    """`fn(rollout, temperature) -> log-probs [B, T]` of the rollout under the starting policy."""
    frozen = None
    if shares_policy(policy, lora, on_cpu) is None:
        try:
            check_lean_compatible(unwrap_hf(policy).config)
            frozen = LeanLlama.from_hf(policy, adapters=False, device="cpu" if on_cpu else None)
        except (TypeError, NotImplementedError):
            frozen = None if lora else copy.deepcopy(policy).requires_grad_(False).eval()
            if frozen is not None and on_cpu:
                frozen.to("cpu")

    def ref_logprobs(r: Rollout, temperature: float) -> torch.Tensor:
        P = r.prompt_ids.shape[1]
        with torch.inference_mode():
            if frozen is None:
                with policy.disable_adapter():
                    out = logprobs(policy, r.input_ids, r.attention_mask, P, temperature)
            else:
                dev = next(frozen.parameters()).device
                out = logprobs(
                    frozen, r.input_ids.to(dev), r.attention_mask.to(dev), P, temperature
                )
        return out.to(r.completion_ids.device).clone()

    return ref_logprobs
