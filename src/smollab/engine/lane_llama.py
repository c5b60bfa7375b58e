"""Lanes: N LoRA policies on one frozen Llama base, run as one batched model.

Why: at the sizes smollab trains, a decode step is ~130 tiny ops whose arithmetic takes a fraction
of their time, so N runs in N processes pay N times the framework overhead for the same work.
Here the N policies' rows form one batch (lane-major: rows [l * b, (l + 1) * b) are lane l's), and
every op of the forward covers all lanes at once.

Layout. A fused weight of the base (`LeanLlama`'s layout: qkv and gate-up fused, RMSNorm weights
folded in) is shared: one matmul over every lane's rows. Each lane adds its LoRA as low-rank
factors stacked with the lane dimension first, the parts of a fused weight side by side (A of q,
k and v stacked, their B block-diagonal in the fused row layout, norm weights folded into A and
the LoRA scaling into B): `y = x @ W.T`, then `y += bmm(bmm(x, A.T), B.T)` per lane, three ops
per weight for all lanes. The factors are built from each policy's PEFT parameters once per step;
lanes may have different ranks (zero-padded). The alternative, each lane's LoRA merged into its
own copy of the weights (one batched matmul per weight), decoded 1.05x slower on the dev CPU (8
lanes x 32 rows x 64 tokens, 1 thread: 1.42 s against 1.35 s) and makes the backward compute a
full weight gradient per lane, which the low-rank factors do not need. The embedding, the LM head
and the final norm are the base's (LoRA does not adapt them), as are the attention and its KV
cache layout.

Gradients: `load_lanes(policies)` under grad builds the factors from each policy's PEFT
`lora_A` / `lora_B` parameters, so a loss on the lanes' log-probs backpropagates into each
policy's own adapter: lane l's rows touch only lane l's factors, so its gradient is its own.
As in `smollab grpo`, the decode can record its matmul outputs (`DecodeRecord`) and the first
training forward of a batch replays them (`layers(..., record=)`, `replay.replay_lanes_logprobs`):
each linear returns its recorded value and backpropagates as base plus low-rank update.
The reference (the base with adapters off) is the inherited `LeanLlama` forward: this module is
a `LeanLlama` holding the base weights, plus the lanes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from smollab.engine.decode_record import DecodeRecord
from smollab.engine.kv_cache import KVCache
from smollab.engine.lean_llama import LeanLlama, additive_mask
from smollab.engine.replay import RecordedResidual, RecordedRope, RecordedSwiGLU
from smollab.engine.rollout import distinct_prompts
from smollab.models.hf_weights import effective_weight, unwrap_hf

__all__ = ["LaneLlama"]

# PEFT module of each LoRA target, per fused weight: (weight, [(target, layer module path)])
_QKV = (("q", "self_attn.q_proj"), ("k", "self_attn.k_proj"), ("v", "self_attn.v_proj"))
_GU = (("gate", "mlp.gate_proj"), ("up", "mlp.up_proj"))


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

    a = torch.stack([torch.stack([padded(m.lora_A["default"].weight, 0) for m in lane])
                     for lane in mods])  # fmt: skip
    b = torch.stack([torch.stack([padded(m.lora_B["default"].weight, 1) for m in lane])
                     for lane in mods])  # fmt: skip
    scale = torch.tensor([lane[0].scaling["default"] for lane in mods], device=a.device)
    return a, b * scale.view(-1, 1, 1, 1).to(b.dtype)


class LaneLlama(LeanLlama):
    """A `LeanLlama` of the base weights plus N lanes of LoRA policies.

    lanes = LaneLlama.from_hf(policy, adapters=False)   # the base, once
    each step: lanes.load_lanes(policies)                # no grad: for the sampler
               Sampler(lanes).generate(rows of all lanes, lane-major)
               with grad: lanes.load_lanes(policies); logprobs(lanes, ...)  # per-lane gradients
    `forward`, `hidden` and `decode` use the lanes; `LeanLlama.hidden(lanes, ...)` the base.
    """

    def __init__(self, config, *, device=None, dtype: torch.dtype | None = None):
        super().__init__(config, device=device, dtype=dtype)
        self.num_lanes = 0
        self._lane_layers: list[tuple] = []
        self.register_buffer("ln1", torch.ones(self.num_layers, self.hidden_size,
                                               device=self.embed.device), persistent=False)  # fmt: skip
        self.register_buffer("ln2", torch.ones_like(self.ln1), persistent=False)

    @torch.no_grad()
    def load_from_hf(self, model: nn.Module, *, adapters: bool = True) -> LaneLlama:
        """The base weights (and the norm weights the lanes' LoRA factors fold in)."""
        super().load_from_hf(model, adapters=adapters)
        for i, layer in enumerate(unwrap_hf(model).model.layers):
            self.ln1[i].copy_(effective_weight(layer.input_layernorm))
            self.ln2[i].copy_(effective_weight(layer.post_attention_layernorm))
        return self

    # ------------------------------------------------------------------ lanes
    def load_lanes(self, policies: Sequence[nn.Module]) -> None:
        """Each policy's LoRA as its lane's low-rank factors (differentiable under grad).

        policies: PEFT models of this base (adapter "default"), one per lane, in lane order.
        Only LoRA on the layers' linears is supported; the rest of each policy must be the base.
        """
        layers = [list(unwrap_hf(p).model.layers) for p in policies]
        if any(len(lane) != self.num_layers for lane in layers):
            raise ValueError(f"every lane's policy must have {self.num_layers} layers")
        N, L, Im, Imp = len(policies), self.num_layers, self.intermediate_size, self.mlp_width
        out = {"q": self.num_heads * self.head_dim, "k": self.num_kv_heads * self.head_dim,
               "v": self.num_kv_heads * self.head_dim, "gate": Im, "up": Im,
               "o": self.hidden_size, "down": self.hidden_size}  # fmt: skip
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
            (self.wqkv, fused(_QKV, self.ln1[None, :, None, :], pad_rows=False)),
            (self.wo, fused((("o", "self_attn.o_proj"),), None, pad_rows=False)),
            (self.wgu, fused(_GU, self.ln2[None, :, None, :], pad_rows=True)),
            (self.wd, fused((("down", "mlp.down_proj"),), None, pad_rows=False, pad_in=pad)),
        )
        self.num_lanes = N
        self._lane_layers = [  # per layer and fused weight: (A.T, B.T), or None (the base alone)
            tuple(None if ab is None else (ab[0][:, i].transpose(1, 2), ab[1][:, i].transpose(1, 2))
                  for _, ab in weights)
            for i in range(L)
        ]  # fmt: skip

    def _linear(self, x: torch.Tensor, i: int, k: int, residual: torch.Tensor | None = None,
                out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
        """Lane-major rows x [N, rows, in] through fused weight k (qkv, o, gu, d) of layer i,
        plus `residual` [N, rows, out] when given: each lane's rows through its own adapter.
        out: [N * rows, out] to write the result into (the decode's record; no grad)."""
        w_t = self._layers[i][k]  # the shared base: one matmul over every lane's rows
        x2 = x.reshape(-1, x.shape[-1])
        if residual is None:
            y = torch.mm(x2, w_t, out=out)
        else:
            y = torch.addmm(residual.reshape(-1, w_t.shape[1]), x2, w_t, out=out)
        y = y.view(x.shape[0], x.shape[1], -1)
        lane = self._lane_layers[i][k]  # mm and addmm keep no output for autograd: add in place
        return y if lane is None else y.baddbmm_(torch.bmm(x, lane[0]), lane[1])

    def _rows(self, B: int) -> int:
        if not self.num_lanes:
            raise RuntimeError("LaneLlama: load_lanes(policies) first")
        if B % self.num_lanes:
            raise ValueError(f"a batch of {B} rows does not split into {self.num_lanes} lanes")
        return B // self.num_lanes

    def prefill_distinct(self, *args, **kwargs):
        """Refused: a prompt shared across lanes would run through one lane's adapter only (the
        lanes share prompts within each lane: `prefill_logits`)."""
        raise NotImplementedError("LaneLlama: lanes see a prompt each through their own adapter; "
                                  "pass share_prompts=False")  # fmt: skip

    def prefill_logits(self, ids: torch.Tensor, mask: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """`LeanLlama.prefill_logits` with each distinct prompt run once per lane (its rows see
        it through their lane's adapter)."""
        u_ids, u_mask, rows = distinct_prompts(ids, mask, lanes=self.num_lanes)
        h = LeanLlama.prefill_distinct(self, u_ids, u_mask, rows, cache)[:, -1]
        return F.linear(h, self.lm_head)[rows]

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
        cos, sin, visible = self.attention_inputs(input_ids, attention_mask, position_ids, cache,
                                                  cache_pos)  # fmt: skip
        x = F.embedding(input_ids, self.embed).view(self.num_lanes, self._rows(B) * T, -1)
        return self.layers(x, cos, sin, visible, cache=cache,
                           cache_pos=cache_pos)[0]  # fmt: skip

    def layers(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, visible: torch.Tensor | None,
        *, cache: KVCache | None = None, cache_pos: int = 0, prefix: list | None = None,
        record: list | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:  # fmt: skip
        """The decoder layers over lane-major rows x [N, b * T, H] (embedded).

        cos, sin: [B, T, 1, D] rope rows; visible: bool attention mask [B, 1, T, S], None for
        causal.
        cache: k, v written to slots [cache_pos, S) and attention over [0, S) (no grad).
        prefix: per layer the (k, v) [B, kv_heads, S - T, D] of earlier slots (with grad).
        record: per layer the decode's recorded (qkv, x_attn, gu, x_mlp) values [N, b * T, n]
        of these rows: the linears return them and backpropagate as computed (`engine.replay`).
        Returns (the normalized output [B, T, H], per layer the (k, v) of these T tokens).
        """
        B, T = cos.shape[:2]
        N = x.shape[0]
        Hq, Hkv, D, Im = self.num_heads, self.num_kv_heads, self.head_dim, self.mlp_width
        nqk, half, S = Hq + Hkv, D // 2, cache_pos + T
        attn_mask = None if visible is None else additive_mask(visible, x.dtype)
        if record is not None:  # the recorded RoPE's backward reads rows in the lanes' layout
            cos_l, sin_l = cos.reshape(N, -1, 1, D), sin.reshape(N, -1, 1, D)
        kv = []
        for i in range(self.num_layers):
            got = None if record is None else record[i]
            if got is None:
                qkv = self._linear(self.normalized(x), i, 0).view(B, T, Hq + 2 * Hkv, D)
                qk = qkv[:, :, :nqk]
                qk = qk * cos + qk.roll(half, -1) * sin
            else:
                qkv = RecordedRope.apply(self.normalized(x), got[0], cos_l, sin_l, nqk * D,
                                          *self._weights(i, 0)).view(B, T, Hq + 2 * Hkv, D)  # fmt: skip
                qk = qkv[:, :, :nqk]
            q = qk[:, :, :Hq].transpose(1, 2)
            k, v = qk[:, :, Hq:].transpose(1, 2), qkv[:, :, nqk:].transpose(1, 2)
            kv.append((k, v))
            if cache is not None:
                ck, cv = cache.layers[i]
                ck[:, :, cache_pos:S].copy_(k)
                cv[:, :, cache_pos:S].copy_(v)
                k, v = ck[:, :, :S], cv[:, :, :S]
            elif prefix is not None:
                k, v = torch.cat([prefix[i][0], k], 2), torch.cat([prefix[i][1], v], 2)
            a = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=attn_mask is None, enable_gqa=Hkv != Hq
            )
            a = a.transpose(1, 2).reshape(N, -1, Hq * D)
            if got is None:
                x = self._linear(a, i, 1, x)
                gu = self._linear(self.normalized(x), i, 2)
                x = self._linear(F.silu(gu[..., :Im]) * gu[..., Im:], i, 3, x)
            else:
                x = RecordedResidual.apply(a, got[1], x, *self._weights(i, 1))
                act = RecordedSwiGLU.apply(self.normalized(x), got[2], Im, *self._weights(i, 2))
                x = RecordedResidual.apply(act, got[3], x, *self._weights(i, 3))
        return self.normalized(x).view(B, T, -1), kv

    def _weights(self, i: int, k: int) -> tuple[torch.Tensor, ...]:
        """Fused weight k of layer i as the recorded linears take it: (base [out, in],) plus
        the lanes' (A.T, B.T) when they adapt it."""
        base = (self.wqkv, self.wo, self.wgu, self.wd)[k][i]
        lane = self._lane_layers[i][k]
        return (base,) if lane is None else (base, *lane)

    @torch.no_grad()
    def decode(
        self, tokens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache,
        slot: int, record: DecodeRecord | None = None, step: int = 0,
    ) -> torch.Tensor:  # fmt: skip
        """`LeanLlama.decode` through the lanes: one batched matmul per weight for all lanes;
        with a `record`, its matmul outputs written to the record's column `step`."""
        B = tokens.shape[0]
        N, b = self.num_lanes, self._rows(B)
        Hq, Hkv, D, Im, H = (self.num_heads, self.num_kv_heads, self.head_dim, self.mlp_width,
                             self.hidden_size)  # fmt: skip
        nqk, G, half, cur = Hq + Hkv, Hq // Hkv, D // 2, slot + 1
        scale = D**-0.5
        mask = cache.mask.view(B * Hkv, 1, -1)[..., :cur]
        outs = [(None,) * 4] * self.num_layers if record is None else record.step_views(step)
        x = F.embedding(tokens, self.embed).view(N, b, H)
        for i, ((k, v), (o_qkv, o_gu, o_attn, o_mlp)) in enumerate(zip(cache.layers, outs,
                                                                       strict=True)):  # fmt: skip
            qkv = self._linear(self.normalized(x), i, 0, out=o_qkv).view(B, Hq + 2 * Hkv, D)
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
            x = self._linear(a, i, 1, x, o_attn)
            gu = self._linear(self.normalized(x), i, 2, out=o_gu)
            x = self._linear(F.silu(gu[..., :Im]).mul_(gu[..., Im:]), i, 3, x, o_mlp)
        return F.linear(self.normalized(x).view(B, H), self.lm_head)
