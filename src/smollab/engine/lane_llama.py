"""Lanes: N LoRA policies on one frozen Llama base, run as one batched model.

Why: at the sizes smollab trains, a decode step is ~130 tiny ops whose arithmetic takes a fraction
of their time, so N runs in N processes pay N times the framework overhead for the same work.
Here the N policies' rows form one batch (lane-major: rows [l * b, (l + 1) * b) are lane l's), and
every op of the forward covers all lanes at once.

Layout. Each lane's LoRA is merged into per-lane copies of the fused layer weights (`LeanLlama`'s
layout: qkv and gate-up fused, RMSNorm weights folded in), stacked with the lane dimension first:
wqkv [N, L, q+k+v, H] and so on. A matmul of the base, `x @ W.T`, becomes one batched matmul
`bmm(x.view(N, rows, H), W_lanes.T)`: the same arithmetic as the shared base matmul (every row
meets a weight of the same shape), one op for all lanes, and no low-rank side path (which would
add four ops per linear). The merge is a [N, L, out, r] @ [N, L, r, in] matmul per target once per
step; the copies cost N x the layer weights (8 lanes of SimpleStories-1.25M: ~25 MB), which is why
lanes are for small models. The embedding, the LM head and the final norm are the base's (LoRA
does not adapt them), as are the attention and its KV cache layout.

Gradients: `load_lanes(policies)` under grad builds the merged weights from each policy's PEFT
`lora_A` / `lora_B` parameters, so a loss on the lanes' log-probs backpropagates into each
policy's own adapter: lane l's rows touch only lane l's weights, so its gradient is its own.
The reference (the base with adapters off) is the inherited `LeanLlama` forward: this module is
a `LeanLlama` holding the base weights, plus the lanes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from smollab.engine.kv_cache import KVCache
from smollab.engine.lean_llama import LeanLlama, positions_from_mask
from smollab.models.hf_weights import effective_weight, unwrap_hf

__all__ = ["LaneLlama"]

# PEFT module of each LoRA target, per fused weight: (weight, [(target, layer module path)])
_QKV = (("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"))
_GU = (("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"))


def _module(layer: nn.Module, path: str) -> nn.Module:
    for part in path.split("."):
        layer = getattr(layer, part)
    return layer


def _lora_delta(layers: list[list[nn.Module]], path: str) -> torch.Tensor | None:
    """scaling * B @ A of module `path` in every lane and layer, [N, L, out, in] (None: no LoRA).

    Lanes may have different ranks: the smaller ones are padded with zero rows of A and zero
    columns of B, which add nothing to the product (and get zero gradients).
    """
    mods = [[_module(layer, path) for layer in lane] for lane in layers]
    if not hasattr(mods[0][0], "lora_A") or "default" not in mods[0][0].lora_A:
        return None
    r = max(m.lora_A["default"].weight.shape[0] for lane in mods for m in lane)

    def padded(w: torch.Tensor, dim: int) -> torch.Tensor:
        short = r - w.shape[dim]
        if not short:
            return w
        return F.pad(w, (0, short) if dim == 1 else (0, 0, 0, short))

    a = torch.stack([torch.stack([padded(m.lora_A["default"].weight, 0) for m in lane])
                     for lane in mods])  # fmt: skip
    b = torch.stack([torch.stack([padded(m.lora_B["default"].weight, 1) for m in lane])
                     for lane in mods])  # fmt: skip
    scale = torch.tensor([lane[0].scaling["default"] for lane in mods], device=a.device)
    return (b @ a) * scale.view(-1, 1, 1, 1).to(a.dtype)


class LaneLlama(LeanLlama):
    """A `LeanLlama` of the base weights plus N lanes of merged LoRA policies.

    lanes = LaneLlama.from_hf(policy, adapters=False)   # the base, once
    each step: lanes.load_lanes(policies)                # no grad: for the sampler
               Sampler(lanes).generate(rows of all lanes, lane-major)
               with grad: lanes.load_lanes(policies); logprobs(lanes, ...)  # per-lane gradients
    `forward`, `hidden` and `decode` use the lanes; `base_hidden` (and a plain `LeanLlama`) the base.
    """

    def __init__(self, config, *, device=None, dtype: torch.dtype | None = None):
        super().__init__(config, device=device, dtype=dtype)
        self.num_lanes = 0
        self._lane_layers: list[tuple[torch.Tensor, ...]] = []
        self.register_buffer("ln1", torch.ones(self.num_layers, self.hidden_size,
                                               device=self.embed.device), persistent=False)  # fmt: skip
        self.register_buffer("ln2", torch.ones_like(self.ln1), persistent=False)

    @torch.no_grad()
    def load_from_hf(self, model: nn.Module, *, adapters: bool = True) -> LaneLlama:
        """The base weights (and the norm weights the lanes' merged weights fold in)."""
        super().load_from_hf(model, adapters=adapters)
        for i, layer in enumerate(unwrap_hf(model).model.layers):
            self.ln1[i].copy_(effective_weight(layer.input_layernorm))
            self.ln2[i].copy_(effective_weight(layer.post_attention_layernorm))
        return self

    # ------------------------------------------------------------------ lanes
    def load_lanes(self, policies: Sequence[nn.Module]) -> None:
        """Merge each policy's LoRA into its lane's weights (differentiable under grad).

        policies: PEFT models of this base (adapter "default"), one per lane, in lane order.
        Only LoRA on the layers' linears is supported; the rest of each policy must be the base.
        """
        layers = [list(unwrap_hf(p).model.layers) for p in policies]
        if any(len(lane) != self.num_layers for lane in layers):
            raise ValueError(f"every lane's policy must have {self.num_layers} layers")
        N, Im, Imp = len(policies), self.intermediate_size, self.mlp_width
        ln1, ln2 = self.ln1[None, :, None, :], self.ln2[None, :, None, :]

        out = {
            "q": self.num_heads * self.head_dim,
            "k": self.num_kv_heads * self.head_dim,
            "v": self.num_kv_heads * self.head_dim,
            "gate": Im,
            "up": Im,
            "o": self.hidden_size,
        }

        def fused(parts, base: torch.Tensor, norm: torch.Tensor | None, pad_rows: bool):
            """base [L, rows, in] + each part's merged LoRA (zeros where a part has none)."""
            deltas = [_lora_delta(layers, path) for _, path in parts]
            w = base.unsqueeze(0).expand(N, *base.shape)
            if all(d is None for d in deltas):
                return w
            blocks = []
            for (name, _), d in zip(parts, deltas, strict=True):
                rows = [(d, out[name])] + ([(None, Imp - Im)] if pad_rows and Imp > Im else [])
                for block, n in rows:  # the padded MLP width adds zero rows after gate and up
                    blocks.append(base.new_zeros(N, self.num_layers, n, base.shape[-1])
                                  if block is None else block)  # fmt: skip
            delta = torch.cat(blocks, dim=2)
            return w + (delta * norm if norm is not None else delta)

        wqkv = fused(_QKV, self.wqkv, ln1, pad_rows=False)
        wgu = fused(_GU, self.wgu, ln2, pad_rows=True)
        wo = fused((("o", "self_attn.o_proj"),), self.wo, None, pad_rows=False)
        wd = self.wd.unsqueeze(0).expand(N, *self.wd.shape)
        if (dd := _lora_delta(layers, "mlp.down_proj")) is not None:
            wd = wd + F.pad(dd, (0, Imp - Im))  # the padded MLP width: zero columns
        self.num_lanes = N
        self._lane_layers = [
            (wqkv[:, i].transpose(1, 2), wo[:, i].transpose(1, 2), wgu[:, i].transpose(1, 2),
             wd[:, i].transpose(1, 2))
            for i in range(self.num_layers)
        ]  # fmt: skip

    def _rows(self, B: int) -> int:
        if not self.num_lanes:
            raise RuntimeError("LaneLlama: load_lanes(policies) first")
        if B % self.num_lanes:
            raise ValueError(f"a batch of {B} rows does not split into {self.num_lanes} lanes")
        return B // self.num_lanes

    def base_hidden(self, *args, **kwargs) -> torch.Tensor:
        """`LeanLlama.hidden` with the base weights (the reference: adapters off)."""
        return LeanLlama.hidden(self, *args, **kwargs)

    def prefill_logits(self, ids: torch.Tensor, mask: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Every row's prompt through its own lane (no sharing: lanes see a prompt differently)."""
        return self(ids, mask, cache=cache, logits_to_keep=1)[:, -1]

    # ------------------------------------------------------------------ forward
    def hidden(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
        cache_pos: int = 0,
    ) -> torch.Tensor:
        """`LeanLlama.hidden` through the lanes (rows lane-major); differentiable in the lanes'
        weights (no in-place op on a tensor autograd needs)."""
        B, T = input_ids.shape
        N, b = self.num_lanes, self._rows(B)
        S = cache_pos + T
        dev = input_ids.device
        if position_ids is None:
            if attention_mask is not None:
                position_ids = positions_from_mask(attention_mask)[:, -T:]
            else:
                position_ids = torch.arange(cache_pos, S, device=dev).expand(B, T)
        cos, sin = self.rope(position_ids)
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
        padded = attention_mask is not None and not bool(attention_mask.all())
        use_causal = cache_pos == 0 and not padded
        attn_mask = None
        if not use_causal:
            q_slot = torch.arange(cache_pos, S, device=dev)
            k_slot = torch.arange(S, device=dev)
            visible = (k_slot[None, :] <= q_slot[:, None]).expand(B, T, S)
            if padded:
                visible = visible & attention_mask.bool()[:, None, :]
                visible = visible | (k_slot[None, :] == q_slot[:, None])
            attn_mask = torch.zeros(B, 1, T, S, dtype=self.embed.dtype, device=dev)
            attn_mask.masked_fill_(~visible.unsqueeze(1), float("-inf"))
        if cache is not None:
            if cache_pos == 0:
                cache.mask.zero_()
            if attention_mask is not None:
                pad = attention_mask[:, cache_pos:S] == 0
                cache.mask[:, :, 0, cache_pos:S].masked_fill_(pad[:, None, :], float("-inf"))
        Hq, Hkv, D, Im, H = (self.num_heads, self.num_kv_heads, self.head_dim, self.mlp_width,
                             self.hidden_size)  # fmt: skip
        nqk, half = Hq + Hkv, D // 2
        x = F.embedding(input_ids, self.embed).view(N, b * T, H)
        for i, (wqkv_t, wo_t, wgu_t, wd_t) in enumerate(self._lane_layers):
            qkv = torch.bmm(self.normalized(x), wqkv_t).view(B, T, Hq + 2 * Hkv, D)
            qk = qkv[:, :, :nqk]
            qk = qk * cos + qk.roll(half, -1) * sin
            q = qk[:, :, :Hq].transpose(1, 2)
            if cache is not None:
                k, v = cache.layers[i]
                k[:, :, cache_pos:S].copy_(qk[:, :, Hq:].transpose(1, 2))
                v[:, :, cache_pos:S].copy_(qkv[:, :, nqk:].transpose(1, 2))
                k, v = k[:, :, :S], v[:, :, :S]
            else:
                k, v = qk[:, :, Hq:].transpose(1, 2), qkv[:, :, nqk:].transpose(1, 2)
            a = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=use_causal, enable_gqa=Hkv != Hq
            )
            x = torch.baddbmm(x, a.transpose(1, 2).reshape(N, b * T, Hq * D), wo_t)
            gu = torch.bmm(self.normalized(x), wgu_t)
            x = torch.baddbmm(x, F.silu(gu[..., :Im]) * gu[..., Im:], wd_t)
        return self.normalized(x).view(B, T, H)

    @torch.no_grad()
    def decode(
        self, tokens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache,
        slot: int, record=None, step: int = 0,
    ) -> torch.Tensor:  # fmt: skip
        """`LeanLlama.decode` through the lanes: one batched matmul per weight for all lanes."""
        if record is not None:
            raise ValueError("LaneLlama.decode: no decode record (lanes compute their forward)")
        B = tokens.shape[0]
        N, b = self.num_lanes, self._rows(B)
        Hq, Hkv, D, Im, H = (self.num_heads, self.num_kv_heads, self.head_dim, self.mlp_width,
                             self.hidden_size)  # fmt: skip
        nqk, G, half, cur = Hq + Hkv, Hq // Hkv, D // 2, slot + 1
        scale = D**-0.5
        mask = cache.mask.view(B * Hkv, 1, -1)[..., :cur]
        x = F.embedding(tokens, self.embed).view(N, b, H)
        for (wqkv_t, wo_t, wgu_t, wd_t), (k, v) in zip(self._lane_layers, cache.layers,
                                                       strict=True):  # fmt: skip
            qkv = torch.bmm(self.normalized(x), wqkv_t).view(B, Hq + 2 * Hkv, D)
            qk = qkv[:, :nqk]
            rot = qk.roll(half, -1)
            qk.mul_(cos).addcmul_(rot, sin)
            k.select(2, slot).copy_(qkv[:, Hq:nqk])
            v.select(2, slot).copy_(qkv[:, nqk:])
            q = qkv[:, :Hq].reshape(B * Hkv, G, D).to(k.dtype)
            kc = k[:, :, :cur].view(B * Hkv, cur, D)
            vc = v[:, :, :cur].view(B * Hkv, cur, D)
            att = torch.baddbmm(mask, q, kc.transpose(1, 2), alpha=scale).softmax(-1)
            a = torch.bmm(att, vc).view(N, b, Hq * D)
            x = torch.baddbmm(x, a, wo_t)
            gu = torch.bmm(self.normalized(x), wgu_t)
            x = torch.baddbmm(x, F.silu(gu[..., :Im]).mul_(gu[..., Im:]), wd_t)
        return F.linear(self.normalized(x).view(B, H), self.lm_head)
