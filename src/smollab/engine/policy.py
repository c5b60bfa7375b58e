"""The policy's log-probs for a training pass: replayed from the sampler's decode when possible.

A loop asks once, before training, why its batches cannot be replayed (`replay_blocker`), samples
with `record=` set from that answer, and calls `policy_logprobs` for every pass over a batch. The
record's lifetime is decided here: the first pass hands it to the autograd graph, which frees it
after the backward, and later passes (new weights, `num_iterations > 1`) compute.
"""

from __future__ import annotations

import torch
from torch import nn

from smollab.engine.decode_record import DecodeRecord
from smollab.engine.replay import RECORD_BUDGET_ELEMS, replay_logprobs, replay_unsupported
from smollab.engine.rollout import Rollout
from smollab.engine.sampler import Sampler
from smollab.engine.token_logprobs import rollout_logprobs


def replay_blocker(
    policy: nn.Module,
    sampler: Sampler,
    *,
    enabled: bool,
    autocast: bool,
    batch_size: int,
    max_new_tokens: int,
    layer_copies: int = 1,
    repetition_penalty: float = 1.0,
) -> str | None:
    """Why each batch's first policy forward must be computed rather than replayed (None: replay).
    layer_copies: see `DecodeRecord.elements`. A repetition penalty draws from logits that are
    not the policy's, so the sampler keeps no record (`Sampler.generate`)."""
    if sampler.lean is None:  # first, so the run log says why the lean engine is not used
        return f"HF sampler: {sampler.hf_reason}"
    if not enabled:
        return "grpo.replay=false"
    if autocast:
        return "autocast"
    if repetition_penalty != 1:
        return f"grpo.repetition_penalty={repetition_penalty:g} (penalized draws)"
    n = DecodeRecord.elements(sampler.lean, batch_size, max_new_tokens, layer_copies)
    budget = max(RECORD_BUDGET_ELEMS, sum(p.numel() for p in policy.parameters()))
    if n > budget:
        return (
            f"a decode record of {n:,} numbers is over the budget of {budget:,} (as many as the "
            f"weights, at least {RECORD_BUDGET_ELEMS:,})"
        )
    return replay_unsupported(policy)


def policy_logprobs(
    policy: nn.Module, rollout: Rollout, temperature: float, share_prompts: bool = True
) -> torch.Tensor:
    """Per-token log-probs (with grad) of the rollout's completions under `policy`.

    A rollout that carries a decode record was sampled by these very weights: it is replayed and
    lets go of the record (the graph keeps what the backward needs). Otherwise it is computed,
    each distinct prompt once unless `share_prompts` is off (per-completion gradient masks).
    """
    if rollout.record is None:
        return rollout_logprobs(policy, rollout, temperature, share_prompts)
    logp = replay_logprobs(policy, rollout, temperature)
    rollout.record = None
    return logp
