"""How fast could `grpo_vs_trl`'s GRPO step be? Its matrix products alone, each at its own
isolated speed, against TRL's seconds per step (never run by CI).

A step of GRPO is bound by its arithmetic when the matmuls it must do already take most of it.
This script measures that bound on the machine it runs on, for the step `grpo_vs_trl.py` times
(same model, data and settings; full fine-tuning or LoRA):

1. TRL's and smollab's seconds per step, from `grpo_vs_trl`'s turn-taking pair (one invocation,
   processes of their own, 1 thread unless `--threads`), unless `--trl-step-s` is given.
2. smollab's step again in this process under `torch.profiler` (shapes recorded), each op put
   in its phase: generation, reference, the loss and backward, the optimizer, the rest.
3. Each matrix product it ran (mm, addmm, addmm_, bmm, baddbmm: every linear, attention in the
   decode and the backward's products; and the decode's packed LM head, oneDNN's linear) is
   timed again by shape, alone, looped on warm contiguous buffers, and their sum per step is
   printed: the floor. Attention kernels (SDPA), norms,
   softmaxes and the optimizer are left out of it, so it is a lower bound: a step that did
   these products and nothing else, at the speed each reaches alone.

Printed: per phase, the profiled time, its products' time in the step and their isolated floor;
then the step's floor against TRL's s/step, and the largest ratio to TRL that a step at the
floor could reach. The profiler adds a few microseconds to every op, so profiled times run
above the unprofiled `step_s`.

    python benchmarks/grpo_floor.py [--model /tmp/runs/ss1] [--data-dir /tmp/stories]
        [--modes full,lora] [--steps 12] [--warmup 3] [--threads 1] [--trl-step-s 1.4]
        [--ops 12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_vs_trl  # noqa: E402

# the decode's LM head on the CPU is oneDNN's packed linear (`LeanLlama.decode_logits`)
PACKED = "mkldnn::_linear_pointwise"
PRODUCTS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", PACKED)
PHASES = ("generate", "reference", "loss+backward", "optimizer", "rest")


def profile_step(args, mode: str, model_dir: Path, run_dir: Path):
    """smollab's GRPO in this process, steps `warmup`+1 .. `steps` profiled with shapes; each
    phase wrapped in a `record_function` named `phase:<name>`."""
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    import smollab.train.grpo.run as grpo
    import smollab.train.grpo.step as step_mod
    import smollab.train.scaffold as scaffold
    from smollab.train.grpo.policies import OnePolicy

    def labelled(name, fn):
        def wrapper(*a, **k):
            with record_function(f"phase:{name}"):
                return fn(*a, **k)

        wrapper.phase = name
        return wrapper

    if not hasattr(OnePolicy.generate, "phase"):  # once per process
        step_mod._reference_logprobs = labelled("reference", step_mod._reference_logprobs)
        step_mod.loss_backward = labelled("loss+backward", step_mod.loss_backward)
        scaffold.optimizer_step = labelled("optimizer", scaffold.optimizer_step)
        OnePolicy.generate = labelled("generate", OnePolicy.generate)

    prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
    done = {"steps": 0, "t0": 0.0, "wall": 0.0, "threads": 0}

    class Profiled(grpo.Progress):
        def update(self, step, **info):  # after each step, outside its step_s
            super().update(step, **info)
            done["steps"] += 1
            if done["steps"] == args.warmup:
                done["threads"] = torch.get_num_threads()
                prof.__enter__()
                done["t0"] = time.perf_counter()
            elif done["steps"] == args.steps:
                done["wall"] = time.perf_counter() - done["t0"]
                prof.__exit__(None, None, None)

    grpo.Progress = Profiled
    cfg = grpo_vs_trl.smollab_cfg(args, mode, model_dir, run_dir)
    grpo.train(cfg)
    return prof, args.steps - args.warmup, done["wall"], done["threads"]


def phase_of(event) -> str:
    e = event.cpu_parent
    while e is not None:
        if e.name.startswith("phase:"):
            return e.name[6:]
        e = e.cpu_parent
    return "rest"


def operands(name: str, shapes: list) -> list[list[int]] | None:
    """The two multiplied operands' shapes of a product op, from the profiler's input shapes."""
    if name in ("aten::mm", "aten::bmm", PACKED):  # PACKED: x [M, K], weight [N, K]
        a, b = shapes[0], shapes[1]
    else:  # addmm, addmm_, baddbmm: (self, mat1, mat2, ...)
        a, b = shapes[1], shapes[2]
    if not a or not b:
        return None
    return [list(a), list(b)]


def isolated_s(kind: str, a_shape, b_shape, budget_s: float = 0.2) -> float:
    """Median seconds of one product (`kind`: mm, bmm or packed) of these shapes, alone, looped
    on warm buffers."""
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    if kind == "packed":
        w = torch.ops.mkldnn._reorder_linear_weight(b, a_shape[0])

        def run():
            torch.ops.mkldnn._linear_pointwise(a, w, None, "none", [], "")
    elif kind == "mm":
        out = torch.empty(a_shape[0], b_shape[1])

        def run():
            torch.mm(a, b, out=out)
    else:
        out = torch.empty(a_shape[0], a_shape[1], b_shape[2])

        def run():
            torch.bmm(a, b, out=out)

    run()
    t = time.perf_counter()
    run()
    one = max(time.perf_counter() - t, 1e-7)
    n = max(3, min(500, int(budget_s / 5 / one)))
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            run()
        times.append((time.perf_counter() - t) / n)
    return statistics.median(times)


def floor_report(prof, steps: int, wall: float) -> tuple[dict, int, dict]:
    """Per phase a step's profiled seconds, its products' seconds and their isolated floor; the
    number of distinct product shapes; and each (phase, op)'s self seconds and calls."""
    in_step = defaultdict(float)
    phase_total = defaultdict(float)
    by_op = defaultdict(lambda: [0.0, 0])  # (phase, op) -> self seconds, calls
    calls = defaultdict(int)  # (phase, op, shapes) -> calls
    for ev in prof.events():
        if ev.name.startswith("phase:"):
            phase_total[ev.name[6:]] += ev.cpu_time_total / 1e6
            continue
        if not ev.name.startswith(("aten::", "mkldnn::")):
            continue
        ph = phase_of(ev)
        top = by_op[(ph, ev.name)]
        top[0] += ev.self_cpu_time_total / 1e6
        top[1] += 1
        ops = operands(ev.name, ev.input_shapes) if ev.name in PRODUCTS else None
        if ops is not None:
            in_step[ph] += ev.self_cpu_time_total / 1e6
            kind = "packed" if ev.name == PACKED else "bmm" if "bmm" in ev.name else "mm"
            calls[(ph, kind, tuple(map(tuple, ops)))] += 1
    phase_total["rest"] = wall - sum(phase_total[p] for p in PHASES if p != "rest")
    cache, floor = {}, defaultdict(float)
    for (ph, kind, (a, b)), n in calls.items():
        if (kind, a, b) not in cache:
            cache[(kind, a, b)] = isolated_s(kind, a, b)
        floor[ph] += n * cache[(kind, a, b)]
    rows = {p: (phase_total[p] / steps, in_step[p] / steps, floor[p] / steps) for p in PHASES}
    return rows, len(cache), dict(by_op)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="/tmp/runs/ss1", help="model or run directory")
    ap.add_argument("--data-dir", default="/tmp/stories", help="prepared data dir")
    ap.add_argument("--modes", default="full,lora", help="comma list of full, lora")
    ap.add_argument("--steps", type=int, default=12, help="steps of each run")
    ap.add_argument("--warmup", type=int, default=3, help="steps before the timed ones")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (both sides)")
    ap.add_argument(
        "--trl-step-s", type=float, default=None, help="TRL s/step (default: measured here)"
    )
    ap.add_argument("--ops", type=int, default=0, help="print each phase's N costliest ops")
    args = ap.parse_args()
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps {args.steps} must exceed --warmup {args.warmup}")
    # grpo_vs_trl's settings for the step; no held-out evaluation
    args.precision, args.batch, args.generations, args.lora_r, args.held_out = "fp32", 32, 16, 8, 0
    torch.set_num_threads(args.threads)
    model_dir = grpo_vs_trl.ensure_model(args)
    print(
        f"model {model_dir}; torch {torch.__version__}, {args.threads} thread(s); "
        f"steps {args.warmup + 1}-{args.steps} of each run timed"
    )
    with tempfile.TemporaryDirectory(prefix="smollab-grpo-floor-") as tmp:
        tmp = Path(tmp)
        for mode in args.modes.split(","):
            if args.trl_step_s is None:
                pair = grpo_vs_trl.run_pair(args, mode, model_dir, tmp, 0)
                trl = statistics.median(pair["trl"]["step_s"][args.warmup :])
                ours = statistics.median(pair["smollab"]["step_s"][args.warmup :])
                source = (
                    f"measured (turns): TRL {trl:.3f} s, smollab {ours:.3f} s, {trl / ours:.2f}x"
                )
            else:
                trl, source = args.trl_step_s, f"TRL {args.trl_step_s:.3f} s given"
            prof, steps, wall, threads = profile_step(
                args, mode, model_dir, tmp / f"profiled-{mode}"
            )
            rep, shapes, by_op = floor_report(prof, steps, wall)
            print(
                f"\n== {mode}: {source}; profiled step {wall / steps:.3f} s ({threads} thread(s))"
            )
            print(f"{'phase':<14} {'profiled s':>10} {'products s':>10} {'floor s':>8}")
            tot = [0.0, 0.0, 0.0]
            for ph in PHASES:
                row = rep[ph]
                tot = [x + y for x, y in zip(tot, row, strict=True)]
                print(f"{ph:<14} {row[0]:>10.3f} {row[1]:>10.3f} {row[2]:>8.3f}")
            print(f"{'step':<14} {tot[0]:>10.3f} {tot[1]:>10.3f} {tot[2]:>8.3f}")
            print(
                f"{shapes} product shapes timed alone. 5x TRL needs <= {trl / 5:.3f} s a "
                f"step; a step of these products alone, at their isolated speed, takes "
                f"{tot[2]:.3f} s: at most {trl / tot[2]:.2f}x TRL."
            )
            if args.ops:
                print(f"the {args.ops} costliest ATen ops of each phase (self ms a step, calls):")
                for ph in PHASES:
                    ops = sorted(((v, k[1]) for k, v in by_op.items() if k[0] == ph), reverse=True)[
                        : args.ops
                    ]
                    line = ", ".join(
                        f"{name.split('::')[1]} {t * 1e3 / steps:.1f} ({n // steps})"
                        for (t, n), name in ops
                    )
                    print(f"  {ph}: {line}")


if __name__ == "__main__":
    main()
