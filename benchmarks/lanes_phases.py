"""Where a lanes step goes: decode, reference and training per lane step, as one of N lanes and
as a run alone, on one thread each (never run by CI).

Runs `smollab grpo RECIPE` alone and `smollab lanes grpo RECIPE` with N lanes (seeds 0..N-1),
each for `--steps` steps on `--threads` threads, one after the other, and reads the phase times
every run logs (`gen_s`, `ref_s`, `train_s`, `step_s` in metrics.csv), medians past the first
`--warmup` steps. Printed: seconds per lane step of each phase alone and as lanes, and the
ratio (above 1: lanes are cheaper), so the phases that lanes speed up and those they do not are
named with figures.

    python benchmarks/lanes_phases.py RECIPE [--lanes 8] [--steps 8] [--warmup 3]
        [--threads 1] [--work /tmp/lanes_phases] [key=value ...]

RECIPE is a GRPO recipe, LoRA or full (e.g. happy-lora or happy), run from a directory where its
data and base exist.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
from pathlib import Path

PHASES = ("gen_s", "ref_s", "train_s", "step_s")


def medians(run: Path, warmup: int) -> dict[str, float]:
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))[warmup:]
    if not rows:
        raise SystemExit(f"{run}: no steps past the warm-up")
    return {k: statistics.median(float(r[k]) for r in rows) for k in PHASES}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", default="/tmp/lanes_phases")
    a = p.parse_args()
    work, n = Path(a.work), a.lanes
    shared = [
        *a.overrides,
        f"train.max_steps={a.steps}",
        "train.log_interval=1",
        "train.eval_interval=0",
        "train.save_interval=0",
        f"perf.threads={a.threads}",
        "run.resume=never",
    ]
    smollab = [sys.executable, "-m", "smollab"]
    subprocess.run(
        [*smollab, "grpo", a.recipe, *shared, f"run.dir={work / 'alone'}"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    lanes = [arg for i in range(n) for arg in ("--lane", f"run.seed={i} run.dir={work / f'l{i}'}")]
    subprocess.run(
        [*smollab, "lanes", "grpo", a.recipe, *shared, *lanes],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    alone = medians(work / "alone", a.warmup)
    together = medians(work / "l0", a.warmup)  # every lane logs the iteration's times
    print(
        f"{a.recipe}: {n} lanes in one process vs one run alone, {a.threads} thread(s), "
        f"median of steps {a.warmup + 1}..{a.steps}"
    )
    print(f"{'phase':<8} {'alone s':>9} {'lanes s':>9} {'per lane':>9} {'ratio':>7}")
    for k in PHASES:
        per_lane = together[k] / n
        print(
            f"{k:<8} {alone[k]:>9.3f} {together[k]:>9.3f} {per_lane:>9.3f} "
            f"{alone[k] / per_lane:>6.2f}x"
        )


if __name__ == "__main__":
    main()
