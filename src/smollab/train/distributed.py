"""DDP under torchrun, detected from the environment: NCCL on CUDA, gloo on CPU."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


def setup(device: torch.device) -> tuple[Dist, torch.device]:
    """Join the process group when launched by torchrun; a single process needs nothing."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Dist(), device
    import torch.distributed as dist

    d = Dist(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"]))
    if device.type == "cuda":
        device = torch.device("cuda", d.local_rank)
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return d, device


def all_reduce_mean(value: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.enabled:
        import torch.distributed as dist

        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= d.world
    return value


def barrier(d: Dist) -> None:
    if d.enabled:
        import torch.distributed as dist

        dist.barrier()


def teardown(d: Dist) -> None:
    if d.enabled:
        import torch.distributed as dist

        dist.destroy_process_group()
