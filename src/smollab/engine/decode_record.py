"""What the sampler's decode computed, kept so the policy's first training forward need not redo it.

A GRPO step samples completions with the policy's weights, then runs the policy forward over the
same tokens with the same weights to get log-probs with autograd: every matmul of that forward
repeats one the decode already did. With a `DecodeRecord` the decode writes its matmul outputs
(and each draw's probabilities) straight into these buffers (`out=`, no extra op), and
`engine.replay` builds the autograd graph around them instead of recomputing them.

Layouts are step-major, [layers, T, B, width] with T the decode steps: a step writes one
contiguous [B, width] slice (row-strided writes measured slower), and the training forward
reads the transposed view.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

__all__ = ["DecodeRecord"]


@dataclass
class DecodeRecord:
    """Buffers for T decode steps of a `LeanLlama` (see the module docstring).

    qkv: [layers, T, B, (Hq + 2 Hkv) * D] the fused q, k, v projections (biases added), RoPE
    applied in place to q, k where the layer rotates and has no q/k norm (a NoPE layer, or
    Qwen3's whose norm comes before RoPE, keeps the projection as it is).
    x_attn: [layers, T, B, H] the residual stream after each attention block.
    gu: [layers, T, B, 2 * mlp_width] the fused gate and up projections (zero-padded columns).
    All but `probs` in the lean copy's dtype, the policy's own.
    x_mlp: [layers, T, B, H] the residual stream after each MLP block.
    probs: [T + 1, B, V] softmax(logits / temperature) of every draw (the first from the prefill).
    steps: decode steps done, set by the sampler.
    """

    qkv: torch.Tensor
    x_attn: torch.Tensor
    gu: torch.Tensor
    x_mlp: torch.Tensor
    probs: torch.Tensor
    steps: int = 0
    _views: list | None = field(default=None, init=False, repr=False)
    _scratch: tuple | None = field(default=None, init=False, repr=False)

    def step_views(self, step: int | torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
        """Per layer, the [B, width] slices (qkv, gu, x_attn, x_mlp) that decode step `step` fills.

        Made once, by one `unbind` a buffer and layer, instead of four slicing ops a layer in
        every step. A static step (`step` a [1] long tensor) fills fixed scratch buffers instead,
        the same every step, and `commit(step)` copies them into the step's column.
        """
        if isinstance(step, torch.Tensor):
            return [tuple(buf[i] for buf in self.scratch()) for i in range(self.qkv.shape[0])]
        if self._views is None:
            bufs = (self.qkv, self.gu, self.x_attn, self.x_mlp)
            per_layer = [[t[i].unbind(0) for t in bufs] for i in range(self.qkv.shape[0])]
            self._views = [[tuple(b[s] for b in bl) for bl in per_layer] for s in range(self.T)]
        return self._views[step]

    def scratch(self) -> tuple[torch.Tensor, ...]:
        """The static step's buffers (qkv, gu, x_attn, x_mlp), [layers, B, width] each."""
        if self._scratch is None:
            bufs = (self.qkv, self.gu, self.x_attn, self.x_mlp)
            self._scratch = tuple(torch.empty_like(b[:, 0]) for b in bufs)
        return self._scratch

    def commit(self, step: torch.Tensor) -> None:
        """A static step's outputs from the scratch buffers into column `step` ([1] long)."""
        for buf, s in zip(
            (self.qkv, self.gu, self.x_attn, self.x_mlp), self.scratch(), strict=True
        ):
            buf[:, step] = s.unsqueeze(1)  # index_put_: in place when compiled (`KVCache.write`)

    @property
    def T(self) -> int:
        return self.qkv.shape[1]

    @staticmethod
    def _shapes(lean, B: int, T: int) -> dict[str, tuple[int, ...]]:
        """The buffers' shapes for `lean` (a `LeanLlama`) decoding T steps of B rows."""
        L, H = lean.num_layers, lean.hidden_size
        nqkv = (lean.num_heads + 2 * lean.num_kv_heads) * lean.head_dim
        return {
            "qkv": (L, T, B, nqkv),
            "x_attn": (L, T, B, H),
            "gu": (L, T, B, 2 * lean.mlp_width),
            "x_mlp": (L, T, B, H),
            "probs": (T + 1, B, lean.vocab_size),
        }

    @classmethod
    def empty(cls, lean, B: int, T: int, dtype=None) -> DecodeRecord:
        """Uninitialized buffers for `lean` decoding T steps of B rows (probs always float32)."""
        dev = lean.embed.device
        return cls(
            **{
                name: torch.empty(
                    shape,
                    device=dev,
                    dtype=torch.float32 if name == "probs" else dtype or lean.embed.dtype,
                )
                for name, shape in cls._shapes(lean, B, T).items()
            }
        )

    @classmethod
    def elements(cls, lean, B: int, T: int, layer_copies: int = 1) -> int:
        """Numbers held by `empty(lean, B, T)`: callers keep records within a memory budget.
        layer_copies: the layers' buffers counted that many times (the lanes' replay reads a
        lane-major copy of them)."""
        return sum(
            math.prod(shape) * (1 if name == "probs" else layer_copies)
            for name, shape in cls._shapes(lean, B, T).items()
        )
