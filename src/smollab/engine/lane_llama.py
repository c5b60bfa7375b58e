"""Lanes: N policies of one Llama architecture run as one batched model (LoRA or full).

Why: at the sizes smollab trains, a decode step is ~130 tiny ops whose arithmetic takes a fraction
of their time, so N runs in N processes pay N times the framework overhead for the same work.
Here the N policies' rows form one batch (lane-major: rows [l * b, (l + 1) * b) are lane l's), and
every op of the forward covers all lanes at once.

LoRA lanes. A fused weight of the base (`LeanLlama`'s layout: qkv and gate-up fused, RMSNorm
weights folded in) is shared: one matmul over every lane's rows. Each lane adds its LoRA as
low-rank factors stacked with the lane dimension first (`lane_weights.lora_lanes`): `y = x @ W.T`,
then `y += bmm(bmm(x, A.T), B.T)` per lane, three ops per weight for all lanes. Lanes may have
different ranks (zero-padded). The alternative, each lane's LoRA merged into its own copy of the
weights (one batched matmul per weight), decoded 1.05x slower on the dev CPU (8 lanes x 32 rows x
64 tokens, 1 thread: 1.42 s against 1.35 s) and makes the backward compute a full weight
gradient per lane, which the low-rank factors do not need. The embedding, the LM head and the
final norm are the base's (LoRA does not adapt them).

Full lanes (full fine-tuning): each lane has its own copy of every weight in the same layout,
stacked [N, in, out] (`lane_weights.full_lanes`): one batched matmul per weight, and each lane's
embedding and LM head. The attention and its KV cache layout are the same for both kinds.

Gradients: `load_lanes(policies)` under grad builds the lane tensors from each policy's
parameters, so a loss on the lanes' log-probs backpropagates into each policy's own: lane l's
rows touch only lane l's tensors, so its gradient is its own. As in `smollab grpo`, the decode
can record its matmul outputs (`DecodeRecord`) and the first training forward of a batch
replays them (`layers(..., record=)`, `replay.lanes_logprobs`): each linear
returns its recorded value and backpropagates as the lane's weights would. The reference (the
starting policy: the base) is the inherited `LeanLlama` forward: this module is a `LeanLlama`
holding the base weights, plus the lanes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from smollab.engine.decode_record import DecodeRecord
from smollab.engine.kv_cache import KVCache
from smollab.engine.lane_weights import FullLanes, full_lanes, lora_lanes
from smollab.engine.lean_llama import LeanLlama, additive_mask
from smollab.engine.replay import RecordedResidual, RecordedRope, RecordedSwiGLU
from smollab.engine.rollout import distinct_prompts
from smollab.models.hf_weights import effective_weight, unwrap_hf

__all__ = ["LaneLlama"]


class LaneLlama(LeanLlama):
    """A `LeanLlama` of the base weights plus N lanes of policies (LoRA on it, or full).

    lanes = LaneLlama.from_hf(policy, adapters=False)   # the base, once
    each step: lanes.load_lanes(policies)                # no grad: for the sampler
               Sampler(lanes).generate(rows of all lanes, lane-major)
               with grad: lanes.load_lanes(policies); logprobs(lanes, ...)  # per-lane gradients
    `forward`, `hidden` and `decode` use the lanes; `LeanLlama.hidden(lanes, ...)` the base.
    """

    def __init__(self, config, *, device=None, dtype: torch.dtype | None = None):
        super().__init__(config, device=device, dtype=dtype)
        self.num_lanes = 0
        self._lane_layers: list[tuple] = []  # per layer and fused weight (`lane_weights`)
        self._full: FullLanes | None = None  # full lanes: each lane's every tensor
        self.register_buffer(
            "ln1", torch.ones_like(self.embed[0]).expand(self.num_layers, -1).clone(), False
        )
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
        """Each policy as its lane (differentiable under grad): a PEFT model of this base
        (adapter "default", LoRA on the layers' linears only) as its low-rank factors, or a full
        model of this architecture as its own copy of every weight. All lanes are of one kind.
        """
        lora = [hasattr(p, "peft_config") for p in policies]
        if any(lora) and not all(lora):
            raise ValueError("lanes are all LoRA policies or all full ones, not a mix")
        if any(len(unwrap_hf(p).model.layers) != self.num_layers for p in policies):
            raise ValueError(f"every lane's policy must have {self.num_layers} layers")
        self.num_lanes = len(policies)
        self._lane_layers, self._full = [], None  # freed first
        if all(lora):
            self._lane_layers = lora_lanes(self, policies)
        else:
            self._full = full_lanes(self, policies)
            self._lane_layers = self._full.layers

    def _linear(
        self,
        x: torch.Tensor,
        i: int,
        k: int,
        residual: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Lane-major rows x [N, rows, in] through fused weight k (qkv, o, gu, d) of layer i,
        plus its bias and `residual` [N, rows, out] when given: each lane's rows through its own
        weights (the base plus its low-rank update, or its own copy).
        out: [N * rows, out] to write the result into (the decode's record; no grad)."""
        lane = self._lane_layers[i][k]
        if self._full is not None:  # full lanes: each lane's own weight and bias
            bias = self._full.biases[i][k]
            o = None if out is None else out.view(x.shape[0], x.shape[1], -1)
            if residual is None and bias is None:
                return torch.bmm(x, lane[0], out=o)
            y = torch.baddbmm(bias[:, None] if residual is None else residual, x, lane[0], out=o)
            return y if residual is None or bias is None else y.add_(bias[:, None])
        w_t, bias = self._layers[i][k], self._biases[i][k]  # the shared base: one matmul
        x2 = x.reshape(-1, x.shape[-1])
        if residual is None:
            y = torch.mm(x2, w_t, out=out) if bias is None else torch.addmm(bias, x2, w_t, out=out)
        else:
            y = torch.addmm(residual.reshape(-1, w_t.shape[1]), x2, w_t, out=out)
            y = y if bias is None else y.add_(bias)
        y = y.view(x.shape[0], x.shape[1], -1)
        # mm and addmm keep no output for autograd: the low-rank update is added in place
        return y if lane is None else y.baddbmm_(torch.bmm(x, lane[0]), lane[1])

    def _qk_normed(self, qk: torch.Tensor, i: int) -> torch.Tensor:
        """Layer i's q/k norm (Qwen3) of qk [B, ..., heads, D], lane-major rows: each lane's
        own weights (full lanes) or the base's."""
        normed = self.normalized(qk)
        if self._full is None:
            return normed * self._heads[i][0]
        w = self._full.qk_norms[i]  # [N, heads, D]
        lanes = normed.view(self.num_lanes, -1, *qk.shape[-2:]) * w[:, None]
        return lanes.view(qk.shape)

    def _rows(self, B: int) -> int:
        if not self.num_lanes:
            raise RuntimeError("LaneLlama: load_lanes(policies) first")
        if B % self.num_lanes:
            raise ValueError(f"a batch of {B} rows does not split into {self.num_lanes} lanes")
        return B // self.num_lanes

    def prefill_distinct(self, *args, **kwargs):
        """Refused: a prompt shared across lanes would run through one lane's weights only (the
        lanes share prompts within each lane: `prefill_logits`, `replay.lanes_logprobs`)."""
        raise NotImplementedError(
            "LaneLlama: lanes see a prompt each through their own weights; pass share_prompts=False"
        )

    def prefill_logits(self, ids: torch.Tensor, mask: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """`LeanLlama.prefill_logits` with each distinct prompt run once per lane (its rows see
        it through their lane's weights)."""
        u_ids, u_mask, rows = distinct_prompts(ids, mask, lanes=self.num_lanes)
        h = LeanLlama.prefill_distinct(self, u_ids, u_mask, rows, cache)[:, -1]
        return self.logits_of(h)[rows]

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
        cos, sin, visible = self.attention_inputs(
            input_ids, attention_mask, position_ids, cache, cache_pos
        )
        self._rows(B)  # refuses a batch that does not split into the lanes
        x = self.embedded(input_ids)
        return self.layers(x, cos, sin, visible, cache=cache, cache_pos=cache_pos)[0]

    def layers(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        visible: torch.Tensor | None,
        *,
        cache: KVCache | None = None,
        cache_pos: int = 0,
        prefix: list | None = None,
        record: list | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
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
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        attn_mask = None if visible is None else additive_mask(visible, x.dtype)
        if record is not None:  # the recorded RoPE's backward reads rows in the lanes' layout
            cos_l, sin_l = cos.reshape(N, -1, 1, D), sin.reshape(N, -1, 1, D)
        kv = []
        for i in range(self.num_layers):
            got = None if record is None else record[i]
            normed, rotate = self._heads[i][0] is not None, self._heads[i][1]
            if got is None:
                qkv = self._linear(self.normalized(x), i, 0).view(B, T, Hq + 2 * Hkv, D)
            else:  # the record rotated q and k in place unless a q/k norm came first
                n_rot = nqk * D if rotate and not normed else 0
                qkv = RecordedRope.apply(
                    self.normalized(x), got[0], cos_l, sin_l, n_rot, *self._weights(i, 0)
                ).view(B, T, Hq + 2 * Hkv, D)
            qk = qkv[:, :, :nqk]
            if normed:
                qk = self._qk_normed(qk, i)
            if rotate and (got is None or normed):
                qk = qk * cos + qk.roll(half, -1) * sin
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

    def _weights(self, i: int, k: int) -> tuple[torch.Tensor | None, ...]:
        """Fused weight k of layer i as the recorded linears take it: its bias (None: none),
        then (base [out, in],) plus the lanes' (A.T, B.T) when they adapt it; full lanes: each
        lane's bias [N, out] and (weight [N, out, in],)."""
        lane = self._lane_layers[i][k]
        if self._full is not None:
            return self._full.biases[i][k], lane[0].transpose(1, 2)
        base = (self.wqkv, self.wo, self.wgu, self.wd)[k][i]
        return (self._biases[i][k], base) if lane is None else (self._biases[i][k], base, *lane)

    def embedded(self, ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings of lane-major rows `ids` [N * b, ...] as [N, b * ..., H]."""
        N, H = self.num_lanes, self.hidden_size
        if self._full is None:
            return F.embedding(ids, self.embed).view(N, -1, H)
        offsets = torch.arange(N, device=ids.device).view(N, 1) * self.vocab_size
        return F.embedding(ids.reshape(N, -1) + offsets, self._full.embed.view(-1, H))

    def logits_of(self, h: torch.Tensor) -> torch.Tensor:
        """Logits [..., V] of final hidden states h [N * b, ..., H], lane-major, each lane
        through its own head (full lanes) or the shared one."""
        if self._full is None:
            return super().logits_of(h)
        hn = h.reshape(self.num_lanes, -1, h.shape[-1])
        return torch.bmm(hn, self._full.head.transpose(1, 2)).view(*h.shape[:-1], -1)

    def _build_views(self) -> None:
        """`LeanLlama`'s, with the packed head off: 8 LoRA lanes of the 1.25M model (256 rows x
        64 tokens) measured 0.86x and 1.03x their F.linear time with it (benchmarks/packed_head.py;
        `use_packed_head = True` turns it on for LoRA lanes)."""
        super()._build_views()
        self.use_packed_head = False

    def head_reason(self, decode: str) -> str:
        if self._full is not None:
            return "lm head: each full lane's own, one batched matmul"
        if not self.use_packed_head:
            return "lm head: F.linear (LoRA lanes: the packed head measured no faster at 256 rows)"
        return super().head_reason(decode)

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head [V, H], or the lanes' own [N, V, H] (full lanes)."""
        return self.lm_head if self._full is None else self._full.head

    @torch.no_grad()
    def decode(
        self,
        tokens: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        slot: int | torch.Tensor,
        record: DecodeRecord | None = None,
        step: int | torch.Tensor = 0,
    ) -> torch.Tensor:
        """`LeanLlama.decode` through the lanes: one batched matmul per weight for all lanes;
        with a `record`, its matmul outputs written to the record's column `step`. Tensor slot
        and step: the static step, as there."""
        B = tokens.shape[0]
        N, b = self.num_lanes, self._rows(B)
        Hq, Hkv, D, Im, H = (
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.mlp_width,
            self.hidden_size,
        )
        nqk, G, half = Hq + Hkv, Hq // Hkv, D // 2
        scale = D**-0.5
        mask = cache.decode_mask(slot)
        outs = [(None,) * 4] * self.num_layers if record is None else record.step_views(step)
        x = self.embedded(tokens)
        for i, (o_qkv, o_gu, o_attn, o_mlp) in enumerate(outs):
            qkv = self._linear(self.normalized(x), i, 0, out=o_qkv).view(B, Hq + 2 * Hkv, D)
            qk = qkv[:, :nqk]
            if self._heads[i][0] is not None:  # the record keeps the projection
                qk = self._qk_normed(qk, i)
            if self._heads[i][1]:
                rot = qk.roll(half, -1)
                qk.mul_(cos).addcmul_(rot, sin)
            kc, vc = cache.write(i, slot, qk[:, Hq:], qkv[:, nqk:])
            q = qk[:, :Hq].reshape(B * Hkv, G, D).to(kc.dtype)
            att = torch.baddbmm(mask, q, kc.transpose(1, 2), alpha=scale).softmax(-1)
            a = torch.bmm(att, vc).view(N, b, Hq * D)
            x = self._linear(a, i, 1, x, o_attn)
            gu = self._linear(self.normalized(x), i, 2, out=o_gu)
            x = self._linear(F.silu(gu[..., :Im]).mul_(gu[..., Im:]), i, 3, x, o_mlp)
        h = self.normalized(x).view(B, H)
        return self.logits_of(h) if self._full is not None else self.decode_logits(h)
