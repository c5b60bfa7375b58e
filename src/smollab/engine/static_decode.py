"""The static decode step, and which decode (eager, static or compiled) a device runs.

The eager step (`LeanLlama.decode` with Python ints) reads the cache up to the tokens so far and
takes its slot, rope row and record column as Python integers: every token is a different graph,
which neither a compiler nor a CUDA graph can take whole. The static step keeps the step counter
and the slot on the device as [1] long tensors that it advances itself, reads the rope row by
`index_select`, attends over the cache's whole length with the slots not yet written masked
(`KVCache.decode_mask`, `KVCache.write`) and writes the decode record through fixed scratch
buffers, one `index_copy_` a buffer (`DecodeRecord.commit`): every token runs the same shapes on
the same buffers. Streams stay the same: the token draw is the eager one, and the logits differ
from the eager step's by float rounding only (masked slots weigh exactly 0).

`compiled` runs that step through `torch.compile` (inductor; one compile per shape, the cache
length bucketed so prompts of nearby lengths share it). Its fused kernels round differently, so
on a near-flat distribution a draw at a CDF boundary can flip (measured: 2 rows of 256). `auto`
is the measured best of each device (`choose_decode`); docs/architecture.md has the figures.
"""

from __future__ import annotations

from functools import cache

import torch

__all__ = ["DECODES", "choose_decode", "compiled_step", "static_step"]

DECODES = ("auto", "eager", "static", "compiled")

# auto, per device type: the decode that measured fastest there, and why (the run log says it)
_AUTO = {
    "cpu": (
        "eager",
        "auto on cpu: the eager step measured fastest, the static one 1.02x and the compiled "
        "one 1.11x its time on the 1.25M model (benchmarks/static_decode.py)",
    ),
}
_AUTO_OTHER = ("eager", "auto: no faster decode measured on this device yet")


def choose_decode(choice: str, device: torch.device) -> tuple[str, str]:
    """(decode, reason): `choice` as given, or for `auto` the measured best on `device`'s type."""
    if choice not in DECODES:
        raise ValueError(f"decode must be one of {', '.join(DECODES)}, not {choice!r}")
    if choice != "auto":
        return choice, f"decode={choice} as configured"
    return _AUTO.get(torch.device(device).type, _AUTO_OTHER)


def static_step(lean, tokens, cos, sin, kv_cache, record, step, slot) -> torch.Tensor:
    """One static decode step of `lean` (a `LeanLlama` or `LaneLlama`): logits [B, V] of
    `tokens` [B]. cos, sin: the rope rows of every step, [T, B, 1, head_dim]; step, slot: [1]
    long tensors on the device, the step (the record's column, the rope row) and its cache slot,
    both advanced by one here. `kv_cache` must have had `start_static` after its prefill."""
    c = cos.index_select(0, step).squeeze(0)
    s = sin.index_select(0, step).squeeze(0)
    logits = lean.decode(tokens, c, s, kv_cache, slot, record, step)
    if record is not None:
        record.commit(step)
    step.add_(1)
    slot.add_(1)
    return logits


@cache
def compiled_step():
    """`static_step` through `torch.compile` (made once per process: its compiled graphs, one
    per shape, are reused by every sampler)."""
    return torch.compile(static_step, dynamic=False, fullgraph=True)
