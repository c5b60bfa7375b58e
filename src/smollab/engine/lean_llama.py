"""A lean pure-PyTorch Llama-family forward that reads HF weights exactly.

Why it exists: at the small shapes smollab trains (SimpleStories 1.25M: hidden 128, 4 layers) an
HF Llama decode step is ~900 tensor ops, nearly all framework overhead. This module does the same
arithmetic in ~15 ops per layer: fused qkv and gate-up weights, RMSNorm weights folded into the
matmul after them, RoPE from precomputed cos/sin tables applied in place, a preallocated KV cache,
SDPA, and residual adds fused into `addmm`. Tests assert logit parity with HF (1e-5) for full
forwards, left padding, incremental decode and PEFT LoRA merges, on Llama and on replicas of
every family `lean_config` reads (Qwen2/2.5, Qwen3, SmolLM2, SmolLM3, Llama 3.2).

What the families add (`lean_config.LeanSpec`), each only where a model has it, so a plain Llama
runs the same ops as before: biases (a bias-free matmul becomes `addmm` with the bias, the same
one op; an o or down bias after a residual `addmm` is one add), Qwen3's per-head q/k RMSNorm
(normalized like the hidden states, times the per-head weights, before RoPE), NoPE layers
(SmolLM3: RoPE skipped) and RoPE tables from transformers' own rotary embedding (scaled types).

Two exact rewrites make it faster than the same arithmetic done as written:
- RMSNorm(x) @ W.T = (x * rsqrt(mean(x^2) + eps)) @ (W * norm_weight).T, so the norm weights live
  in the next matmul and a norm is 4 ops (PyTorch's CPU `rms_norm` is 7): decoding measured
  1.16x faster for it.
- The MLP width is padded to a multiple of 8 with zero weights (silu(0) * 0 = 0 adds nothing):
  at the SimpleStories-1.25M width 341 the fused gate-up matmul [2336, 128] @ [128, 682] took
  5.1 ms on the dev CPU and the padded 688-wide one 3.2 ms.

Conventions
- Left padding. Positions default to `cumsum(attention_mask) - 1` (what HF `generate` uses), so a
  left-padded row gets the same logits as the unpadded row. HF's plain `forward` without
  `position_ids` uses `arange` instead; pass `position_ids` to it to compare.
- The KV cache holds per layer `k` and `v` [B, kv_heads, max_len, head_dim] and the additive
  padding mask of its slots. Slots are shared by all rows (slot s holds column s of the padded
  batch); a row's padding slots are masked.
- Weights are copied, never shared: `load_from_hf` can run every training step (~1M parameters).
- Inference only: parameters have `requires_grad=False`; run it under `torch.inference_mode()`.
- dtype: the policy's own (an fp32 policy gives an fp32 copy, a bf16 one a bf16 copy), so the
  decode record the replay reads has the dtype of the graph it joins.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from smollab.engine.decode_record import DecodeRecord
from smollab.engine.kv_cache import KVCache
from smollab.engine.lean_config import lean_spec
from smollab.engine.rollout import distinct_prompts
from smollab.models.hf_weights import effective_bias, effective_weight, unwrap_hf

__all__ = [
    "LayerWeights",
    "LeanLlama",
    "additive_mask",
    "fused_layer_weights",
    "head_choice",
    "pack_head",
    "packed_logits",
    "positions_from_mask",
]

# The decode's LM head through oneDNN's packed linear, where it measured faster than F.linear
# (AMD EPYC, AVX-512, 1 thread, isolated matmuls x [rows, H] @ W [V, H].T, fp32): V 4,096 x H 128
# at 1-256 rows 1.2-1.5x; V 50,304 x H 768 at 8 rows 2.4-2.9x; V 151,936 x H 896 at 8-32 rows
# 2.7-3.4x. The layers' own matmuls (V 128-688 x H 128, 32 rows) measured slower packed (22.9 vs
# 13.6 us), so a head narrower than 4,096 rows keeps F.linear. Whole rollouts and the pack's cost
# (one reorder per weight load): benchmarks/packed_head.py, docs/architecture.md.
HEAD_PACK_MIN_VOCAB = 4096


def head_choice(weight: torch.Tensor) -> tuple[bool, str]:
    """(pack, reason): whether the decode's LM head `weight` [V, H] runs through oneDNN's packed
    linear, and why (the sampler's `decode_reason` says it)."""
    no = "lm head: F.linear"
    if weight.device.type != "cpu":
        return False, f"{no} (oneDNN's packed linear is a CPU path, not {weight.device.type}'s)"
    if weight.dtype != torch.float32:
        return (
            False,
            f"{no} (the packed head is measured and used in float32 only, not {weight.dtype})",
        )
    if not (
        torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    ):
        return False, f"{no} (this torch has no oneDNN linear)"
    if weight.shape[0] < HEAD_PACK_MIN_VOCAB:
        vocab = weight.shape[0]
        return False, f"{no} (vocab {vocab} < {HEAD_PACK_MIN_VOCAB}: packed measured slower there)"
    return True, (
        "lm head: oneDNN packed (whole rollouts measured 1.13-1.26x faster than with F.linear "
        "on CPU heads of 4k-152k words)"
    )


def pack_head(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """`weight` [V, H] reordered into oneDNN's blocked layout for `rows` input rows (an opaque
    tensor that only `packed_logits` reads; a copy the size of the weight)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows)


def packed_logits(h: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """h [rows, H] @ W.T through the packed weight `pack_head` made: F.linear(h, W) up to float
    rounding."""
    return torch.ops.mkldnn._linear_pointwise(h, packed, None, "none", [], "")


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean attention mask (True: visible) as SDPA's additive one (0 or -inf)."""
    mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device)
    return mask.masked_fill_(~visible, float("-inf"))


class LayerWeights(NamedTuple):
    """One decoder layer in the lean layout: weights [out, in] of the fused linears (qkv, o,
    gate-up, down), their biases [out] (None where the model has none), the q/k norm weights
    [q heads + kv heads, head_dim] (Qwen3; None without), and the two RMSNorm weights [hidden]."""

    qkv: torch.Tensor
    o: torch.Tensor
    gu: torch.Tensor
    d: torch.Tensor
    b_qkv: torch.Tensor | None
    b_o: torch.Tensor | None
    b_gu: torch.Tensor | None
    b_d: torch.Tensor | None
    qk_norm: torch.Tensor | None
    ln1: torch.Tensor
    ln2: torch.Tensor

    @property
    def linears(self) -> tuple[torch.Tensor, ...]:
        return self.qkv, self.o, self.gu, self.d

    @property
    def biases(self) -> tuple[torch.Tensor | None, ...]:
        return self.b_qkv, self.b_o, self.b_gu, self.b_d


def _cat(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The parts concatenated, None when all are None (a layer's absent biases)."""
    if all(p is None for p in parts):
        return None
    if any(p is None for p in parts):
        raise NotImplementedError("LeanLlama: a fused linear whose parts have a bias only in part")
    return torch.cat(parts)


def fused_layer_weights(
    layer: nn.Module, width: int, adapters: bool = True, fold_norms: bool = True
) -> LayerWeights:
    """An HF layer's weights in the lean layout (differentiable in its parameters): the MLP
    zero-padded to `width`; with `fold_norms` the RMSNorm weights folded into the qkv and gate-up
    weights (the lean forward's layout), else left to the norms (the replay's)."""
    w, b = partial(effective_weight, adapters=adapters), partial(effective_bias, adapters=adapters)
    att, mlp = layer.self_attn, layer.mlp
    ln1, ln2 = w(layer.input_layernorm), w(layer.post_attention_layernorm)
    wq = w(att.q_proj)
    qkv = torch.cat([wq, w(att.k_proj), w(att.v_proj)])
    gate, up = w(mlp.gate_proj), w(mlp.up_proj)
    if fold_norms:
        qkv, gate, up = qkv * ln1, gate * ln2, up * ln2
    pad = width - gate.shape[0]

    def padded(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else F.pad(t, (0, pad) if t.dim() == 1 else (0, 0, 0, pad))

    gu = torch.cat([padded(gate), padded(up)])
    qk_norm = None
    if hasattr(att, "q_norm"):  # per head: the q heads' weights, then the kv heads'
        qn, kn = w(att.q_norm), w(att.k_norm)
        D = qn.shape[0]
        heads = (wq.shape[0] // D, (qkv.shape[0] - wq.shape[0]) // (2 * D))
        qk_norm = torch.cat([qn.expand(heads[0], D), kn.expand(heads[1], D)])
    b_gu = (b(mlp.gate_proj), b(mlp.up_proj))
    return LayerWeights(
        qkv=qkv,
        o=w(att.o_proj),
        gu=gu,
        d=F.pad(w(mlp.down_proj), (0, pad)),
        b_qkv=_cat([b(att.q_proj), b(att.k_proj), b(att.v_proj)]),
        b_o=b(att.o_proj),
        b_gu=_cat([padded(t) for t in b_gu]),
        b_d=b(mlp.down_proj),
        qk_norm=qk_norm,
        ln1=ln1,
        ln2=ln2,
    )


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for a left-padded batch: cumsum(mask) - 1, padding clamped to 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_(min=0)


class LeanLlama(nn.Module):
    """Llama-family forward with fused weights. Build from an HF config, then `load_from_hf`."""

    def __init__(self, config, *, device=None, dtype: torch.dtype | None = None):
        super().__init__()
        self.spec = spec = lean_spec(config)  # refuses what the lean forward does not implement
        self.config = config
        H = self.hidden_size = config.hidden_size
        self.num_layers = L = config.num_hidden_layers
        self.num_heads = Hq = config.num_attention_heads
        self.num_kv_heads = Hkv = getattr(config, "num_key_value_heads", None) or Hq
        self.head_dim = D = getattr(config, "head_dim", None) or H // Hq
        if Hq % Hkv:
            raise ValueError(f"num_attention_heads {Hq} is not a multiple of kv heads {Hkv}")
        if D % 2:
            raise ValueError(f"head_dim {D} must be even for RoPE")
        self.intermediate_size = config.intermediate_size
        self.mlp_width = Im = -(-config.intermediate_size // 8) * 8  # padded with zero weights
        self.vocab_size = V = config.vocab_size
        self.eps = float(config.rms_norm_eps)
        device = torch.device("cpu") if device is None else torch.device(device)
        kw = {"device": device, "dtype": dtype or torch.float32}

        def p(*shape, present: bool = True):
            if not present:
                return None
            return nn.Parameter(torch.zeros(*shape, **kw), requires_grad=False)

        nqkv = (Hq + 2 * Hkv) * D
        self.embed = p(V, H)
        # Matmul weights after a norm carry that norm's weight in their columns.
        self.wqkv = p(L, nqkv, H)  # rows: q heads, k heads, v heads
        self.wo = p(L, H, Hq * D)
        self.wgu = p(L, 2 * Im, H)  # rows: gate, zero padding, up, zero padding
        self.wd = p(L, H, Im)
        self.lm_head = p(V, H)
        # Only what the model has (`LeanSpec`): None adds no op to the forward.
        self.bqkv = p(L, nqkv, present=spec.qkv_bias)
        self.bo = p(L, H, present=spec.o_bias)
        self.bgu = p(L, 2 * Im, present=spec.mlp_bias)
        self.bd = p(L, H, present=spec.mlp_bias)
        self.qk_norm = p(L, Hq + Hkv, D, present=spec.qk_norm)  # per head: q heads, k heads
        # float32 (or wider) whatever the weights: a half-precision x is normalized in float32
        eps_kw = {"device": device, "dtype": torch.promote_types(kw["dtype"], torch.float32)}
        self.register_buffer("eps_t", torch.tensor(self.eps, **eps_kw), persistent=False)
        self.register_buffer("rope_cos", torch.empty(0, device=device), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0, device=device), persistent=False)
        self.ensure_rope(getattr(config, "max_position_embeddings", 2048) or 2048)
        self._build_views()

    # ------------------------------------------------------------------ weights
    @classmethod
    def from_hf(cls, model: nn.Module, *, adapters: bool = True, device=None, dtype=None):
        """A LeanLlama with `model`'s weights (LoRA merged unless `adapters=False`).

        device: default the model's; dtype: default the dtype the model holds its weights in
        (its embedding's: a bf16 base with fp32 LoRA adapters gives a bf16 copy), so the
        sampler, its decode record and the reference compute in the policy's own dtype.
        """
        hf = unwrap_hf(model)
        embed = effective_weight(hf.model.embed_tokens, adapters)
        lean = cls(hf.config, device=device or embed.device, dtype=dtype or embed.dtype)
        return lean.load_from_hf(model, adapters=adapters)

    @torch.no_grad()
    def load_from_hf(self, model: nn.Module, *, adapters: bool = True) -> LeanLlama:
        """Copy weights from an HF causal LM of a family `lean_config` reads, or a PEFT model of one.

        With LoRA the copied weights are W + scaling * B @ A for each adapted module (active
        adapters only); `adapters=False` (or a model inside `disable_adapter()`) reads the base.
        """
        core = (hf := unwrap_hf(model)).model
        if len(core.layers) != self.num_layers:
            raise ValueError(f"model has {len(core.layers)} layers, LeanLlama {self.num_layers}")
        w = partial(effective_weight, adapters=adapters)
        self.embed.copy_(w(core.embed_tokens))
        lean = (self.wqkv, self.wo, self.wgu, self.wd, self.bqkv, self.bo, self.bgu, self.bd)
        names = ("q/k/v", "o", "gate/up", "down")
        for i, layer in enumerate(core.layers):
            fused = fused_layer_weights(layer, self.mlp_width, adapters)
            for k, (dst, src) in enumerate(zip(lean, fused.linears + fused.biases, strict=True)):
                if (dst is None) != (src is None):
                    has = "has no" if src is None else "has a"
                    raise ValueError(f"layer {i}'s {names[k % 4]} {has} bias, unlike its config")
                if dst is not None:
                    dst[i].copy_(src)
            if self.qk_norm is not None:
                self.qk_norm[i].copy_(fused.qk_norm)
        self.lm_head.copy_(w(hf.lm_head) * w(core.norm))
        self._head_pack = None  # packed again, from these weights, by the next decode
        return self

    def _build_views(self) -> None:
        """Per-layer views, so the hot loop does no indexing (rebuilt after .to()): `_layers` the
        transposed fused weights (qkv, o, gate-up, down), `_biases` their biases (None: none),
        `_heads` the q/k norm weights (None: none) and whether the layer applies RoPE."""

        def rows(t):
            return [None] * self.num_layers if t is None else list(t.unbind(0))

        self._layers = [
            (self.wqkv[i].t(), self.wo[i].t(), self.wgu[i].t(), self.wd[i].t())
            for i in range(self.num_layers)
        ]
        biases = (self.bqkv, self.bo, self.bgu, self.bd)
        self._biases = list(zip(*(rows(b) for b in biases), strict=True))
        self._heads = list(zip(rows(self.qk_norm), self.spec.rope_layers, strict=True))
        # the decode's packed head: whether (`head_choice`; False forces F.linear) and the pack
        self.use_packed_head, _ = head_choice(self.lm_head)
        self._head_pack: tuple[int, torch.Tensor] | None = None  # (rows, packed lm_head)

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._build_views()
        return out

    def normalized(self, x: torch.Tensor) -> torch.Tensor:
        """x * rsqrt(mean(x^2) + eps) over the last dim: RMSNorm without its weight (folded into
        the next matmul, or multiplied after it for the per-head q/k norms). A bf16 or fp16 x is
        normalized in float32 and cast back, as HF's RMSNorm does."""
        if x.dtype in (torch.bfloat16, torch.float16):
            return self.normalized(x.float()).to(x.dtype)
        n = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        return x * torch.addcmul(self.eps_t, n, n, value=1.0 / x.shape[-1]).rsqrt_()

    @torch.no_grad()
    def ensure_rope(self, max_positions: int) -> None:
        """cos/sin tables for positions [0, max_positions), computed exactly as HF does.

        `rope_sin` carries the sign of rotate_half: x * cos + roll(x, D/2) * rope_sin equals
        HF's x * cos + rotate_half(x) * sin. The frequencies and the factor on cos and sin are
        transformers' own (`LeanSpec`); the tables are computed in float32 on the CPU whatever the
        device (as HF computes its inv_freq), then copied: the same tables on every device.
        """
        if self.rope_cos.shape[0] >= max_positions:
            return
        D, device, cpu = self.head_dim, self.embed.device, torch.device("cpu")
        inv_freq, scaling = self.spec.inv_freq.to(cpu), self.spec.attention_scaling
        pos = torch.arange(max_positions, dtype=torch.float, device=cpu)
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if scaling != 1.0:  # yarn's attention factor, as HF applies it
            cos, sin = cos * scaling, sin * scaling
        sin[:, : D // 2].neg_()
        self.rope_cos = cos.to(device)
        self.rope_sin = sin.to(device)

    def rope(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin rows for `position_ids` (any shape) -> shape + [head_dim]."""
        need = int(position_ids.max()) + 1 if position_ids.numel() else 0
        if need > self.rope_cos.shape[0]:
            self.ensure_rope(max(need, 2 * self.rope_cos.shape[0]))
        return self.rope_cos[position_ids], self.rope_sin[position_ids]

    # ------------------------------------------------------------------ cache
    def new_cache(self, batch_size: int, max_len: int, dtype=None, device=None) -> KVCache:
        """An uninitialized cache; every slot is written before it is read."""
        kw = {"dtype": dtype or self.embed.dtype, "device": device or self.embed.device}
        shape = (self.num_layers, batch_size, self.num_kv_heads, max_len, self.head_dim)
        return KVCache.empty(*shape, **kw)

    def prefill_distinct(
        self, u_ids: torch.Tensor, u_mask: torch.Tensor, rows: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """Fill the prompt slots of `cache` ([B] rows) running each distinct prompt only once.

        u_ids, u_mask [U, P]: the distinct prompts; rows [B]: the distinct prompt of each row.
        Returns the hidden states [U, P, hidden] of the distinct prompts.
        """
        P = u_ids.shape[1]
        prompt_cache = self.new_cache(u_ids.shape[0], P, dtype=cache.dtype)
        h = self.hidden(u_ids, u_mask, cache=prompt_cache)
        cache.fill_from(prompt_cache, rows, P)
        return h

    def prefill_logits(self, ids: torch.Tensor, mask: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Next-token logits [B, V] after each left-padded prompt, its keys and values in `cache`.

        A batch that repeats prompts (GRPO's groups) runs each distinct prompt once.
        """
        u_ids, u_mask, rows = distinct_prompts(ids, mask)
        if u_ids.shape[0] < ids.shape[0]:
            h = self.prefill_distinct(u_ids, u_mask, rows, cache)[:, -1]
            return self.logits_of(h)[rows]
        return self(ids, mask, cache=cache, logits_to_keep=1)[:, -1]

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
        cache_pos: int = 0,
        logits_to_keep: int = 0,
    ) -> torch.Tensor:
        """Logits [B, T, V] (or the last `logits_to_keep` positions) for `input_ids` [B, T].

        See `hidden` for the arguments; logits = `hidden(...) @ lm_head.T`.
        """
        x = self.hidden(input_ids, attention_mask, position_ids, cache, cache_pos)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return self.logits_of(x)

    def logits_of(self, h: torch.Tensor) -> torch.Tensor:
        """Logits [..., V] of final hidden states h [..., H] (the final norm's weight is folded
        into `lm_head`)."""
        return F.linear(h, self.lm_head)

    def decode_logits(self, h: torch.Tensor) -> torch.Tensor:
        """`logits_of(h)` for the decode's rows h [B, H]: through the packed head where
        `use_packed_head` is set, outside torch.compile (inductor cannot lower oneDNN's packed
        weight). The pack is made at the first decode after each weight load (the batch's rows
        are the reorder's hint) and again when the rows change. Not differentiable: the
        prefill's and the training forward's heads are `logits_of`."""
        if not self.use_packed_head or torch.compiler.is_compiling():
            return self.logits_of(h)
        rows = h.shape[0]
        if self._head_pack is None or self._head_pack[0] != rows:
            self._head_pack = (rows, pack_head(self.lm_head, rows))
        return packed_logits(h, self._head_pack[1])

    def head_reason(self, decode: str) -> str:
        """Which head the `decode` step ("eager", "static", "compiled") runs, and why."""
        pack, reason = head_choice(self.lm_head)
        if pack and decode == "compiled":
            return (
                "lm head: F.linear (decode=compiled: inductor cannot lower oneDNN's packed weight)"
            )
        if pack and not self.use_packed_head:
            return "lm head: F.linear (the packed head was turned off)"
        return reason

    @property
    def head_weight(self) -> torch.Tensor:
        """The weight [V, H] that `logits_of` multiplies by (what `selected_logprobs` takes)."""
        return self.lm_head

    def hidden(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: KVCache | None = None,
        cache_pos: int = 0,
    ) -> torch.Tensor:
        """Final normalized hidden states [B, T, hidden] for `input_ids` [B, T].

        The final norm's weight is folded into `lm_head`, so logits are `hidden(...) @ lm_head.T`
        (HF's hidden states times that weight).

        attention_mask: 1 for tokens, 0 for (left) padding; [B, T] without a cache, or
        [B, cache_pos + T] with one (covering the cached slots too). None: no padding at all.
        position_ids: [B, T]; default `positions_from_mask` (or arange from `cache_pos`).
        cache: when given, k/v of the T new tokens are written to slots [cache_pos, cache_pos + T)
        and attention reads slots [0, cache_pos + T).
        Padding query positions attend to themselves only: their logits are finite but
        meaningless.
        """
        B, T = input_ids.shape
        S = cache_pos + T
        dev = input_ids.device
        cos, sin, bool_mask = self.attention_inputs(
            input_ids, attention_mask, position_ids, cache, cache_pos
        )
        Hq, Hkv, D, Im, H = (
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.mlp_width,
            self.hidden_size,
        )
        nqk, half = Hq + Hkv, D // 2
        fused = not torch.is_autocast_enabled(dev.type)
        x = F.embedding(input_ids, self.embed)  # [B, T, H]
        attn_mask = None
        for i, ((wqkv_t, wo_t, wgu_t, wd_t), (b_qkv, b_o, b_gu, b_d), (qk_w, rotate)) in enumerate(
            zip(self._layers, self._biases, self._heads, strict=True)
        ):
            n = self.normalized(x)
            qkv = n @ wqkv_t if b_qkv is None else F.linear(n, wqkv_t.t(), b_qkv)
            qkv = qkv.view(B, T, Hq + 2 * Hkv, D)
            qk = qkv[:, :, :nqk] if qk_w is None else self.normalized(qkv[:, :, :nqk]) * qk_w
            if rotate:
                rot = qk.roll(half, -1)
                qk.mul_(cos.to(qk.dtype)).addcmul_(rot, sin.to(qk.dtype))
            q = qk[:, :, :Hq].transpose(1, 2)  # [B, Hq, T, D]
            if cache is not None:
                k, v = cache.layers[i]
                k[:, :, cache_pos:S].copy_(qk[:, :, Hq:].transpose(1, 2))
                v[:, :, cache_pos:S].copy_(qkv[:, :, nqk:].transpose(1, 2))
                k, v = k[:, :, :S], v[:, :, :S]
                q = q.to(k.dtype)
            else:
                k = qk[:, :, Hq:].transpose(1, 2)
                v = qkv[:, :, nqk:].transpose(1, 2)
            if bool_mask is not None and attn_mask is None:
                attn_mask = additive_mask(bool_mask, q.dtype)
            a = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=bool_mask is None, enable_gqa=Hkv != Hq
            )
            a = a.transpose(1, 2).reshape(B * T, Hq * D)
            x2 = x.view(B * T, H)
            x = torch.addmm(x2, a, wo_t) if fused else x2 + a @ wo_t
            if b_o is not None:
                x = x + b_o
            n = self.normalized(x)
            gu = n @ wgu_t if b_gu is None else torch.addmm(b_gu, n, wgu_t)
            a = F.silu(gu[:, :Im]) * gu[:, Im:]
            x = torch.addmm(x, a, wd_t) if fused else x + a @ wd_t
            if b_d is not None:
                x = x + b_d
            x = x.view(B, T, H)
        return self.normalized(x)

    def attention_inputs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        cache: KVCache | None,
        cache_pos: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """What `hidden` needs besides the weights: the rope rows (cos, sin [B, T, 1, D]) and the
        boolean attention mask [B, 1, T, S] (None: plainly causal); it also records in `cache`
        which new slots are padding, for decode. Shared with the lanes' forward."""
        B, T = input_ids.shape
        S = cache_pos + T
        dev = input_ids.device
        cols = S if cache is not None else T
        if attention_mask is not None and attention_mask.shape[-1] != cols:
            raise ValueError(f"attention_mask has {attention_mask.shape[-1]} columns, want {cols}")
        if position_ids is None:
            if attention_mask is not None:
                position_ids = positions_from_mask(attention_mask)[:, -T:]
            else:
                position_ids = torch.arange(cache_pos, S, device=dev).expand(B, T)
        cos, sin = self.rope(position_ids)  # [B, T, D]
        cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # broadcast over heads
        padded = attention_mask is not None and not bool(attention_mask.all())
        use_causal = cache_pos == 0 and not padded
        bool_mask = None
        if not use_causal:
            # key slot j visible to query i (slot cache_pos + i): j <= cache_pos + i and j is a
            # token; plus the diagonal, so padding queries are never fully masked (NaN).
            q_slot = torch.arange(cache_pos, S, device=dev)
            k_slot = torch.arange(S, device=dev)
            bool_mask = (k_slot[None, :] <= q_slot[:, None]).expand(B, T, S)
            if padded:
                bool_mask = bool_mask & attention_mask.bool()[:, None, :]
                bool_mask = bool_mask | (k_slot[None, :] == q_slot[:, None])
            bool_mask = bool_mask.unsqueeze(1)  # [B, 1, T, S]
        if cache is not None:  # remember which new slots are padding, for decode
            if cache_pos == 0:
                cache.mask.zero_()
            if attention_mask is not None:
                pad = attention_mask[:, cache_pos:S] == 0
                cache.mask[:, :, 0, cache_pos:S].masked_fill_(pad[:, None, :], float("-inf"))
        return cos, sin, bool_mask

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
        """One decode step, the sampler's hot path. Returns logits [B, V].

        tokens: [B] ids; cos, sin: [B, 1, head_dim] rope rows of each row's position
        (`rope(positions)` unsqueezed at 1); slot: the cache slot the new k/v go to; attention
        reads slots [0, slot] with the cache's padding mask. Slots after the prompt count as
        tokens, so the prompt must have gone through `forward(..., cache=cache)` first.
        record: when given, the matmuls write their outputs into its column `step` (no autocast).
        slot and step as [1] long tensors make the static step (`engine.static_decode`): every
        slot read, the unwritten ones masked (`KVCache.decode_mask`), the record's outputs
        written to its fixed scratch buffers (`DecodeRecord.step_views`).

        Attention is two batched matmuls over [B * kv_heads] with the G query heads of a kv
        head as G query rows (GQA without repeating k/v): measured faster than SDPA's CPU
        kernel at these sizes (~60 vs ~80-110 us per layer at batch 32).
        """
        B = tokens.shape[0]
        Hq, Hkv, D, Im = self.num_heads, self.num_kv_heads, self.head_dim, self.mlp_width
        nqk, G, half = Hq + Hkv, Hq // Hkv, D // 2
        scale = D**-0.5
        mask = cache.decode_mask(slot)
        fused = not torch.is_autocast_enabled(tokens.device.type)
        if record is not None and not fused:
            raise ValueError("decode: a DecodeRecord cannot be written under autocast")
        outs = [(None,) * 4] * self.num_layers if record is None else record.step_views(step)
        x = F.embedding(tokens, self.embed)  # [B, H]
        for i, (
            (wqkv_t, wo_t, wgu_t, wd_t),
            (b_qkv, b_o, b_gu, b_d),
            (qk_w, rotate),
            (
                o_qkv,
                o_gu,
                o_attn,
                o_mlp,
            ),
        ) in enumerate(zip(self._layers, self._biases, self._heads, outs, strict=True)):
            n = self.normalized(x)
            if b_qkv is None:
                qkv = torch.mm(n, wqkv_t, out=o_qkv).view(B, Hq + 2 * Hkv, D)
            else:
                qkv = torch.addmm(b_qkv, n, wqkv_t, out=o_qkv).view(B, Hq + 2 * Hkv, D)
            # q/k norm (Qwen3): the record keeps the projection; RoPE then works on the copy
            qk = qkv[:, :nqk] if qk_w is None else self.normalized(qkv[:, :nqk]).mul_(qk_w)
            if rotate:
                rot = qk.roll(half, -1)
                qk.mul_(cos).addcmul_(rot, sin)
            kc, vc = cache.write(i, slot, qk[:, Hq:], qkv[:, nqk:])
            q = qk[:, :Hq].reshape(B * Hkv, G, D).to(kc.dtype)
            att = torch.baddbmm(mask, q, kc.transpose(1, 2), alpha=scale).softmax(-1)
            a = torch.bmm(att, vc).view(B, Hq * D)
            x = torch.addmm(x, a, wo_t, out=o_attn) if fused else x + a @ wo_t
            if b_o is not None:
                x.add_(b_o)  # into the record too: the residual stream after the block
            n = self.normalized(x)
            if b_gu is None:
                gu = torch.mm(n, wgu_t, out=o_gu)
            else:
                gu = torch.addmm(b_gu, n, wgu_t, out=o_gu)
            a = F.silu(gu[:, :Im]).mul_(gu[:, Im:])
            x = torch.addmm(x, a, wd_t, out=o_mlp) if fused else x + a @ wd_t
            if b_d is not None:
                x.add_(b_d)
        return self.decode_logits(self.normalized(x))
