"""Per-token log-probs of completions: the policy (with grad), the reference and old policy (without).

GRPO needs log p(token) of each completion token, never the [tokens, vocab] logits themselves.
Through HF's head that costs a logits tensor plus a chain of full-size temporaries in the forward
(logsumexp's max, subtract and exp; the gather) and the backward (softmax, a zero-filled gather
gradient, their sum): at the SimpleStories-1.25M shape (2,048 completion tokens x 4,096 entries)
those passes measured about a third of a GRPO training step on the dev CPU. `selected_logprobs`
does the head in row chunks that stay in cache: the forward turns each chunk of logits into
log-probs in place (`log_softmax` is one fused pass; `logsumexp` is four, 1.4x slower for the
pass) and keeps them, the backward turns them into the gradient in place (softmax, times the
incoming gradient, minus it at the target) and feeds it straight to the two matmuls. Beyond a
memory budget the log-probs are recomputed in the backward instead of kept.

A GRPO batch repeats each prompt `num_generations` times. `logprobs` runs each distinct prompt
once and feeds the completions against its cached keys and values (autograd sums the prompt's
gradients over its completions): at 2 prompts x 16 completions of 64 tokens on SimpleStories-1.25M
the policy forward and backward took 1.035x less time with 9-token prompts, 1.49x with 64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from smollab.engine.lean_llama import LeanLlama, positions_from_mask
from smollab.engine.rollout import distinct_prompts

__all__ = ["logprobs", "rollout_logprobs", "selected_logprobs", "shared_prompts"]

CPU_CHUNK_ELEMS = 1 << 20  # logits per chunk on a CPU: 4 MB in fp32, cache-sized
GPU_CHUNK_ELEMS = 1 << 26  # at most 256 MB of fp32 logits per chunk on a GPU ...
GPU_FREE_SHARE = 16  # ... and at most this share of its free memory
MIN_ROWS = 64  # every chunk reads the whole head: fewer rows leave a large vocabulary's chunk
# bound by that read (a 151k x 896 head is 545 MB in fp32), not by its matmul
KEEP_LOGITS_ELEMS = 1 << 26  # keep the log-probs for the backward up to 256 MB, else recompute


def chunk_rows(vocab: int, device: torch.device) -> int:
    """Rows of the head's output per chunk, by vocabulary and device: cache-sized on a CPU (256
    rows of a 4,096-word head), a share of the free memory on a GPU, and never so few rows that
    reading the head's weight dominates (49k and 151k vocabularies)."""
    budget = CPU_CHUNK_ELEMS
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = min(GPU_CHUNK_ELEMS, free // (4 * GPU_FREE_SHARE))
    elif device.type == "mps":
        budget = GPU_CHUNK_ELEMS // 4  # unified memory, shared with the CPU
    return max(MIN_ROWS, budget // vocab)


def _chunk_logprobs(h: torch.Tensor, w: torch.Tensor, inv_t: float) -> torch.Tensor:
    """float32 log_softmax(h @ w.T * inv_t) [rows, V], computed in place in one logits buffer."""
    logits = F.linear(h, w).float()
    if inv_t != 1.0:
        logits.mul_(inv_t)
    return torch.log_softmax(logits, -1, out=logits)


class _SelectedLogprobs(torch.autograd.Function):
    """log_softmax(h @ weight.T * inv_t)[n, targets[n]] for h [N, H], weight [V, H], targets [N]."""

    @staticmethod
    def forward(ctx, h, weight, targets, inv_t: float, keep_logits: bool, probs=None, values=None):
        N, V = h.shape[0], weight.shape[0]
        rows = chunk_rows(V, h.device)
        ctx.save_for_backward(h, weight, targets)
        ctx.inv_t, ctx.rows, ctx.probs = inv_t, rows, probs is not None
        if probs is not None:  # known softmax and values (a replayed forward): no head matmul
            # probs [S, R, V] (a view; h's rows in its order): chunks of whole S-slices (at least
            # one, so a chunk may exceed the cache-sized one), kept as views, since the backward
            # writes its gradient into a new tensor anyway
            per = max(1, rows // probs.shape[1])
            ctx.rows, ctx.kept = per * probs.shape[1], list(probs.split(per))
            return values.float().clone()
        w = weight.to(h.dtype)
        out = torch.empty(N, dtype=torch.float32, device=h.device)
        kept = []
        for i in range(0, N, rows):
            logp = _chunk_logprobs(h[i : i + rows], w, inv_t)
            out[i : i + rows] = logp.gather(1, targets[i : i + rows, None]).squeeze(1)
            if keep_logits:
                kept.append(logp)
        ctx.kept = kept
        return out

    @staticmethod
    def backward(ctx, grad_out):
        h, weight, targets = ctx.saved_tensors
        if ctx.kept is None:
            raise RuntimeError("selected_logprobs: backward through the same graph twice")
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        w = weight.to(h.dtype)
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        )
        g = grad_out.float() * ctx.inv_t  # d out / d logits = inv_t * (onehot(target) - softmax)
        for k, i in enumerate(range(0, h.shape[0], ctx.rows)):
            hc, gc = h[i : i + ctx.rows], g[i : i + ctx.rows, None]
            if ctx.probs:
                p = ctx.kept[k]
                grad = (p * gc.view(-1, p.shape[1], 1).neg()).view(-1, p.shape[-1])
            else:
                logp = ctx.kept[k] if ctx.kept else _chunk_logprobs(hc, w, ctx.inv_t)
                grad = logp.exp_().mul_(gc.neg())
            grad.scatter_add_(1, targets[i : i + ctx.rows, None], gc)
            if need_h:
                grad_h[i : i + ctx.rows] = grad.to(h.dtype) @ w
            if need_w:
                grad_w.addmm_(grad.t(), hc.float())
        ctx.kept = None
        return grad_h, grad_w.to(weight.dtype) if need_w else None, None, None, None, None, None


def selected_logprobs(
    h: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    probs: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    lane_dim: int = 0,
    keep_elems: int = KEEP_LOGITS_ELEMS,
) -> torch.Tensor:
    """log_softmax(h @ weight.T / temperature) at `targets`, without materializing [..., V] temporaries.

    h: [..., H] final hidden states; weight: [V, H] output embedding; targets: [...] token ids.
    Returns float32 [...]. Differentiable in h and weight; temperature 0 counts as 1.
    probs [..., V], values [...]: that softmax and those log-probs, already known (the sampler
    drew from them with the same weights): the forward returns `values` without the head matmul
    and the backward uses `probs`.
    weight [N, V, H]: N lanes' own heads (full lanes), h's rows lane-major along `lane_dim`.
    keep_elems: the log-probs are kept for the backward up to this many (all lanes together).
    """
    if weight.dim() == 3:
        n = weight.shape[0]
        parts = zip(
            h.chunk(n, lane_dim),
            weight,
            targets.chunk(n, lane_dim),
            *((t.chunk(n, lane_dim) if t is not None else [None] * n) for t in (probs, values)),
            strict=True,
        )
        return torch.cat(
            [
                selected_logprobs(*p[:3], temperature, *p[3:], keep_elems=keep_elems // n)
                for p in parts
            ],
            lane_dim,
        )
    inv_t = 1.0 / temperature if temperature > 0 else 1.0
    shape = targets.shape
    h2, t2 = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
    keep = h2.shape[0] * weight.shape[0] <= keep_elems
    if not torch.is_grad_enabled() or not (h.requires_grad or weight.requires_grad):
        keep = False  # nothing will call the backward
    if probs is not None:
        probs, values = probs.reshape(-1, shape[-1], weight.shape[0]), values.reshape(-1)
    return _SelectedLogprobs.apply(h2, weight, t2, inv_t, keep, probs, values).view(shape)


def _decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Linear] | None:
    """(decoder, output embedding) when logits are exactly `decoder(...) @ head.weight.T`.

    None for heads with a bias, soft-capping or scaling, and for families not checked here.
    A PEFT model is unwrapped; its LoRA layers sit inside the decoder, so they still apply.
    """
    base = model.get_base_model() if hasattr(model, "peft_config") else model
    get_head = getattr(base, "get_output_embeddings", None)
    head = get_head() if get_head else None
    cfg = getattr(base, "config", None)
    if type(head) is not nn.Linear or head.bias is not None or cfg is None:
        return None
    if getattr(cfg, "final_logit_softcapping", None) or getattr(cfg, "logit_scale", None):
        return None
    if getattr(cfg, "model_type", None) not in ("llama", "mistral", "qwen2", "qwen3", "smollm3"):
        return None  # families whose decoder output is the head's input (tests: the replicas)
    return base.get_decoder(), head


def shared_prompts(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_start: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """`distinct_prompts` of the first `completion_start` columns, when sharing pays.

    None when rows repeat their prompts too little to save 5% of the tokens fed (the shared
    path makes two calls instead of one) or when there is no completion token to feed.
    """
    P, B, L = completion_start, input_ids.shape[0], input_ids.shape[1] - 1
    if L - P < 1:
        return None
    share = distinct_prompts(input_ids[:, :P], attention_mask[:, :P])
    return share if (B - share[0].shape[0]) * P >= 0.05 * B * L else None


def _lean_hidden(model: LeanLlama, ids, mask, P: int, share) -> torch.Tensor:
    """Final hidden states from position P - 1 on: the ones that predict the completion."""
    if share is None:
        return model.hidden(ids, mask)[:, P - 1 :]
    u_ids, u_mask, inverse = share
    cache = model.new_cache(ids.shape[0], ids.shape[1])
    h_prompt = model.prefill_distinct(u_ids, u_mask, inverse, cache)
    h = model.hidden(ids[:, P:], mask, cache=cache, cache_pos=P)
    return torch.cat([h_prompt[inverse, -1:], h], 1)


def _hf_hidden(decoder: nn.Module, ids, mask, P: int, share) -> torch.Tensor:
    """`_lean_hidden` for an HF decoder (keeps autograd: the prompt's keys get the summed grads)."""
    pos = positions_from_mask(mask)
    if share is None:
        out = decoder(input_ids=ids, attention_mask=mask, position_ids=pos)
        return out.last_hidden_state[:, P - 1 :]
    u_ids, u_mask, inverse = share
    out = decoder(
        input_ids=u_ids,
        attention_mask=u_mask,
        position_ids=positions_from_mask(u_mask),
        use_cache=True,
    )
    cache = out.cache  # transformers 5's name (past_key_values before)
    cache.batch_select_indices(inverse)
    h = decoder(
        input_ids=ids[:, P:],
        attention_mask=mask,
        position_ids=pos[:, P:],
        cache=cache,
        use_cache=True,
    ).last_hidden_state
    return torch.cat([out.last_hidden_state[inverse, -1:], h], 1)


def checkpointing(model: nn.Module) -> bool:
    base = model.get_base_model() if hasattr(model, "peft_config") else model
    flag = getattr(base, "is_activation_checkpointing", None)  # the name since transformers 5
    return bool(getattr(base, "is_gradient_checkpointing", False) if flag is None else flag)


def logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_start: int,
    temperature: float = 1.0,
    share_prompts: bool = True,
) -> torch.Tensor:
    """Log-probs [B, L - completion_start] of input_ids[:, completion_start:] under `model`.

    model: a `LeanLlama` (no grad; fastest for reference / old log-probs) or any HF causal LM or
    PEFT model of one (keeps autograd: the policy). Positions come from the mask (cumsum - 1),
    as the sampler and HF `generate` assign them, so left-padded prompts score as they were
    sampled. Logits are divided by `temperature` (TRL's convention); temperature 0 counts as 1.
    share_prompts: run each distinct prompt once when rows repeat it (`shared_prompts`); the
    result is the same to float rounding. The last token predicts nothing and is never fed.
    """
    P = completion_start
    if not 0 < P < input_ids.shape[1]:
        raise ValueError(f"completion_start {P} outside (0, {input_ids.shape[1]})")
    targets = input_ids[:, P:]
    ids, mask = input_ids[:, :-1], attention_mask[:, :-1]
    lean = isinstance(model, LeanLlama)
    plain = None if lean else _decoder_and_head(model)
    if not lean and (plain is None or checkpointing(model)):
        share_prompts = False  # the logits path, or HF's cache turned off by checkpointing
    share = shared_prompts(input_ids, attention_mask, P) if share_prompts else None
    if lean:
        h = _lean_hidden(model, ids, mask, P, share)
        return selected_logprobs(h, model.head_weight, targets, temperature)
    if plain is not None:
        decoder, head = plain
        h = _hf_hidden(decoder, ids, mask, P, share)
        return selected_logprobs(h, head.weight, targets, temperature)
    logits = completion_logits(model, input_ids, attention_mask, P, temperature)
    return logits.gather(-1, targets[..., None]).squeeze(-1) - logits.logsumexp(-1)


def completion_logits(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    completion_start: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """The model's own logits [B, L - completion_start, V] (float32, divided by `temperature`;
    0 counts as 1) at the positions that predict input_ids[:, completion_start:]: HF's
    `logits_to_keep`, positions from the mask, the last token not fed. The whole-vocabulary
    path: what a model without a plain head takes, and what per-token entropies need."""
    ids, mask = input_ids[:, :-1], attention_mask[:, :-1]
    keep = input_ids.shape[1] - completion_start
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions_from_mask(mask),
        logits_to_keep=keep,
    )
    logits = out.logits[:, -keep:].float()
    if temperature > 0 and temperature != 1:
        logits = logits / temperature
    return logits


def rollout_logprobs(
    model: nn.Module, rollout, temperature: float, share_prompts: bool = True
) -> torch.Tensor:
    """Per-token log-probs of a rollout's completions under `model`, computed (with grad if the
    model has it); `policy.policy_logprobs` decides between this and the replay."""
    P = rollout.prompt_ids.shape[1]
    return logprobs(model, rollout.input_ids, rollout.attention_mask, P, temperature, share_prompts)
