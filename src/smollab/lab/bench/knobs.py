"""The knobs `smollab bench` switches on one at a time, and the plan for a workload: which knobs run
with which values, which are skipped and why, and which join the combination.

A knob that cannot apply is listed as skipped with the reason, never run and reported as if it
worked: CUDA-only knobs off CUDA, a knob whose config key the workload's command does not read
(`smollab.config.not_read.NOT_READ` says which and why; the command's schema refuses the key), and
anything the runtime itself reported as skipped in the variant's training.log.

That table imports nothing heavy: the parent never imports torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from smollab.config.not_read import not_read
from smollab.errors import UserError
from smollab.lab.spec_common import override_value


@dataclass(frozen=True)
class Knob:
    name: str
    what: str
    key: str  # the config key it switches: a loop that does not read it is skipped
    off: dict[str, Any] = field(default_factory=dict)  # forced on the baseline when benched
    on: dict[str, Any] = field(default_factory=dict)
    kinds: tuple[str, ...] = ("pretrain", "grpo", "sft")
    group: str | None = None  # alternatives: only the best of a group joins the combination
    cuda_only: str | None = None  # reason, when the knob only means something on CUDA
    runtime_word: str | None = None  # how the runtime names it in its `skipped` list
    # "train": timed by the loop's step time; "wall": by wall clock between logged steps, for
    # knobs whose cost (a metrics sync, a checkpoint) falls outside the timed step
    timing: Literal["train", "wall"] = "train"


_IN_PROCESS = {"data.num_workers": 0, "data.prefetch_factor": None}

KNOBS: dict[str, Knob] = {
    k.name: k
    for k in [
        Knob(
            "bf16",
            "bf16 autocast",
            "perf.precision",
            {"perf.precision": "fp32"},
            {"perf.precision": "bf16"},
            group="precision",
            runtime_word="bf16",
        ),
        Knob(
            "fp16",
            "fp16 autocast + GradScaler",
            "perf.precision",
            {"perf.precision": "fp32"},
            {"perf.precision": "fp16"},
            group="precision",
            runtime_word="fp16",
        ),
        Knob(
            "tf32",
            "TF32 matmuls",
            "perf.tf32",
            {"perf.tf32": False},
            {"perf.tf32": True},
            cuda_only="TF32 is a CUDA (Ampere+) matmul mode",
            runtime_word="tf32",
        ),
        Knob(
            "compile",
            "torch.compile",
            "perf.compile",
            {"perf.compile": False},
            {"perf.compile": True},
            runtime_word="compile",
        ),
        Knob(
            "fused",
            "fused AdamW (vs plain)",
            "perf.optimizer_impl",
            {"perf.optimizer_impl": "plain"},
            {"perf.optimizer_impl": "fused"},
            group="optimizer",
            runtime_word="fused",
        ),
        Knob(
            "foreach",
            "foreach AdamW (vs plain)",
            "perf.optimizer_impl",
            {"perf.optimizer_impl": "plain"},
            {"perf.optimizer_impl": "foreach"},
            group="optimizer",
        ),
        Knob(
            "grad_ckpt",
            "gradient checkpointing",
            "perf.grad_checkpointing",
            {"perf.grad_checkpointing": False},
            {"perf.grad_checkpointing": True},
        ),
        Knob(
            "grad_accum",
            "2x accumulation of half batches (same tokens/step; grpo: same batch)",
            "train.grad_accum",
        ),
        Knob(
            "sdpa",
            "SDPA attention (vs eager)",
            "perf.attn_implementation",
            {"perf.attn_implementation": "eager"},
            {"perf.attn_implementation": "sdpa"},
        ),
        Knob(
            "completion_len",
            "grpo.max_completion_length halved",
            "grpo.max_completion_length",
            kinds=("grpo",),
        ),
        Knob(
            "reward_workers",
            "reward worker processes (2)",
            "grpo.reward_workers",
            {"grpo.reward_workers": 0},
            {"grpo.reward_workers": 2},
            kinds=("grpo",),
        ),
        # SFT's DataLoader: the baseline loads in the training process, unpinned
        Knob(
            "workers",
            "DataLoader worker processes (2)",
            "data.num_workers",
            _IN_PROCESS,
            {"data.num_workers": 2},
            kinds=("sft",),
            group="loader",
        ),
        Knob(
            "prefetch",
            "2 workers, each 8 batches ahead (vs in-process)",
            "data.prefetch_factor",
            _IN_PROCESS,
            {"data.num_workers": 2, "data.prefetch_factor": 8},
            kinds=("sft",),
            group="loader",
        ),
        Knob(
            "pin_memory",
            "pinned batches (the loader pins them)",
            "data.pin_memory",
            {"data.pin_memory": False},
            {"data.pin_memory": True},
            kinds=("sft",),
            cuda_only="pinned memory speeds host-to-GPU copies",
        ),
        # the loop's bookkeeping, which the speed guides also tune
        Knob(
            "log_interval",
            "metrics logged every 10 steps (vs every step)",
            "train.log_interval",
            {"train.log_interval": 1},
            {"train.log_interval": 10},
            timing="wall",
        ),
        Knob(
            "save_interval",
            "a full checkpoint every 5 steps (vs none): the cost of saving",
            "train.save_interval",
            {"train.save_interval": 0},
            {"train.save_interval": 5},
            timing="wall",
        ),
    ]
}


def as_overrides(d: dict[str, Any]) -> list[str]:
    return [f"{k}={override_value(v)}" for k, v in d.items()]


def knob_values(knob: Knob, cfg) -> tuple[dict[str, Any], dict[str, Any]]:
    """(baseline values, switched-on values) for one knob on this config; ValueError = skip."""
    if knob.name == "grad_accum" and hasattr(cfg, "grpo"):  # GRPO: the same batch, in halves
        a, groups = cfg.train.grad_accum, cfg.train.batch_size // cfg.grpo.num_generations
        if groups % (2 * a):
            raise ValueError(f"{groups} prompt groups do not split into {2 * a} micro-batches")
        return {}, {"train.grad_accum": 2 * a}
    if knob.name == "grad_accum":
        b, a = cfg.train.batch_size, cfg.train.grad_accum
        if b < 2 or b % 2:
            raise ValueError(f"train.batch_size={b} cannot be halved")
        return {}, {"train.batch_size": b // 2, "train.grad_accum": 2 * a}
    if knob.name == "completion_len":
        n = cfg.grpo.max_completion_length
        if n < 2:
            raise ValueError(f"grpo.max_completion_length={n} cannot be halved")
        return {}, {"grpo.max_completion_length": n // 2}
    return dict(knob.off), dict(knob.on)


def select(names: list[str] | None, kind: str) -> list[str]:
    if names is None:
        return [n for n, k in KNOBS.items() if kind in k.kinds]
    unknown = [n for n in names if n not in KNOBS]
    if unknown:
        raise UserError(f"--knobs: unknown {', '.join(unknown)} (known: {', '.join(KNOBS)})")
    return list(dict.fromkeys(names))


def baseline_values(names: list[str], kind: str, cfg) -> dict[str, Any]:
    """Every benched knob off (values of knobs that later turn out skipped are harmless), except
    those whose key the command does not read: its schema would refuse them."""
    out: dict[str, Any] = {}
    for n in names:
        k = KNOBS[n]
        if kind in k.kinds and not not_read(kind, k.key):
            with contextlib.suppress(ValueError):
                out.update(knob_values(k, cfg)[0])
    return out


def plan(
    names: list[str],
    kind: str,
    cfg,
    device: str,
    unread: Callable[[str, str], str | None] = not_read,
) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, str]]]:
    """([(knob, switched-on values)], [(knob, reason skipped)]) on `device` (cpu, cuda, mps).

    `unread(command, key)`: why the command does not read a config key, or None when it does.
    """
    runs, skipped = [], []
    for n in names:
        k = KNOBS[n]
        if kind not in k.kinds:
            skipped.append((n, f"applies to {' and '.join(k.kinds)} workloads only"))
        elif k.cuda_only and device != "cuda":
            skipped.append((n, f"{k.cuda_only}; device is {device}"))
        elif why := unread(kind, k.key):
            skipped.append((n, f"the {kind} loop (smollab.train.{kind}) does not use it: {why}"))
        else:
            try:
                runs.append((n, knob_values(k, cfg)[1]))
            except ValueError as e:
                skipped.append((n, str(e)))
    return runs, skipped


def combination(results: list[dict[str, Any]], min_speedup: float) -> list[str]:
    """The knobs that helped (fast enough and within tolerance), best of each group only."""
    helped = [
        r
        for r in results
        if r.get("status") == "ok"
        and r.get("knob")
        and (r.get("speedup") or 0) >= min_speedup
        and r.get("within_tolerance")
    ]
    best: dict[str, dict[str, Any]] = {}
    for r in helped:
        g = KNOBS[r["knob"]].group or r["knob"]
        if g not in best or r["speedup"] > best[g]["speedup"]:
            best[g] = r
    return [r["knob"] for r in sorted(best.values(), key=lambda r: -r["speedup"])]
