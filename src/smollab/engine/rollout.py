"""One batch of sampled completions (`Rollout`), and the padding and EOS rules that make one.

Shared by the sampler that fills it, the log-prob forwards and the replay that read it, and the
loops that score it; its helpers are the one place that trims padding and decodes text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import torch

from smollab.engine.decode_record import DecodeRecord


@dataclass
class Rollout:
    """One batch of completions. Masks are int64 (1 = token); all tensors on the model's device."""

    prompt_ids: torch.Tensor  # [B, P] left-padded with pad_token_id
    prompt_mask: torch.Tensor  # [B, P] 1 for prompt tokens
    completion_ids: torch.Tensor  # [B, T] pad_token_id after EOS
    completion_mask: torch.Tensor  # [B, T] 1 up to and including the first EOS
    logprobs: torch.Tensor  # [B, T] float32 log p(token) at temperature; 0 where masked
    truncated: torch.Tensor  # [B] bool: no EOS within the completion
    record: DecodeRecord | None = None  # what the decode computed (`generate(record=True)`)

    @property
    def input_ids(self) -> torch.Tensor:
        """[B, P + T] prompt and completion, for the policy / reference forward."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    @property
    def completion_lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(1)

    def select(self, rows: torch.Tensor) -> Rollout:
        """The rollout of these rows (without the decode record, which holds the whole batch)."""
        return replace(
            self,
            record=None,
            **{f.name: getattr(self, f.name)[rows] for f in fields(self) if f.name != "record"},
        )

    def completion_rows(self) -> list[list[int]]:
        """Each completion's tokens up to and including its EOS (what rewards and texts read)."""
        lengths = self.completion_lengths.tolist()
        return [row[:n] for row, n in zip(self.completion_ids.tolist(), lengths, strict=True)]

    def prompt_rows(self) -> list[list[int]]:
        """Each prompt's tokens, its left padding removed."""
        P, lengths = self.prompt_ids.shape[1], self.prompt_mask.sum(1).tolist()
        return [row[P - n :] for row, n in zip(self.prompt_ids.tolist(), lengths, strict=True)]

    def completion_texts(self, tokenizer) -> list[str]:
        return tokenizer.batch_decode(self.completion_rows(), skip_special_tokens=True)

    def prompt_texts(self, tokenizer) -> list[str]:
        return tokenizer.batch_decode(self.prompt_rows(), skip_special_tokens=True)


def left_pad(
    prompts: Sequence[Sequence[int]], pad_token_id: int, device=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists -> (ids [B, P], mask [B, P]) on `device`, left-padded to the longest prompt
    (built on the CPU, row by row, then copied in one go)."""
    if not prompts:
        raise ValueError("no prompts")
    P = max(len(p) for p in prompts)
    if min(len(p) for p in prompts) == 0:
        raise ValueError("empty prompt: every prompt needs at least one token (e.g. BOS)")
    cpu = torch.device("cpu")
    ids = torch.full((len(prompts), P), pad_token_id, dtype=torch.long, device=cpu)
    mask = torch.zeros((len(prompts), P), dtype=torch.long, device=cpu)
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :] = torch.as_tensor(list(p), dtype=torch.long, device=cpu)
        mask[i, P - len(p) :] = 1
    return ids.to(device), mask.to(device)


def distinct_prompts(
    prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, lanes: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(distinct prompt rows [U, P], their masks [U, P], row -> distinct index [B]).

    A GRPO batch holds `num_generations` completions of each prompt: the sampler's prefill and
    the log-prob forwards run each distinct prompt once and share its keys and values.
    lanes: rows are `lanes` equal blocks (`LaneLlama`'s lanes), each sees a prompt its own way:
    the prompts are distinct within each block, as many per block (a block with fewer repeats
    its last), so the distinct rows split into the same lanes.
    """
    if lanes > 1:
        b, rest = divmod(prompt_ids.shape[0], lanes)
        if rest:
            raise ValueError(f"{prompt_ids.shape[0]} rows do not split into {lanes} lanes")
        blocks = [
            distinct_prompts(prompt_ids[s : s + b], prompt_mask[s : s + b])
            for s in range(0, lanes * b, b)
        ]
        U = max(u.shape[0] for u, _, _ in blocks)

        def padded(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t, t[-1:].expand(U - t.shape[0], -1)])

        return (
            torch.cat([padded(u) for u, _, _ in blocks]),
            torch.cat([padded(m) for _, m, _ in blocks]),
            torch.cat([rows + i * U for i, (_, _, rows) in enumerate(blocks)]),
        )
    key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], 1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    P = prompt_ids.shape[1]
    return uniq[:, :P], uniq[:, P:].to(prompt_mask.dtype), inverse


def finish_at_eos(
    prompt_ids, prompt_mask, comp, lps, eos_ids: list[int], pad_id: int, stop_at_eos: bool
) -> Rollout:
    """Masks from the first EOS; pad and zero everything after it."""
    if stop_at_eos and eos_ids:
        eos = torch.as_tensor(eos_ids, device=comp.device)
        is_eos = torch.isin(comp, eos)
        before = is_eos.long().cumsum(1) - is_eos.long()  # EOS seen strictly before this position
        mask = (before == 0).long()
        truncated = ~is_eos.any(1)
        comp = comp.masked_fill(mask == 0, pad_id)
        lps = lps.masked_fill(mask == 0, 0.0)
    else:
        mask = torch.ones_like(comp)
        truncated = torch.ones(comp.shape[0], dtype=torch.bool, device=comp.device)
    return Rollout(prompt_ids, prompt_mask, comp, mask, lps.float(), truncated)
