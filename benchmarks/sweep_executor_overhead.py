"""Per-trial overhead of the sweep executors: launch to first logged step, local vs Ray (never run
by CI).

A micro pretraining trial (the tests' micro model, 1 thread, a metrics row every step) is launched
`--repeats` times one after another, each as the sweep launches it: locally with
`children.launch`, on Ray through `RayExecutor.launch` on one reused slot (its actor started once).
Printed: the CPU, `ray.init` (starting a one-machine Ray, or joining `--address`), the slot's
actor start, the median seconds from launch to the first row of metrics.csv for each executor,
and for contrast a fresh actor per trial (actor start plus launch to first step).

    PYTHONPATH=src python benchmarks/sweep_executor_overhead.py [--address HOST:PORT]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from smollab.config import DataConfig
from smollab.data.prepare import prepare
from smollab.device.mfu import cpu_model_name
from smollab.lab import children as ch
from smollab.lab.sweep.spec_load import load_spec


def micro_argv(data: Path, run_dir: Path) -> list[str]:
    return ch.smollab_argv(
        "pretrain",
        None,
        [
            "model.preset=micro",
            f"data.dir={data}",
            "data.num_stories=400",
            "data.vocab_size=256",
            "train.max_steps=3",
            "train.batch_size=4",
            "train.seq_len=32",
            "train.log_interval=1",
            "train.eval_interval=1000",
            "optim.warmup_steps=0",
            f"run.dir={run_dir}",
            "perf.threads=1",
            "perf.device=cpu",
        ],
    )


def first_step_s(launch, name: str, data: Path, run_dir: Path) -> tuple[float, float, float]:
    """Seconds from the launch call to the first row of the trial's metrics.csv, of the launch
    call itself, and of one poll (the median while the trial runs)."""
    tail = ch.MetricsTail(run_dir / "metrics.csv")
    t0 = time.perf_counter()
    child = launch(name, micro_argv(data, run_dir), run_dir, threads=1)
    call_s = time.perf_counter() - t0
    polls = []
    while not tail.read():
        t = time.perf_counter()
        code = child.poll()
        polls.append(time.perf_counter() - t)
        if code not in (None, 0):
            raise SystemExit(f"{name} failed: {ch.last_log_line(run_dir)}")
        time.sleep(0.01)
    took = time.perf_counter() - t0
    while child.poll() is None:
        time.sleep(0.05)
    return took, call_s, statistics.median(polls or [0.0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--address", default=None, help="join this Ray cluster (default: start one)")
    a = ap.parse_args()
    import ray

    from smollab.lab.sweep.ray_executor import RayExecutor

    tmp = Path(tempfile.mkdtemp(prefix="smollab-exec-bench-"))
    data = tmp / "data"
    prepare(DataConfig(dir=str(data), num_stories=400, vocab_size=256), log=lambda _: None)
    first_step_s(ch.launch, "warm", data, tmp / "warm")  # the page cache, not the executor
    local = [first_step_s(ch.launch, f"l{i}", data, tmp / f"l{i}") for i in range(a.repeats)]

    t = time.perf_counter()
    if a.address:
        ray.init(address=a.address, logging_level="WARNING")
    else:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    init_s = time.perf_counter() - t
    spec_path = tmp / "spec.yaml"
    spec_path.write_text(
        yaml.safe_dump(
            {
                "command": "pretrain",
                "overrides": {
                    "data.dir": str(data),
                    "data.num_stories": 400,
                    "data.vocab_size": 256,
                    "model.preset": "micro",
                },
                "space": {"optim.lr": [0.01]},
                "metric": {"name": "val_loss"},
                "dir": str(tmp / "sweep"),
                "executor": "ray",
                "ray": {"cpu": 1},
            }
        )
    )
    spec = load_spec(spec_path)
    ex = RayExecutor(spec, 1, "cpu", say=lambda _: None)  # one slot, reused
    slot_s = ex.actors_s
    on_ray = [first_step_s(ex.launch, f"r{i}", data, tmp / f"r{i}") for i in range(a.repeats)]
    ex.close()
    fresh = []
    for i in range(min(a.repeats, 3)):  # a fresh actor per trial, for contrast
        t = time.perf_counter()
        ex = RayExecutor(spec, 1, "cpu", say=lambda _: None)
        start_s = time.perf_counter() - t
        fresh.append(start_s + first_step_s(ex.launch, f"f{i}", data, tmp / f"f{i}")[0])
        ex.close()
    ray.shutdown()

    med = statistics.median
    print(f"cpu: {cpu_model_name()}")
    print(
        f"ray.init: {init_s:.2f} s ({'joined ' + a.address if a.address else 'started'}); "
        f"actor start (first slot): {slot_s:.2f} s"
    )
    print(
        f"median of {a.repeats} micro trials: launch to first logged step (each), launch call, "
        f"one poll"
    )
    for what, xs in (("local child process", local), ("ray, reused slot", on_ray)):
        first = [x[0] for x in xs]
        print(
            f"  {what:21s} {med(first):6.2f} s ({', '.join(f'{x:.2f}' for x in first)}), "
            f"{med(x[1] for x in xs) * 1e3:6.1f} ms, {med(x[2] for x in xs) * 1e3:5.2f} ms"
        )
    print(
        f"  ray, fresh actor per trial (actor start + launch to first step): {med(fresh):.2f} s "
        f"({', '.join(f'{x:.2f}' for x in fresh)})"
    )
    print(
        f"ray - local, launch to first step: {med(x[0] for x in on_ray) - med(x[0] for x in local):+.2f} s"
    )


if __name__ == "__main__":
    main()
