"""The preallocated KV cache that `LeanLlama` writes and decodes from."""

from __future__ import annotations

import torch

__all__ = ["KVCache"]


class KVCache:
    """Preallocated KV cache: `k`, `v` [layers, B, kv_heads, max_len, head_dim], and `mask`.

    `mask` [B, kv_heads, 1, max_len] is the additive padding mask (0 or -inf) of the cached
    slots, written by `LeanLlama.forward(..., cache=...)` and read by `LeanLlama.decode`.
    """

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k, self.v = k, v
        L, B, Hkv, S, _ = k.shape
        self.mask = torch.zeros(B, Hkv, 1, S, dtype=k.dtype, device=k.device)
        self.layers = list(
            zip(k.unbind(0), v.unbind(0), strict=True)
        )  # per-layer [B, kv_heads, max_len, D]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    @property
    def dtype(self) -> torch.dtype:
        return self.k.dtype

    def fill_from(self, src: KVCache, rows: torch.Tensor, slots: int) -> None:
        """Slots [0, slots) of row i from `src` row `rows[i]`; the padding mask cleared after.

        How a batch that repeats prompts shares their prefill: run each distinct prompt once
        into `src`, then give every row the keys and values of its prompt.
        """
        self.k[:, :, :, :slots] = src.k[:, :, :, :slots].index_select(1, rows)
        self.v[:, :, :, :slots] = src.v[:, :, :, :slots].index_select(1, rows)
        self.mask.zero_()
        self.mask[..., :slots] = src.mask[..., :slots].index_select(0, rows)
