"""The median pruner against the same pruner with patience, on noisy curves (never run by CI).

One micro pretraining sweep spec (the micro preset, batch 2 x 32 tokens, so train_loss jumps
from step to step, logged every step) runs twice, the same trials in the same order, once with
`pruner: {type: median}` and once with `patience` added. Two learning rates cannot train in the
steps given (the non-starters); the others train. Printed per pruner: the trials it stopped,
the good ones among them (a learning rate that trains) and the non-starters among them, and the
sweep's wall time, with the CPU.

With `--base RUN --data DIR` (a pretrained story model, e.g. SimpleStories-1.25M, and its
prepared data) the sweep is the happy GRPO recipe instead, pruned on the training reward
`reward_mean` (a batch's mean of a 0/1 reward: noisier than any loss), its non-starters learning
rates too small to move the reward in the steps given.

    PYTHONPATH=src nice -n 5 python benchmarks/noisy_pruners.py [--steps 40] [--patience 3]
    PYTHONPATH=src nice -n 5 python benchmarks/noisy_pruners.py --base runs/simplestories-1.25m \
        --data data/stories --steps 30

Measured with `--base` (SimpleStories-1.25M on the offline corpus, 30 steps, patience 3; 2-core
AMD EPYC, load about 1.5): median stopped 5 of 8 good trials and 4 of 4 non-starters (55 s);
with patience 2 of 8 good (both lr 3e-5, the slowest) and 4 of 4 non-starters (79 s).
"""

from __future__ import annotations

import argparse
import csv
import io
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

from smollab.config import DataConfig
from smollab.data.prepare import prepare
from smollab.device.mfu import cpu_model_name
from smollab.lab.sweep.scheduler import run_sweep
from smollab.lab.sweep.spec_load import validate_spec

NON_STARTERS = [1e-6, 3e-6]
GOOD = [3e-3, 5e-3, 1e-2, 2e-2]
GRPO_NON_STARTERS = [1e-8, 3e-8]
GRPO_GOOD = [3e-5, 1e-4, 3e-4, 1e-3]


def spec(out: Path, steps: int, pruner: dict, *, task: dict, lrs: list[float]) -> dict:
    """The sweep both pruners run: `task` holds the command, its overrides and metric."""
    every = {"train.max_steps": steps, "train.log_interval": 1}
    every |= {"train.eval_interval": steps, "train.save_interval": steps}
    return dict(
        task,
        overrides=task["overrides"] | every,
        space={"optim.lr": lrs},
        seeds=[0, 1],
        pruner=pruner,
        concurrency=2,
        threads=2,
        dir=str(out),
    )


def pretrain_task(data: Path) -> dict:
    overrides = {"model.preset": "micro", "data.dir": str(data), "data.num_stories": 400}
    overrides |= {"data.vocab_size": 256, "train.batch_size": 2, "train.seq_len": 32}
    overrides |= {"optim.warmup_steps": 0, "optim.min_lr_ratio": 0.1, "perf.device": "cpu"}
    metric = {"name": "train_loss", "goal": "min"}
    return dict(command="pretrain", overrides=overrides, metric=metric)


def grpo_task(base: str, data: str) -> dict:
    overrides = {"model.path": base, "data.dir": data, "run.plots": False}
    metric = {"name": "reward_mean", "goal": "max"}
    return dict(command="grpo", base="configs/grpo/happy.yaml", overrides=overrides, metric=metric)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--patience", type=int, default=3)
    ap.add_argument("--base", default=None, help="a pretrained run: the happy GRPO sweep")
    ap.add_argument("--data", default=None, help="with --base: its prepared data directory")
    a = ap.parse_args()
    if (a.base is None) != (a.data is None):
        ap.error("--base and --data go together")
    tmp = Path(tempfile.mkdtemp(prefix="smollab-pruner-bench-"))
    median = {"type": "median", "n_startup_trials": 2, "n_warmup_steps": 5}
    print(f"cpu: {cpu_model_name()}")
    if a.base is None:
        data = tmp / "data"
        prepare(DataConfig(dir=str(data), num_stories=400, vocab_size=256), log=lambda _: None)
        non_starters, good, task = NON_STARTERS, GOOD, pretrain_task(data)
        shape = "batch 2 x 32"
    else:
        non_starters, good, task = GRPO_NON_STARTERS, GRPO_GOOD, grpo_task(a.base, a.data)
        shape = f"happy GRPO on {a.base}"
    metric = task["metric"]["name"]
    print(
        f"{len(non_starters + good) * 2} trials: lr {non_starters} (non-starters) and {good} "
        f"(train) x seeds 0, 1; {a.steps} steps of {shape}; pruned on {metric}"
    )
    for label, pruner in (
        ("median", median),
        (f"median + patience {a.patience}", {**median, "patience": a.patience}),
    ):
        out = tmp / label.replace(" ", "_").replace("+", "and")
        t0 = time.perf_counter()
        with redirect_stdout(io.StringIO()):
            run_sweep(validate_spec(spec(out, a.steps, pruner, task=task, lrs=non_starters + good)))
        wall = time.perf_counter() - t0
        with open(out / "results.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        stopped = [r for r in rows if r["status"] == "pruned"]
        good_stopped = [r for r in stopped if float(r["optim.lr"]) in good]
        non = [r for r in stopped if float(r["optim.lr"]) in non_starters]
        print(
            f"{label:>22}: stopped {len(stopped)} of {len(rows)}; good trials stopped "
            f"{len(good_stopped)} of {2 * len(good)}; non-starters stopped {len(non)} of "
            f"{2 * len(non_starters)}; wall {wall:.0f} s"
        )
        for r in stopped:
            print(f"{'':>24}lr {float(r['optim.lr']):.0e} seed {r['seed']}: {r['reason']}")
    print(f"sweep dirs: {tmp}")


if __name__ == "__main__":
    main()
