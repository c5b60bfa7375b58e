"""The policy's training forward when the loss reads per-token entropies (TRL's
`top_entropy_quantile`, `entropy_coef`, `use_adaptive_entropy`): log-probs AND the entropy of the
policy's whole next-token distribution at every completion position, both with grad.

The engine's fast paths never hold a position's distribution: the chunked head keeps only the
sampled token's log-prob, and the replay reuses the decode's. An entropy needs every logit, so
this forward takes the model's own logits (HF `logits_to_keep`: the completion positions only),
as TRL does; it costs the [rows, T, vocabulary] logits and their log-softmax in memory, which
is why runs that do not ask for entropies never take it.
"""

from __future__ import annotations

import torch
from torch import nn

from smollab.engine.rollout import Rollout
from smollab.engine.token_logprobs import completion_logits


def logprobs_and_entropies(
    model: nn.Module, rollout: Rollout, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p of each completion token, entropy of the distribution it was drawn from), both
    [B, T] float32 with grad, logits divided by `temperature` (TRL's convention; 0 counts as 1).
    Positions come from the mask, as the sampler assigns them; the last token is never fed."""
    P = rollout.prompt_ids.shape[1]
    logits = completion_logits(model, rollout.input_ids, rollout.attention_mask, P, temperature)
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, rollout.completion_ids[..., None]).squeeze(-1)
    entropies = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropies
