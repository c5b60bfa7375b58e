"""The config keys each training loop does not read, with the reason: one table, beside the loops.

`smollab bench` consults it before switching a knob on, so a knob a loop ignores is reported as
skipped with this reason instead of being measured as if it did something. A new loop adds its
row here. Kept free of torch: the bench parent imports it.
"""

from __future__ import annotations

UNREAD: dict[str, dict[str, str]] = {
    "pretrain": {
        "perf.num_workers": "it slices batches from a memmap in-process, no DataLoader",
        "perf.pin_memory": "it slices batches from a memmap in-process, no DataLoader",
    },
    "grpo": {
        "perf.compile": "it never compiles (the lean sampler decodes eagerly)",
        "train.grad_accum": "one optimizer step per generated batch",
        "perf.num_workers": "prompts are token lists in memory, no DataLoader",
        "perf.pin_memory": "no DataLoader",
    },
}


def unread_reason(loop: str, key: str) -> str | None:
    """Why `loop` ignores config `key`, or None when it reads it."""
    return UNREAD.get(loop, {}).get(key)
