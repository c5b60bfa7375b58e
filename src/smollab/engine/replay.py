"""The policy's training forward, replayed from the sampler's decode instead of recomputed.

A GRPO step samples its completions with the policy's current weights and then, for the loss,
runs the same policy over the same tokens again with autograd. With one pass over each batch
(`num_iterations=1`) every matmul of that forward repeats one the decode already did. The sampler
keeps those outputs in a `DecodeRecord`; `replay_logprobs` builds the autograd graph around them:
each recorded linear is a node whose forward returns the recorded value and whose backward is
the linear's (dx = g @ W, dW = g.T @ x), so the backward is exact while the forward skips all
its matmuls, the LM head included (the draws' probabilities are the softmax its backward needs).
The elementwise parts (norms, RoPE, SwiGLU, attention) are recomputed: they carry the graph.
Biases enter the recorded linears as inputs (their gradient is the upstream one summed over
rows); a Qwen3 layer's q/k norm, and with it RoPE, is recomputed on the recorded projection.

The prompt tokens are not in the record: each distinct prompt runs once for real (a few tokens
per group) and its keys and values join the completions' attention, as in `token_logprobs`.
Values agree with the plain forward to float rounding; tests compare log-probs and gradients.
`lanes_logprobs` does the same for a `LaneLlama`'s lanes: the recorded linears take
either a dense weight, the lanes' (shared base, each lane's low-rank factors), or each lane's own
weight (full lanes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from smollab.engine.lean_config import lean_spec
from smollab.engine.lean_llama import fused_layer_weights, positions_from_mask
from smollab.engine.rollout import Rollout, distinct_prompts
from smollab.engine.token_logprobs import checkpointing, selected_logprobs
from smollab.models.hf_weights import effective_weight, unwrap_hf

__all__ = ["RECORD_BUDGET_ELEMS", "lanes_logprobs", "replay_logprobs", "replay_unsupported"]

# A run's (a lane's) decode record may hold as many numbers as its model has weights, and at least
# 512 MB of fp32: beyond that the forward is computed. The training forward it replaces keeps
# activations of the same order, so a record within the weights' own size at most doubles them.
RECORD_BUDGET_ELEMS = 1 << 27


def replay_unsupported(model: nn.Module) -> str | None:
    """Why `replay_logprobs` cannot train `model` (None when it can).

    The architecture needs no check: only the lean sampler records, and it takes only the
    families `lean_config` reads. What the replay cannot reproduce is randomness in the training
    forward.
    """
    if getattr(unwrap_hf(model).config, "attention_dropout", 0.0):
        return "attention dropout"
    if checkpointing(model):
        return "activation checkpointing"
    for module in model.modules():
        p = getattr(module, "lora_dropout", None)
        if p is not None and any(getattr(d, "p", 0.0) for d in p.values()):
            return "LoRA dropout"
    return None


def _linear_grads(ctx, g, x, ws, first: int):
    """The gradients, as far as they are needed, of the linear `ws` (plus a bias) applied to x,
    for the upstream gradient g: dx, the bias's, then one per weight.

    ws: (weight [out, in],), a dense x @ weight.T; or (weight, a_t [N, in, R], b_t [N, R, out]),
    lanes (`LaneLlama`): N lanes' rows x [N, rows, in] through a shared weight plus each lane's
    low-rank update (x @ a_t @ b_t), whose factors get their gradients without a [out, in] one;
    or (weight [N, out, in],), full lanes: each lane's rows through its own weight.
    first: the position of ws[0] among the Function's inputs (for `needs_input_grad`); the bias
    ([out], or [N, out] for full lanes; None without one) is the input just before it.
    """
    need = ctx.needs_input_grad
    weight = ws[0]
    db = None
    if need[first - 1]:  # the bias: [N, out] per lane, or one [out] for all rows
        db = g.sum(1) if ctx.bias_dim == 2 else g.reshape(-1, g.shape[-1]).sum(0)
    if weight.dim() == 3:
        dx = torch.bmm(g, weight) if need[0] else None
        return dx, db, torch.bmm(g.transpose(1, 2), x) if need[first] else None
    g2 = g.reshape(-1, g.shape[-1])
    dx = (g2 @ weight).view(x.shape) if need[0] else None
    dw = g2.t() @ x.reshape(-1, x.shape[-1]) if need[first] else None
    if len(ws) == 1:
        return dx, db, dw
    a_t, b_t = ws[1], ws[2]
    gb = torch.bmm(g, b_t.transpose(1, 2))  # [N, rows, R]
    if dx is not None:
        dx.baddbmm_(gb, a_t.transpose(1, 2))
    da = torch.bmm(x.transpose(1, 2), gb) if need[first + 1] else None
    db_lora = torch.bmm(torch.bmm(x, a_t).transpose(1, 2), g) if need[first + 2] else None
    return dx, db, dw, da, db_lora


def _keep(ctx, bias, *tensors) -> None:
    """Save what a recorded linear's backward reads: its input and weights (`tensors`), and
    only the bias's shape (its gradient is the upstream gradient summed)."""
    ctx.save_for_backward(*tensors)
    ctx.bias_dim = None if bias is None else bias.dim()


