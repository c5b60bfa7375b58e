"""The preallocated KV cache that `LeanLlama` writes and decodes from.

A decode step addresses it by a slot given either as a Python int (the eager step: it reads
the slots written so far, a shape that grows every token) or as a [1] long tensor on the
cache's device (the static step: it reads every slot, those not yet written masked, so each
token runs the same shapes on the same buffers, what a compiler or a CUDA graph needs).
"""

from __future__ import annotations

import torch

__all__ = ["KVCache"]


class KVCache:
    """Preallocated KV cache: per layer `k`, `v` [B, kv_heads, max_len, head_dim] (`layers`),
    and `mask`.

    `mask` [B, kv_heads, 1, max_len] is the additive padding mask (0 or -inf) of the cached
    slots, written by `LeanLlama.forward(..., cache=...)` and read by `LeanLlama.decode`.
    Each layer's k and v is a tensor of its own, not a view of one stacked buffer: a compiled
    static step then writes them in place (inputs that alias each other it copied whole).
    """

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor]]):
        self.layers = layers  # per layer (k, v), each [B, kv_heads, max_len, D]
        k = layers[0][0]
        B, Hkv, S, _ = k.shape
        self.mask = torch.zeros(B, Hkv, 1, S, dtype=k.dtype, device=k.device)

    @classmethod
    def empty(cls, layers: int, batch_size: int, kv_heads: int, max_len: int, head_dim: int, **kw):
        """An uninitialized cache (`kw`: dtype, device); every slot is written before it is read."""
        shape = (batch_size, kv_heads, max_len, head_dim)
        return cls([(torch.empty(shape, **kw), torch.empty(shape, **kw)) for _ in range(layers)])

    def start_static(self, slots: int) -> None:
        """Ready a static decode after a prefill of slots [0, slots): every later slot zeroed (an
        uninitialized one could hold NaN, which a zero attention weight would not cancel) and
        masked until a step writes it."""
        for k, v in self.layers:
            k[:, :, slots:].zero_()
            v[:, :, slots:].zero_()
        self.mask[..., slots:] = float("-inf")

    def decode_mask(self, slot: int | torch.Tensor) -> torch.Tensor:
        """The additive mask [B * kv_heads, 1, S] of a decode step writing `slot`: S = slot + 1
        for an int; for a tensor S = max_len, the slot unmasked first (after `start_static`)."""
        B, Hkv = self.mask.shape[:2]
        if isinstance(slot, int):
            return self.mask.view(B * Hkv, 1, -1)[..., : slot + 1]
        return self.mask.index_fill_(-1, slot, 0.0).view(B * Hkv, 1, -1)

    def write(
        self, layer: int, slot: int | torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store one step's k, v [B, kv_heads, D] of `layer` at `slot`; returns the keys and
        values the step attends to, [B * kv_heads, S, D] (S as in `decode_mask`)."""
        B, Hkv, D = k.shape
        if isinstance(slot, int):
            kc, vc = self.layers[layer]
            kc.select(2, slot).copy_(k)
            vc.select(2, slot).copy_(v)
            S = slot + 1
            return kc[:, :, :S].view(B * Hkv, S, D), vc[:, :, :S].view(B * Hkv, S, D)
        # index_put_ (not index_copy_): inductor writes it in place; an index_copy_ of a graph
        # input it compiled as a copy of the whole cache, every step
        kc, vc = self.layers[layer]
        kc[:, :, slot] = k.unsqueeze(2)
        vc[:, :, slot] = v.unsqueeze(2)
        return kc.view(B * Hkv, -1, D), vc.view(B * Hkv, -1, D)

    @property
    def batch_size(self) -> int:
        return self.mask.shape[0]

    @property
    def max_len(self) -> int:
        return self.mask.shape[-1]

    @property
    def dtype(self) -> torch.dtype:
        return self.mask.dtype

    def fill_from(self, src: KVCache, rows: torch.Tensor, slots: int) -> None:
        """Slots [0, slots) of row i from `src` row `rows[i]`; the padding mask cleared after.

        How a batch that repeats prompts shares their prefill: run each distinct prompt once
        into `src`, then give every row the keys and values of its prompt.
        """
        for dst, from_ in zip(self.layers, src.layers, strict=True):
            for d, f in zip(dst, from_, strict=True):
                d[:, :, :slots] = f[:, :, :slots].index_select(0, rows)
        self.mask.zero_()
        self.mask[..., :slots] = src.mask[..., :slots].index_select(0, rows)
