"""DDP under torchrun, detected from the environment: NCCL on CUDA, gloo on CPU.

Ranks must take every decision together: a rank that leaves the loop, or returns, while another
waits in a collective leaves that one hanging (NCCL) or crashing (gloo: "connection closed by
peer"). So a decision taken on one rank reaches the others through `broadcast_object` (rank 0's
choice) or `any_rank` (stop when any rank must).

Every rank must see one file system for `data.dir` and `run.dir` (on several nodes: a shared
one): the data is prepared once there and rank 0 alone writes checkpoints, and every rank reads
them from there (resume). Node-local disks would leave the other nodes' ranks without them.

Nothing long runs on one rank while the others wait in a collective: NCCL's watchdog aborts a
collective after 10 minutes (`init_process_group`'s default timeout), and preparing a corpus can
take longer. So every rank prepares the data before it joins the group (`launch_rank` says which
one speaks), the data directory's lock letting one build it while the others wait outside any
collective. On CUDA the group is bound to the rank's GPU (`device_id`): NCCL forms its
communicator at once, so a bad GPU or network fails at the start, not at the first all-reduce.

An exception on one rank is not passed on: its process exits, the others' next collective raises
("connection closed by peer", gloo) or blocks (NCCL), and torchrun, seeing a worker fail, stops the
rest (SIGTERM; 30 s later SIGKILL) and exits non-zero, naming the first failed rank as the cause.
Nothing hangs, but rank 0's summary.json says "failed: ... Connection closed by peer" (gloo) or,
killed first, keeps its last status; the real error is in that rank's traceback on stderr.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import torch

from smollab.errors import UserError

T = TypeVar("T")


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")  # where collectives' tensors live (NCCL: the GPU)

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


SINGLE = Dist()


def launch_rank() -> int:
    """This process's global rank as torchrun set it (0 alone), known before the group is joined:
    what runs on every rank before `setup` speaks on rank 0 only."""
    return int(os.environ.get("RANK", "0"))


def setup(device: torch.device) -> tuple[Dist, torch.device]:
    """Join the process group when launched by torchrun; a single process needs nothing. NCCL
    on CUDA, bound to this rank's GPU (`device_id`); gloo on the CPU."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Dist(device=device), device
    import torch.distributed as dist

    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    if device.type == "cuda":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    return Dist(rank, world, local, device), device


def single_process_only(command: str) -> None:
    """Refuse torchrun for a loop that does not shard its work: each rank would run the whole
    loop into the same run directory, N copies racing on its files."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        raise UserError(
            f"smollab {command} does not run under torchrun (WORLD_SIZE={world}): "
            "run it as one process"
        )


def wrap(model: torch.nn.Module, d: Dist) -> torch.nn.Module:
    """DDP around `model` (it starts by broadcasting rank 0's weights and buffers), or `model`.
    A loop that compiles compiles what this returns, `torch.compile(DDP(model))`: TorchDynamo
    then sees the DDP module and splits its graphs at DDP's gradient buckets (DDPOptimizer,
    torch/_dynamo/backends/distributed.py), so the all-reduces overlap the backward; DDP around
    a compiled module sees one opaque graph."""
    if not d.enabled:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[d.device.index] if d.device.type == "cuda" else None)


def broadcast_object(obj: T, d: Dist) -> T:
    """Rank 0's `obj` on every rank: a small picklable decision (a path, a summary)."""
    if not d.enabled:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0, device=d.device)
    return box[0]


def rank0_decides(decide: Callable[[], T], d: Dist) -> T:
    """Rank 0 runs `decide` and every rank gets its value, or every rank raises its UserError (a
    changed config, no usable checkpoint): a refusal on rank 0 alone would leave the others
    waiting in the next collective."""
    if not d.enabled:
        return decide()
    value, refused = None, None
    if d.main:
        try:
            value = decide()
        except UserError as e:
            refused = e
    value, message = broadcast_object((value, str(refused) if refused else None), d)
    if refused:
        raise refused
    if message:
        raise UserError(message)
    return value


def any_rank(flag: bool, d: Dist) -> bool:
    """True on every rank when `flag` is true on any: the one way ranks agree to leave a loop, so
    a rank whose own clock or numbers say stop takes the others with it."""
    if not d.enabled:
        return bool(flag)
    import torch.distributed as dist

    t = torch.tensor([1.0 if flag else 0.0], device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def all_reduce_mean(value: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.enabled:
        import torch.distributed as dist

        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= d.world
    return value


def replicas_agree(tensors: Iterable[torch.Tensor], d: Dist) -> bool:
    """Whether every rank holds the same values, compared by float64 sums per tensor (one
    all-reduce of max(s) and max(-s)). DDP keeps replicas equal bit for bit (the same gradients
    after the all-reduce, the same optimizer state, the same arithmetic), so any difference is
    drift, such as a rank resumed with another optimizer state."""
    if not d.enabled:
        return True
    import torch.distributed as dist

    sums = torch.stack([t.detach().to(d.device, torch.float64).sum() for t in tensors])
    sums = torch.nan_to_num(sums, nan=0.0)  # a diverged run's NaN weights still compare
    both = torch.cat([sums, -sums])
    dist.all_reduce(both, op=dist.ReduceOp.MAX)
    return torch.equal(both[: len(sums)], -both[len(sums) :])


def barrier(d: Dist) -> None:
    if d.enabled:
        import torch.distributed as dist

        dist.barrier()


def teardown(d: Dist) -> None:
    """Leave the group together: a rank that destroys it while rank 0 still writes the final
    checkpoint can abort in gloo ("terminate called without an active exception", seen in CI)."""
    if d.enabled:
        import torch.distributed as dist

        dist.barrier()
        dist.destroy_process_group()
