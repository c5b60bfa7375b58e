"""Lanes train like their runs alone: reward curves of configurations trained as lanes of one
`smollab lanes grpo` process beside the same configurations as separate `smollab grpo` runs
(never run by CI).

Each lane samples its prompts and completions from its own seed's streams, exactly as its run
alone does, so the curves start equal and drift apart only through float rounding (batched versus
single matmuls, the computed versus the replayed policy forward), which flips a sampled token now
and then. Printed: per configuration, the mean |reward difference| per step and both runs' mean
reward; the plot overlays the curves.

    python benchmarks/lanes_equivalence.py RECIPE [--lane "key=value ..."]... [--steps 40]
        [--work /tmp/lanes_eq] [--threads 1] [key=value ...]

RECIPE is a GRPO recipe, LoRA or full (e.g. happy-lora or happy, with model.path= its base), run
from a directory where its data and base exist.
"""

from __future__ import annotations

import argparse
import csv
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

LANES = [
    "optim.lr=1e-4 run.seed=0",
    "optim.lr=3e-4 grpo.beta=0.05 run.seed=1",
    "optim.lr=1e-3 grpo.beta=0.0 run.seed=2",
]


def rewards(run: Path) -> list[float]:
    with open(run / "metrics.csv") as f:
        return [float(r["reward_mean"]) for r in csv.DictReader(f)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--lane", action="append", default=None)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", default="/tmp/lanes_eq")
    a = p.parse_args()
    work, lanes = Path(a.work), a.lane or LANES
    shared = [
        *a.overrides,
        f"train.max_steps={a.steps}",
        "train.log_interval=1",
        "train.eval_interval=0",
        "train.save_interval=0",
        f"perf.threads={a.threads}",
    ]
    smollab = [sys.executable, "-m", "smollab"]
    lane_args = []
    for i, lane in enumerate(lanes):
        alone = work / f"alone{i}"
        subprocess.run(
            [
                *smollab,
                "grpo",
                a.recipe,
                *shared,
                *shlex.split(lane),
                f"run.dir={alone}",
                "run.resume=never",
            ],
            check=True,
        )
        lane_args += ["--lane", f"{lane} run.dir={work / f'lane{i}'} run.resume=never"]
    subprocess.run([*smollab, "lanes", "grpo", a.recipe, *shared, *lane_args], check=True)
    print(f"\n{a.steps} steps each; {len(lanes)} lanes in one process vs one process per run")
    curves = []
    for i, lane in enumerate(lanes):
        alone, together = rewards(work / f"alone{i}"), rewards(work / f"lane{i}")
        diff = statistics.mean(abs(x - y) for x, y in zip(alone, together, strict=True))
        same = sum(x == y for x, y in zip(alone, together, strict=True))
        print(
            f"  {lane:<45} mean reward alone {statistics.mean(alone):.3f} as a lane "
            f"{statistics.mean(together):.3f} | mean |diff| {diff:.3f} | equal steps "
            f"{same}/{len(alone)}"
        )
        curves.append((lane, alone, together))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for k, (lane, alone, together) in enumerate(curves):
        c = f"C{k}"
        ax.plot(range(1, len(alone) + 1), alone, color=c, lw=1.2, label=f"{lane} (alone)")
        ax.plot(
            range(1, len(together) + 1), together, color=c, lw=1.2, ls="--", label=f"{lane} (lane)"
        )
    ax.set(xlabel="step", ylabel="reward_mean", title="lanes vs separate runs")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(work / "lanes_equivalence.png", dpi=120)
    print(f"plot: {work / 'lanes_equivalence.png'}")


if __name__ == "__main__":
    main()
