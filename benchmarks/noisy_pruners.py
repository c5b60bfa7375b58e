"""The median pruner against the same pruner with patience, on noisy curves (never run by CI).

One micro pretraining sweep spec (the micro preset, batch 2 x 32 tokens, so train_loss jumps
from step to step, logged every step) runs twice, the same trials in the same order, once with
`pruner: {type: median}` and once with `patience` added. Two learning rates cannot train in the
steps given (the non-starters); the others train. Printed per pruner: the trials it stopped,
the good ones among them (a learning rate that trains) and the non-starters among them, and the
sweep's wall time, with the CPU.

    PYTHONPATH=src nice -n 5 python benchmarks/noisy_pruners.py [--steps 40] [--patience 3]
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


def spec(data: Path, out: Path, steps: int, pruner: dict) -> dict:
    return dict(
        command="pretrain",
        overrides={
            "model.preset": "micro",
            "data.dir": str(data),
            "data.num_stories": 400,
            "data.vocab_size": 256,
            "train.max_steps": steps,
            "train.batch_size": 2,
            "train.seq_len": 32,
            "train.log_interval": 1,
            "train.eval_interval": steps,
            "train.save_interval": steps,
            "optim.warmup_steps": 0,
            "optim.min_lr_ratio": 0.1,
            "perf.device": "cpu",
        },
        space={"optim.lr": NON_STARTERS + GOOD},
        seeds=[0, 1],
        metric={"name": "train_loss", "goal": "min"},
        pruner=pruner,
        concurrency=2,
        threads=2,
        dir=str(out),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--patience", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="smollab-pruner-bench-"))
    data = tmp / "data"
    prepare(DataConfig(dir=str(data), num_stories=400, vocab_size=256), log=lambda _: None)
    median = {"type": "median", "n_startup_trials": 2, "n_warmup_steps": 5}
    print(f"cpu: {cpu_model_name()}")
    print(
        f"{len(NON_STARTERS + GOOD) * 2} trials: lr {NON_STARTERS} (non-starters) and {GOOD} "
        f"(train) x seeds 0, 1; {a.steps} steps of batch 2 x 32; pruned on train_loss"
    )
    for label, pruner in (
        ("median", median),
        (f"median + patience {a.patience}", {**median, "patience": a.patience}),
    ):
        out = tmp / label.replace(" ", "_").replace("+", "and")
        t0 = time.perf_counter()
        with redirect_stdout(io.StringIO()):
            run_sweep(validate_spec(spec(data, out, a.steps, pruner)))
        wall = time.perf_counter() - t0
        with open(out / "results.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        stopped = [r for r in rows if r["status"] == "pruned"]
        good = [r for r in stopped if float(r["optim.lr"]) in GOOD]
        non = [r for r in stopped if float(r["optim.lr"]) in NON_STARTERS]
        print(
            f"{label:>22}: stopped {len(stopped)} of {len(rows)}; good trials stopped "
            f"{len(good)} of {2 * len(GOOD)}; non-starters stopped {len(non)} of "
            f"{2 * len(NON_STARTERS)}; wall {wall:.0f} s"
        )
        for r in stopped:
            print(f"{'':>24}lr {float(r['optim.lr']):.0e} seed {r['seed']}: {r['reason']}")
    print(f"sweep dirs: {tmp}")


if __name__ == "__main__":
    main()
