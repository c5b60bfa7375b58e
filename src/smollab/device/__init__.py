"""The device a run trains on: what it supports and how fast it can go. Importing this package
imports nothing (no torch), so the lab reads the measured peaks without paying for torch.

- `runtime`    device, precision, autocast, TF32, compile, threads, the AdamW implementation, and
               the per-device primitives the loops share (copies, synchronize, peak memory, cache)
- `mfu`        model FLOPs utilization: FLOPs per token, GPU datasheet peaks, measured and cached
               CPU matmul peaks (a lab child never measures: `LAB_CHILD_ENV`), the machine's load
- `cache_dir`  where smollab keeps what it measured about this machine
"""