class RecordedResidual(torch.autograd.Function):
    """residual + linear(x), whose value the decode recorded (the residual stream after a
    block): the forward returns the record, the backward is the linear's and the sum's.
    bias: the linear's (None: none); ws: its weights (see `_linear_grads`)."""

    @staticmethod
    def forward(ctx, x, value, residual, bias, *ws):
        _keep(ctx, bias, x, *ws)
        return value  # autograd hands out a view: the record's memory, no copy

    @staticmethod
    def backward(ctx, g):
        x, *ws = ctx.saved_tensors
        dx, db, *dws = _linear_grads(ctx, g, x, ws, 4)
        return dx, None, g, db, *dws


class RecordedRope(torch.autograd.Function):
    """RoPE(linear(x)) on the first `n_rot` columns (q, k), whose value the decode recorded;
    n_rot 0: the projection itself (a NoPE layer, or one whose q/k norm comes before RoPE)."""

    @staticmethod
    def forward(ctx, x, value, cos, sin, n_rot: int, bias, *ws):
        _keep(ctx, bias, x, cos, sin, *ws)
        ctx.n_rot = n_rot
        return value

    @staticmethod
    def backward(ctx, g):
        x, cos, sin, *ws = ctx.saved_tensors
        if ctx.n_rot:
            g = g.clone()
            B, T, D = g.shape[0], g.shape[1], cos.shape[-1]
            gr = g[..., : ctx.n_rot].view(B, T, -1, D)  # y = x cos + roll(x, D/2) sin, so
            gr.copy_(gr * cos + (gr * sin).roll(D // 2, -1))  # dx = g cos + roll(g sin, D/2)
        dx, db, *dws = _linear_grads(ctx, g, x, ws, 6)
        return dx, None, None, None, None, db, *dws


class _RMSNorm(torch.autograd.Function):
    """HF's RMSNorm, weight * (x * rsqrt(mean(x^2) + eps)) computed in float32 and cast back to
    x's dtype before the weight, the same ops in the same order; its backward is 8 tensor ops
    where autograd's chain of the forward's makes ~14. weight: [D] over the last dim, or
    [heads, D] per head (Qwen3's q/k norms, the q heads' weights then the k heads')."""

    @staticmethod
    def forward(ctx, x, weight, eps: float):
        xf = x.float()
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        n = (xf * r).to(x.dtype)
        ctx.save_for_backward(n, r, weight)
        return weight * n

    @staticmethod
    def backward(ctx, dy):
        n, r, weight = ctx.saved_tensors
        dn = dy * weight
        dx = (dn - n * (dn * n).mean(-1, keepdim=True)).mul_(r.to(n.dtype))
        dw = None
        if ctx.needs_input_grad[1]:
            dw = (dy * n).reshape(-1, *weight.shape).sum(0)
        return dx, dw, None


class RecordedSwiGLU(torch.autograd.Function):
    """silu(g) * u for [g | u] = linear(x) (`width` columns each), whose value the decode
    recorded. The dense backward keeps dg and du apart (two matmul pairs, the same work as one):
    autograd's split of the product would concatenate them into a new [tokens, 2 width]."""

    @staticmethod
    def forward(ctx, x, value, width: int, bias, *ws):
        g, u = value[..., :width], value[..., width:]
        sg = F.silu(g)
        _keep(ctx, bias, x, g, u, sg, *ws)
        return sg * u

    @staticmethod
    def backward(ctx, da):
        x, g, u, sg, *ws = ctx.saved_tensors
        dg = torch.ops.aten.silu_backward(da * u, g)
        du = da * sg
        if len(ws) > 1 or ws[0].dim() == 3:  # lanes take the fused gradient
            dx, db, *dws = _linear_grads(ctx, torch.cat([dg, du], -1), x, ws, 4)
            return dx, None, None, db, *dws
        width, weight = g.shape[-1], ws[0]
        dg, du = dg.reshape(-1, width), du.reshape(-1, width)
        wg, wu = weight[:width], weight[width:]
        dx = torch.addmm(dg @ wg, du, wu).view(x.shape) if ctx.needs_input_grad[0] else None
        db = torch.cat([dg.sum(0), du.sum(0)]) if ctx.needs_input_grad[3] else None
        dw = None
        if ctx.needs_input_grad[4]:
            x2 = x.reshape(-1, x.shape[-1])
            dw = torch.empty_like(weight)
            torch.mm(dg.t(), x2, out=dw[:width])
            torch.mm(du.t(), x2, out=dw[width:])
        return dx, None, None, db, dw


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, D] * cos + rotate_half(x) * sin, with `sin` carrying rotate_half's sign."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


def _visible(q_slots, k_slots, key_mask) -> torch.Tensor:
    """bool [B, 1, T, S]: key slot <= query slot and a token; the diagonal always (no NaN rows)."""
    m = (k_slots[None, :] <= q_slots[:, None])[None] & key_mask.bool()[:, None, :]
    m |= k_slots[None, :] == q_slots[:, None]
    return m[:, None]


def _layers(hf, weights, spec, x, pos, mask_slots, rec=None, prefix=None):
    """Run the decoder layers over x [B, T, H] (embedded), computed or replayed from `rec`.

    weights: per layer its `LayerWeights` (norms not folded, MLP padded to the record's width);
    spec: the model's `LeanSpec` (which layers rotate); pos [B, T] positions; mask_slots: bool
    attention mask [B, 1, T, S]; prefix: per layer the (k, v) [B, kv_heads, S - T, D] of earlier
    slots. Returns (normed hidden, per-layer (k, v)).
    """
    cfg = hf.config
    B, T, _ = x.shape
    Hq = cfg.num_attention_heads
    Hkv = getattr(cfg, "num_key_value_heads", None) or Hq
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // Hq
    nqk = Hq + Hkv
    eps = float(cfg.rms_norm_eps)
    cos, sin = hf.model.rotary_emb(x, pos)  # [B, T, D], exactly HF's tables
    sin = torch.cat([-sin[..., : D // 2], sin[..., D // 2 :]], -1)
    cos, sin = cos[:, :, None], sin[:, :, None]
    kv_out = []
    for i, (lw, rotate) in enumerate(zip(weights, spec.rope_layers, strict=True)):
        width = lw.d.shape[1]
        # recorded values are read step-major: [T, B, n] -> a [B, T, n] view
        got = (
            None
            if rec is None
            else [b[i, :T].transpose(0, 1) for b in (rec.qkv, rec.x_attn, rec.gu, rec.x_mlp)]
        )
        n1 = _RMSNorm.apply(x, lw.ln1, eps)
        if rec is None:
            qkv = F.linear(n1, lw.qkv, lw.b_qkv).view(B, T, Hq + 2 * Hkv, D)
        else:  # the record rotated q and k in place unless a q/k norm came first
            n_rot = nqk * D if rotate and lw.qk_norm is None else 0
            qkv = RecordedRope.apply(n1, got[0], cos, sin, n_rot, lw.b_qkv, lw.qkv)
            qkv = qkv.view(B, T, Hq + 2 * Hkv, D)
        qk = qkv[:, :, :nqk]
        if lw.qk_norm is not None:
            qk = _RMSNorm.apply(qk, lw.qk_norm, eps)
        if rotate and (rec is None or lw.qk_norm is not None):
            qk = _rope(qk, cos, sin)
        q, k = qk.split([Hq, Hkv], 2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), qkv[:, :, nqk:].transpose(1, 2)
        kv_out.append((k, v))
        if prefix is not None:
            k, v = torch.cat([prefix[i][0], k], 2), torch.cat([prefix[i][1], v], 2)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask_slots, enable_gqa=Hkv != Hq)
        a = a.transpose(1, 2).reshape(B, T, Hq * D)
        if rec is None:
            x = x + F.linear(a, lw.o, lw.b_o)
        else:
            x = RecordedResidual.apply(a, got[1], x, lw.b_o, lw.o)
        n2 = _RMSNorm.apply(x, lw.ln2, eps)
        if rec is None:
            g, u = F.linear(n2, lw.gu, lw.b_gu).split(width, -1)
            act = F.silu(g) * u  # zero in the padded columns
            x = x + F.linear(act, lw.d, lw.b_d)
        else:
            act = RecordedSwiGLU.apply(n2, got[2], width, lw.b_gu, lw.gu)
            x = RecordedResidual.apply(act, got[3], x, lw.b_d, lw.d)
    return _RMSNorm.apply(x, effective_weight(hf.model.norm), eps), kv_out


def replay_logprobs(model: nn.Module, rollout: Rollout, temperature: float) -> torch.Tensor:
    """Per-token log-probs [B, L] (with grad) of `rollout`'s completions under `model`.

    The same values and gradients as `token_logprobs.rollout_logprobs`, for a rollout sampled
    with `record=True` from `model`'s present weights (`replay_unsupported(model)` is None).
    """
    rec = rollout.record
    if rec is None:
        raise ValueError("replay_logprobs needs a rollout sampled with record=True")
    hf = unwrap_hf(model)
    P, L = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    Tc = L - 1  # completion tokens fed: all but the last
    if Tc > rec.steps:
        raise ValueError(f"the record holds {rec.steps} decode steps, the rollout needs {Tc}")
    dev = rollout.prompt_ids.device
    mask = rollout.attention_mask
    pos = positions_from_mask(mask)
    embed = hf.model.embed_tokens

    # 1. each distinct prompt once, computed
    u_ids, u_mask, rows = distinct_prompts(rollout.prompt_ids, rollout.prompt_mask)
    slots = torch.arange(P, device=dev)
    vis = _visible(slots, slots, u_mask)
    width = rec.gu.shape[-1] // 2  # the lean MLP width the decode recorded
    weights = [fused_layer_weights(layer, width, fold_norms=False) for layer in hf.model.layers]
    spec = lean_spec(hf.config)
    h_prompt, kv = _layers(hf, weights, spec, embed(u_ids), positions_from_mask(u_mask), vis)

    # 2. the completions, replayed, attending to their prompt's keys and values
    h = h_prompt[rows, -1:]
    if Tc > 0:
        prefix = [(k[rows], v[rows]) for k, v in kv]
        q_slots = torch.arange(P, P + Tc, device=dev)
        vis = _visible(q_slots, torch.arange(P + Tc, device=dev), mask[:, : P + Tc])
        ids = rollout.completion_ids[:, :Tc]
        h_comp, _ = _layers(hf, weights, spec, embed(ids), pos[:, P : P + Tc], vis, rec, prefix)
        h = torch.cat([h, h_comp], 1)

    head = hf.get_output_embeddings().weight
    # step-major, as the draws were recorded: the probabilities are read in place
    out = selected_logprobs(
        h.transpose(0, 1),
        head,
        rollout.completion_ids.t(),
        temperature,
        probs=rec.probs[:L],
        values=rollout.logprobs.t(),
    )
    return out.t()


def lanes_logprobs(lanes: nn.Module, rollout: Rollout, temperature: float) -> torch.Tensor:
    """Per-token log-probs [B, L] of a `LaneLlama`'s rollout (rows lane-major), with grad into
    each lane's weights (`load_lanes` under grad): replayed as `replay_logprobs` does when the
    rollout has a record (sampled with `record=True` by these lanes with their present weights),
    else computed.

    Each lane's distinct prompts run once, computed through its own weights (lanes see a prompt
    differently), and its completions attend to their keys and values. Replayed, every linear of
    the completions returns the decode's value and backpropagates as the lane's weights (the
    shared base plus its low-rank update, or its own).
    """
    rec = rollout.record
    P, L = rollout.prompt_ids.shape[1], rollout.completion_ids.shape[1]
    Tc = L - 1
    if rec is not None and Tc > rec.steps:
        raise ValueError(f"the record holds {rec.steps} decode steps, the rollout needs {Tc}")
    N = lanes.num_lanes
    dev = rollout.prompt_ids.device
    mask = rollout.attention_mask

    # 1. each lane's distinct prompts once, computed, their keys and values kept for the rows
    ids, p_mask, rows = distinct_prompts(rollout.prompt_ids, rollout.prompt_mask, lanes=N)
    cos, sin, visible = lanes.attention_inputs(ids, p_mask, None, None, 0)
    h, kv = lanes.layers(lanes.embedded(ids), cos, sin, visible)
    h = h[rows, -1:]

    # 2. the completions (replayed: the records read lane-major, [T, B, n] -> [N, b * T, n])
    if Tc > 0:
        pos = positions_from_mask(mask)[:, P : P + Tc]
        cos, sin = (t.unsqueeze(2) for t in lanes.rope(pos))
        vis = _visible(
            torch.arange(P, P + Tc, device=dev), torch.arange(P + Tc, device=dev), mask[:, : P + Tc]
        )
        record = (
            None
            if rec is None
            else [
                [
                    t[i, :Tc].transpose(0, 1).reshape(N, -1, t.shape[-1])
                    for t in (rec.qkv, rec.x_attn, rec.gu, rec.x_mlp)
                ]
                for i in range(lanes.num_layers)
            ]
        )
        x = lanes.embedded(rollout.completion_ids[:, :Tc])
        prefix = [(k[rows], v[rows]) for k, v in kv]
        h_comp, _ = lanes.layers(x, cos, sin, vis, prefix=prefix, record=record)
        h = torch.cat([h, h_comp], 1)
    known = {} if rec is None else {"probs": rec.probs[:L], "values": rollout.logprobs.t()}
    out = selected_logprobs(
        h.transpose(0, 1),
        lanes.head_weight,
        rollout.completion_ids.t(),
        temperature,
        lane_dim=1,
        **known,
    )
    return out.t()
