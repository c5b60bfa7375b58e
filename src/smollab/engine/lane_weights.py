"""How N policies' weights become a `LaneLlama`'s lane tensors, in the lean engine's layout.

LoRA policies (PEFT models of the lanes' shared base): per layer and fused weight (qkv, o,
gate-up, down), the lanes' low-rank factors stacked with the lane dimension first, the parts of
a fused weight side by side: A of q, k and v stacked, their B block-diagonal in the fused row
layout, the norm weights folded into A and the LoRA scaling into B. Returned transposed for the
forward, (A.T [N, in, R], B.T [N, R, out]); None where no lane adapts the weight.

Full policies (plain HF models, every weight trained): per layer and fused weight each lane's
own copy, (W.T [N, in, out],) with the norm weights folded in as `LeanLlama` folds them, its
biases and q/k norm weights where the model has them, plus each lane's embedding and LM head
(the final norm folded in) [N, V, H] (`FullLanes`). LoRA lanes share the base's biases and q/k
norms (LoRA adapts only the linears' weights).

Both are built differentiably from the policies' parameters: under grad, a loss on the lanes'
log-probs reaches each policy's own parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from smollab.engine.lean_llama import fused_layer_weights
from smollab.models.hf_weights import effective_weight, unwrap_hf

__all__ = ["FullLanes", "full_lanes", "lora_lanes"]

# PEFT module of each LoRA target, per fused weight: (weight, [(target, layer module path)])
_QKV = (("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"))
_GU = (("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"))

LaneLayer = tuple[tuple[torch.Tensor, ...] | None, ...]  # per fused weight (qkv, o, gu, d)


def _module(layer: nn.Module, path: str) -> nn.Module:
    for part in path.split("."):
        layer = getattr(layer, part)
    return layer


def _lora_factors(layers: list[list[nn.Module]], path: str):
    """(A [N, L, r, in], scaling * B [N, L, out, r]) of module `path` in every lane and layer,
    or None without LoRA there. Lanes may have different ranks: the smaller ones are padded with
    zero rows of A and zero columns of B, which add nothing (and get zero gradients)."""
    mods = [[_module(layer, path) for layer in lane] for lane in layers]
    if not hasattr(mods[0][0], "lora_A") or "default" not in mods[0][0].lora_A:
        return None
    r = max(m.lora_A["default"].weight.shape[0] for lane in mods for m in lane)

    def padded(w: torch.Tensor, dim: int) -> torch.Tensor:
        short = r - w.shape[dim]
        if not short:
            return w
        return F.pad(w, (0, short) if dim == 1 else (0, 0, 0, short))

    a = torch.stack(
        [torch.stack([padded(m.lora_A["default"].weight, 0) for m in lane]) for lane in mods]
    )
    b = torch.stack(
        [torch.stack([padded(m.lora_B["default"].weight, 1) for m in lane]) for lane in mods]
    )
    scale = torch.tensor([lane[0].scaling["default"] for lane in mods], device=a.device)
    return a, b * scale.view(-1, 1, 1, 1).to(b.dtype)


def lora_lanes(lean, policies: Sequence[nn.Module]) -> list[LaneLayer]:
    """Per layer, per fused weight of `lean` (a `LaneLlama`): the lanes' (A.T, B.T) or None.

    Only LoRA on the layers' linears is supported; the rest of each policy must be the base.
    """
    layers = [list(unwrap_hf(p).model.layers) for p in policies]
    N, L, Im, Imp = len(policies), lean.num_layers, lean.intermediate_size, lean.mlp_width
    D = lean.head_dim
    out = {
        "q": lean.num_heads * D,
        "k": lean.num_kv_heads * D,
        "v": lean.num_kv_heads * D,
        "gate": Im,
        "up": Im,
        "o": lean.hidden_size,
        "down": lean.hidden_size,
    }
    pad = Imp - Im  # the padded MLP width: zero rows after gate and up, zero columns of down

    def fused(parts, norm: torch.Tensor | None, pad_rows: bool, pad_in: int = 0):
        """(A [N, L, R, in], B [N, L, rows, R]) of a fused weight: the parts' A stacked,
        their B block-diagonal in the weight's row layout; None when no part has LoRA."""
        factors = [_lora_factors(layers, path) for _, path in parts]
        if all(f is None for f in factors):
            return None
        ranks = [0 if f is None else f[0].shape[2] for f in factors]
        R = sum(ranks)
        a = torch.cat([f[0] for f in factors if f is not None], dim=2)
        a = F.pad(a, (0, pad_in)) if pad_in else a
        a = a * norm if norm is not None else a
        blocks, before = [], 0
        for (name, _), f, r in zip(parts, factors, ranks, strict=True):
            if f is None:
                blocks.append(a.new_zeros(N, L, out[name], R))
            else:
                blocks.append(F.pad(f[1], (before, R - before - r)))
            if pad_rows and pad:
                blocks.append(a.new_zeros(N, L, pad, R))
            before += r
        return a, torch.cat(blocks, dim=2)

    weights = (
        fused(_QKV, lean.ln1[None, :, None, :], pad_rows=False),
        fused((("o", "self_attn.o_proj"),), None, pad_rows=False),
        fused(_GU, lean.ln2[None, :, None, :], pad_rows=True),
        fused((("down", "mlp.down_proj"),), None, pad_rows=False, pad_in=pad),
    )
    dtype = lean.embed.dtype  # fp32 adapters on a bf16 base compute in the base's dtype
    return [
        tuple(
            None
            if ab is None
            else (ab[0][:, i].transpose(1, 2).to(dtype), ab[1][:, i].transpose(1, 2).to(dtype))
            for ab in weights
        )
        for i in range(L)
    ]


