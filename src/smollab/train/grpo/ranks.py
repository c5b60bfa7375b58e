"""GRPO under torchrun: each rank rolls out, scores and trains on its share of a step's prompt
groups, and the ranks put together what must cover the whole batch.

- Prompts: every rank draws the step's prompts alike and keeps a contiguous run of whole groups
  (`my_prompts`), sampled with its own seed (`rollout_seed`).
- Rewards and texts are gathered (`gather`), so every rank computes the batch's advantages
  (exact for every `scale_rewards`, "batch" included) and the metrics row a single process would.
- Loss: a rank's rows are micro-batches of the whole step (`update`, weighted by the step's
  token and row counts, `step_totals`), so the ranks' losses SUM to the step's loss; their
  gradients are summed (`sum_over_ranks`, no DDP wrapper: the decode replay and routing call
  the model's modules themselves) and every rank takes the same optimizer step. Stats are
  merged as micro-batches'.
- Leaving: SIGINT only sets a flag (`Interrupts`) and the ranks leave together at the next step's
  start (`leave`), as on a time budget; rank 0 decides the failure rules (`broadcast_object`).
With one process every function here is the identity or a local computation.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field

import torch

from smollab.engine.rollout import Rollout
from smollab.errors import UserError
from smollab.train.distributed import Dist
from smollab.train.grpo.update import merge_stats
from smollab.train.seeds import stream_seed

BUCKET = 1 << 24  # gradient elements per all-reduce: few calls, bounded extra memory


def check(cfg) -> None:
    """Refuse, in one line, what cannot be split across torchrun's WORLD_SIZE ranks exactly:
    before joining the process group, so every rank refuses alike and none waits for another."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return
    g, tc = cfg.grpo, cfg.train
    groups = tc.batch_size // g.num_generations
    if groups % world:
        raise UserError(
            f"train.batch_size={tc.batch_size} holds {groups} prompt groups "
            f"(grpo.num_generations={g.num_generations}), not divisible by the "
            f"{world} torchrun processes: each rank takes whole groups"
        )
    if (groups // world) % tc.grad_accum:
        raise UserError(
            f"train.grad_accum={tc.grad_accum} must divide each rank's "
            f"{groups // world} prompt groups (train.batch_size={tc.batch_size} / "
            f"grpo.num_generations={g.num_generations} / {world} ranks)"
        )
    if (g.steps_per_generation or tc.grad_accum) > tc.grad_accum:
        raise UserError(
            f"grpo.steps_per_generation={g.steps_per_generation} does not run under torchrun: "
            "each optimizer step would take a slice of every rank's generated batch; run it "
            "as one process"
        )
    if g.top_entropy_quantile < 1:
        raise UserError(
            "grpo.top_entropy_quantile does not run under torchrun: its threshold would be "
            "each rank's quantile, not the step's; run it as one process"
        )
    if g.routing.enabled:
        raise UserError(
            "grpo.routing.enabled does not run under torchrun: its detector and "
            "routes see one process's rollouts; run it as one process"
        )


def my_prompts(picked: list[int], d: Dist) -> list[int]:
    """This rank's contiguous share of the step's prompts (whole groups: `check` made it even)."""
    n = len(picked) // d.world
    return picked[d.rank * n : (d.rank + 1) * n]


def rollout_seed(seed: int, step: int, d: Dist) -> int:
    """The sampler's seed: one process keeps its historic stream, each rank has its own."""
    return stream_seed(seed, step, 1, d.rank) if d.enabled else stream_seed(seed, step, 1)


@dataclass
class Whole:
    """The whole step's rollouts, all ranks in rank order, as every rank sees them."""

    total: torch.Tensor  # [N] rewards (CPU)
    per_fn: dict[str, torch.Tensor]
    prompts: list[str]
    completions: list[str]
    lengths: torch.Tensor  # [N] completion lengths
    truncated: torch.Tensor  # [N] bool
    logp_sums: torch.Tensor  # [N] float64 sampled log p over each row's loss-mask tokens
    tokens: torch.Tensor  # [N] float64 those tokens
    rows: slice = field(default_factory=lambda: slice(None))  # this rank's rows of the batch

    def select(self, rows: slice) -> Whole:
        """These rows of one process's batch (several optimizer steps per generated batch)."""
        return Whole(
            total=self.total[rows],
            per_fn={k: v[rows] for k, v in self.per_fn.items()},
            prompts=self.prompts[rows],
            completions=self.completions[rows],
            lengths=self.lengths[rows],
            truncated=self.truncated[rows],
            logp_sums=self.logp_sums[rows],
            tokens=self.tokens[rows],
        )

    def entropy(self, rows: slice) -> float:
        """The entropy estimate of these rows: mean -log p of the sampled tokens (unbiased)."""
        tokens = float(self.tokens[rows].sum())
        return -float(self.logp_sums[rows].sum()) / tokens if tokens else 0.0


def gather(
    r: Rollout,
    mask: torch.Tensor,
    d: Dist,
    *,
    total: torch.Tensor,
    per_fn: dict[str, torch.Tensor],
    prompts: list[str],
    completions: list[str],
) -> Whole:
    """Every rank's rewards, texts and rollout sizes, on every rank (one all_gather_object)."""
    m = mask.double()
    mine = (
        total.detach().cpu(),
        {k: v.detach().cpu() for k, v in per_fn.items()},
        prompts,
        completions,
        r.completion_lengths.cpu(),
        r.truncated.cpu(),
        (r.logprobs.double() * m).sum(1).cpu(),
        m.sum(1).cpu(),
    )
    if not d.enabled:
        return Whole(*mine)
    import torch.distributed as dist

    parts: list = [None] * d.world
    dist.all_gather_object(parts, mine)
    n = len(total)
    return Whole(
        total=torch.cat([p[0] for p in parts]),
        per_fn={k: torch.cat([p[1][k] for p in parts]) for k in mine[1]},
        prompts=[t for p in parts for t in p[2]],
        completions=[t for p in parts for t in p[3]],
        lengths=torch.cat([p[4] for p in parts]),
        truncated=torch.cat([p[5] for p in parts]),
        logp_sums=torch.cat([p[6] for p in parts]),
        tokens=torch.cat([p[7] for p in parts]),
        rows=slice(d.rank * n, (d.rank + 1) * n),
    )


def step_totals(mask: torch.Tensor, d: Dist) -> tuple[float, int] | None:
    """(unmasked tokens, rows) of the whole step across the ranks, which weigh each rank's share of
    the loss (`update.RunRows.whole`); None for one process, whose rows are the whole step."""
    if not d.enabled:
        return None
    import torch.distributed as dist

    counts = torch.tensor([float(mask.sum()), float(mask.shape[0])], device=d.device)
    dist.all_reduce(counts)
    return float(counts[0]), int(counts[1])


def sum_over_ranks(
    loss: float, stats: dict[str, float], mask: torch.Tensor, level: str, trainable, d: Dist
) -> tuple[float, dict[str, float]]:
    """The ranks' gradients summed (each rank then holds the step's gradient), and the step's
    loss and stats from every rank's share; one process: as they are."""
    if not d.enabled:
        return loss, stats
    import torch.distributed as dist

    all_reduce_grads(trainable, d)
    parts: list = [None] * d.world
    dist.all_gather_object(parts, (loss, stats, mask.cpu()))
    merged = merge_stats([p[1] for p in parts], [p[2] for p in parts], [1.0] * d.world, level)
    return sum(p[0] for p in parts), merged


def all_reduce_grads(params: list[torch.Tensor], d: Dist) -> None:
    """Sum `.grad` over the ranks, in flat buckets per dtype. A parameter that some rank has no
    gradient for takes part with zeros there, so every rank calls the same collectives; one that
    no rank has a gradient for keeps `.grad = None`, as in one process, where AdamW skips it
    (zeros would decay it and move it along its old momentum)."""
    if not d.enabled:
        return
    import torch.distributed as dist

    had = torch.tensor([p.grad is not None for p in params], dtype=torch.uint8, device=d.device)
    dist.all_reduce(had, op=dist.ReduceOp.MAX)  # 1 where any rank has a gradient
    summed = [p for p, h in zip(params, had.tolist(), strict=True) if h]
    for p in summed:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for p in summed:
        by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    for grads in by_dtype.values():
        bucket: list[torch.Tensor] = []
        for i, grad in enumerate(grads):
            bucket.append(grad)
            if sum(x.numel() for x in bucket) >= BUCKET or i == len(grads) - 1:
                flat = torch.cat([x.reshape(-1) for x in bucket])
                dist.all_reduce(flat)
                for x, y in zip(bucket, flat.split([x.numel() for x in bucket]), strict=True):
                    x.copy_(y.view_as(x))
                bucket = []


def broadcast_weights(model: torch.nn.Module, d: Dist, trainable_only: bool = False) -> None:
    """Rank 0's parameters and buffers on every rank (as DDP starts), whatever each loaded;
    `trainable_only`: the trained ones only (a quantized base, loaded alike on every rank)."""
    if not d.enabled:
        return
    import torch.distributed as dist

    params = [p for p in model.parameters() if p.requires_grad or not trainable_only]
    with torch.no_grad():
        for t in params + ([] if trainable_only else list(model.buffers())):
            dist.broadcast(t.data, src=0)


class Interrupts:
    """Under torchrun SIGINT (torchrun forwards it to every worker) sets a flag instead of raising
    mid-collective; the ranks leave together at the next step (`leave`). A second SIGINT raises."""

    def __init__(self, d: Dist):
        self.flag, self.previous = False, None
        if d.enabled:
            self.previous = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame) -> None:
        self.flag = True
        signal.signal(signal.SIGINT, self.previous)

    def restore(self) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def leave(out_of_time: bool, interrupted: bool, d: Dist) -> str | None:
    """Why every rank leaves the loop now ("interrupted", "time"), or None: one all-reduce."""
    if not d.enabled:
        return "time" if out_of_time else None
    import torch.distributed as dist

    flags = torch.tensor([float(out_of_time), float(interrupted)], device=d.device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return "interrupted" if flags[1] else "time" if flags[0] else None