def _embedding(module: nn.Module) -> torch.Tensor:
    """An embedding's weight, its `padding_idx` row cut from the graph: `nn.Embedding` gives that
    row no gradient (HF sets it to the pad id, which may also be EOS), so a lane trains as its
    run alone does."""
    w, pad = effective_weight(module), getattr(module, "padding_idx", None)
    if pad is None or not w.requires_grad:
        return w
    return torch.cat([w[:pad], w[pad : pad + 1].detach(), w[pad + 1 :]])


class FullLanes(NamedTuple):
    """Full lanes' tensors in the lean layout, each stacked lane first and differentiable in the
    lanes' parameters: per layer the fused weights (W.T [N, in, out],) (norms folded in), their
    biases [N, out] (None where the model has none) and the q/k norm weights [N, heads, D] (None
    without); the embeddings and LM heads (the final norm folded in) [N, V, H]."""

    layers: list[LaneLayer]
    biases: list[tuple[torch.Tensor | None, ...]]
    qk_norms: list[torch.Tensor | None]
    embed: torch.Tensor
    head: torch.Tensor


def _stacked(ts: list[torch.Tensor | None]) -> torch.Tensor | None:
    return None if ts[0] is None else torch.stack(ts)


def full_lanes(lean, policies: Sequence[nn.Module]) -> FullLanes:
    """The `FullLanes` of full policies, one per lane, in `lean`'s layout."""
    hfs = [unwrap_hf(p) for p in policies]
    layers, biases, qk_norms = [], [], []
    for i in range(lean.num_layers):  # one layer's fused copies at a time, then stacked
        per_lane = [fused_layer_weights(hf.model.layers[i], lean.mlp_width) for hf in hfs]
        layers.append(tuple((torch.stack([f[k].t() for f in per_lane]),) for k in range(4)))
        biases.append(tuple(_stacked([f.biases[k] for f in per_lane]) for k in range(4)))
        qk_norms.append(_stacked([f.qk_norm for f in per_lane]))
    embed = torch.stack([_embedding(hf.model.embed_tokens) for hf in hfs])
    head = torch.stack(
        [effective_weight(hf.lm_head) * effective_weight(hf.model.norm) for hf in hfs]
    )
    return FullLanes(layers, biases, qk_norms, embed, head)
