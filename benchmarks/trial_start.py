"""Where a micro trial's start goes, and what warm starts win: launch to first logged step cold
vs warm, then whole sweeps cold vs warm vs lanes (never run by CI).

Measured, each `--repeats` times, for a micro `smollab pretrain` and a micro `smollab grpo` (the
tests' micro model, 1 thread, a metrics row every step, no plots):

- cold: the command as a fresh process (`python -m smollab ...`), launched as a sweep launches a
  trial (`children.launch`: its own session, child.log), to the first row of its metrics.csv;
- warm: the same launch forked from smollab's warm start server (`smollab.lab.zygote`, started
  once and ready before the first launch; its one-off import time is printed), to the same row.

With `--sweeps`, in the same invocation:
- a micro pretraining sweep (`--trials` trials of 3 steps, concurrency 2) with `start: cold`
  and `start: warm`: the median of results.csv's `start_s` and the sweep's wall time;
- an 8-trial GRPO sweep of `--grpo-steps`-step trials (the happy task's recipe, lr x beta as in
  configs/sweeps/happy-full-lanes.yaml, on a micro base pretrained here): as processes cold, as
  processes warm, and as lanes (2 workers x 4 lanes), each the sweep's wall time and the median
  `start_s` of its trials.

With `--lab`, in the same invocation, the other commands that launch children, each cold and
warm (`start: cold` / `start: warm`, each warm one with its own server, as the command starts it):
- a probe of the micro pretraining run at k = 1 and 2 (2 CPU threads, warm-up 2, 5 steps): each
  level's median launch to first logged step, its MB/run (cold: peak RSS; warm: PSS) and the
  probe's wall time, the server's start included;
- a bench of the micro pretraining run with one knob (log_interval; 6 steps, no recheck): each
  variant's wall time (launch to exit) and the bench's, the server's start included.

Also printed: the CPU and load, the wall time of importing the heavy libraries in a fresh
interpreter (`python -X importtime`, the top cumulative entries), and with `--profile` a cProfile
of one in-process pretrain step's start (top cumulative functions).

    PYTHONPATH=src python benchmarks/trial_start.py [--repeats 5] [--sweeps] [--lab] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from smollab.device.mfu import cpu_model_name
from smollab.lab import children as ch
from smollab.lab.sweep.scheduler import run_sweep
from smollab.lab.sweep.spec_load import validate_spec
from smollab.lab.zygote import Zygote

DATA = ["data.num_stories=400", "data.vocab_size=256"]
HEAVY = "import torch, transformers, peft, smollab.train.pretrain, smollab.train.grpo"


def pretrain_overrides(data: Path, run: Path, steps: int = 3) -> list[str]:
    return [
        "model.preset=micro",
        f"data.dir={data}",
        *DATA,
        f"train.max_steps={steps}",
        "train.batch_size=4",
        "train.seq_len=32",
        "train.log_interval=1",
        "train.eval_interval=1000",
        "optim.warmup_steps=0",
        "run.plots=false",
        "perf.threads=1",
        "perf.device=cpu",
        f"run.dir={run}",
    ]


def grpo_overrides(model: Path, data: Path, run: Path) -> list[str]:
    return [
        f"model.path={model}",
        f"data.dir={data}",
        "train.max_steps=2",
        "train.batch_size=8",
        "grpo.num_generations=4",
        "grpo.max_completion_length=12",
        "train.log_interval=1",
        "train.eval_interval=1000",
        "grpo.eval_prompts=4",
        "run.plots=false",
        "perf.threads=1",
        "perf.device=cpu",
        f"run.dir={run}",
    ]


def wait_first_row(run: Path, t0: float, alive) -> float:
    tail = ch.MetricsTail(run / "metrics.csv")
    while not tail.read():
        code = alive()
        if code not in (None, 0):
            raise SystemExit(f"{run.name} failed: {ch.last_log_line(run)}")
        time.sleep(0.01)
    return time.perf_counter() - t0


def cold(command: str, overrides: list[str], run: Path) -> float:
    t0 = time.perf_counter()
    child = ch.launch(run.name, ch.smollab_argv(command, None, overrides), run, threads=1)
    took = wait_first_row(run, t0, child.poll)
    child.wait()
    return took


def warm(zygote: Zygote):
    def run_it(command: str, overrides: list[str], run: Path) -> float:
        t0 = time.perf_counter()
        argv = ch.smollab_argv(command, None, overrides)
        child = ch.launch(run.name, argv, run, threads=1, zygote=zygote)
        took = wait_first_row(run, t0, child.poll)
        child.wait()
        return took

    return run_it


def load(label: str) -> str:
    return f"{label} load {os.getloadavg()[0]:.2f}"


def sweep_figures(tree: dict, label: str) -> tuple[float, float | None, str]:
    """Run one sweep in this process: its wall time, the median start_s of its trials, and the
    load average (1 min) when it ended."""
    t0 = time.perf_counter()
    counts = run_sweep(validate_spec(tree), out=lambda _: None)
    wall = time.perf_counter() - t0
    with open(Path(tree["dir"]) / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    starts = [float(r["start_s"]) for r in rows if r.get("start_s")]
    done = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    return wall, statistics.median(starts) if starts else None, f"{done}; {load(label)}"


def sweeps(tmp: Path, data: Path, model: Path, trials: int, grpo_steps: int) -> list[str]:
    micro = {
        "command": "pretrain",
        "overrides": {
            k: yaml.safe_load(v)
            for k, v in (o.split("=", 1) for o in pretrain_overrides(data, tmp / "x"))
            if k not in ("run.dir", "perf.threads")  # the sweep sets each trial's threads
        },
        "space": {"optim.lr": [round(1e-3 * (i + 1), 6) for i in range(trials)]},
        "metric": {"name": "train_loss"},
        "concurrency": 2,
    }
    grpo = {
        "command": "grpo",
        "base": "configs/grpo/happy.yaml",
        "overrides": {
            "model.path": str(model),
            "data.dir": str(data),
            "train.max_steps": grpo_steps,
            "train.eval_interval": grpo_steps,
            "train.save_interval": grpo_steps,
            "run.plots": False,
        },
        "space": {"optim.lr": [1e-5, 3e-5, 1e-4, 3e-4], "grpo.beta": [0.0, 0.02]},
        "metric": {"name": "eval_reward_mean", "goal": "max"},
    }
    out = [f"micro pretraining sweep, {trials} trials of 3 steps, concurrency 2:"]
    for start in ("cold", "warm"):
        tree = {**micro, "start": start, "dir": str(tmp / f"sweep-micro-{start}")}
        wall, med, note = sweep_figures(tree, start)
        out.append(f"  start {start:4s}: median start_s {med:.2f} s, sweep {wall:.1f} s ({note})")
    out.append(f"GRPO sweep, 8 trials of {grpo_steps} steps (happy recipe, micro base):")
    layouts = {
        "processes cold": {"concurrency": 2, "start": "cold"},
        "processes warm": {"concurrency": 2, "start": "warm"},
        "lanes 2x4": {"executor": "lanes", "lanes": 4, "lane_workers": 2},
    }
    for label, how in layouts.items():
        tree = {**grpo, **how, "dir": str(tmp / f"sweep-grpo-{label.replace(' ', '-')}")}
        wall, med, note = sweep_figures(tree, label.split()[-1])
        shown = f"median start_s {med:.2f} s, " if med is not None else ""
        out.append(f"  {label:15s}: {shown}sweep {wall:.1f} s ({note})")
    return out


def lab_figures(tmp: Path, data: Path) -> list[str]:
    """A probe level and a bench variant, cold then warm (see the module docstring)."""
    from smollab.lab.bench.run import run_bench
    from smollab.lab.probe.run import run_probe
    from smollab.lab.probe.spec import ProbeSpec

    base = [
        o
        for o in pretrain_overrides(data, tmp / "x")
        if not o.startswith(("run.dir=", "perf.threads=", "train.max_steps="))
    ]
    out = ["probe of the micro pretraining run, k = 1 and 2 on 2 threads:"]
    for start in ("cold", "warm"):
        spec = ProbeSpec(
            command="pretrain",
            ks=[1, 2],
            max_k=2,
            threads=2,
            split=False,
            warmup=2,
            steps=5,
            cache=False,
            start=start,
            dir=str(tmp / f"probe-{start}"),
        )
        t0 = time.perf_counter()
        result = run_probe(spec, base, out=lambda _: None)
        wall = time.perf_counter() - t0
        levels = "; ".join(
            f"k={lv['k']} start_s {lv['start_s']:.2f} s, {lv['peak_mem_mb']:.0f} MB/run"
            for lv in result["levels"]
        )
        out.append(
            f"  start {start:4s}: {levels}; memory {result['run_memory']}; probe {wall:.1f} s "
            f"({load(start)})"
        )
    out.append("bench of the micro pretraining run, baseline and log_interval, 6 steps:")
    for start in ("cold", "warm"):
        t0 = time.perf_counter()
        result = run_bench(
            "configs/pretrain/simplestories-1.25m.yaml",
            [o for o in base if o != "perf.device=cpu"] + ["perf.device=cpu", "perf.threads=1"],
            knobs=["log_interval"],
            steps=6,
            out=tmp / f"bench-{start}",
            recheck=False,
            min_speedup=100.0,
            start=start,
            echo=lambda _: None,
        )
        wall = time.perf_counter() - t0
        variants = "; ".join(
            f"{r['variant']} {r['wall_s']:.2f} s ({r['status']})" for r in result["results"]
        )
        out.append(f"  start {start:4s}: {variants}; bench {wall:.1f} s ({load(start)})")
    return out


def import_figures() -> tuple[float, list[str]]:
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", HEAVY],
        capture_output=True,
        text=True,
        check=True,
    )
    took = time.perf_counter() - t0
    rows = []
    for line in out.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    rows.sort(reverse=True)
    return took, [f"{us / 1e6:6.2f} s {name}" for us, name in rows[:12]]


def profile_start(data: Path, run: Path) -> str:
    """cProfile of a fresh interpreter running one pretrain step in-process."""
    code = (
        "import cProfile, pstats, io, sys\n"
        "pr = cProfile.Profile(); pr.enable()\n"
        "from smollab import cli\n"
        f"cli.main(['pretrain', *{pretrain_overrides(data, run, steps=1)!r}])\n"
        "pr.disable(); s = io.StringIO()\n"
        "pstats.Stats(pr, stream=s).sort_stats('cumulative').print_stats(25)\n"
        "sys.stderr.write(s.getvalue())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stderr[out.stderr.find("   ncalls") :]


def launches(repeats: int, tmp: Path, data: Path, model: Path) -> None:
    """Launch to first logged step of micro runs, cold and warm, and where a cold one's time
    goes (the imports)."""
    import_s, top = import_figures()
    zygote = Zygote()
    server_s = zygote.ready()
    results: dict[str, list[float]] = {}
    overrides = {
        "pretrain": lambda run: pretrain_overrides(data, run),
        "grpo": lambda run: grpo_overrides(model, data, run),
    }
    for cmd, over in overrides.items():
        for how, run_it in (("cold", cold), ("warm", warm(zygote))):
            key = f"{cmd} {how}"
            runs = [tmp / f"{cmd}-{how}-{i}" for i in range(repeats + 1)]
            times = [run_it(cmd, over(run), run) for run in runs]
            results[key] = times[1:]  # the first warms the page cache
    zygote.close()
    loads = load("after the launches:")

    print(f"load average after the launches: {os.getloadavg()}")
    print(f"fresh interpreter, `{HEAVY}`: {import_s:.2f} s; top cumulative imports:")
    for line in top:
        print(f"  {line}")
    print(f"warm start server: ready {server_s:.2f} s after it started (once per sweep)")
    print(f"launch to first logged step, median of {repeats} (each); {loads}:")
    for key, xs in results.items():
        print(f"  {key:14s} {statistics.median(xs):6.2f} s ({', '.join(f'{x:.2f}' for x in xs)})")
    for cmd in ("pretrain", "grpo"):
        c, w = (statistics.median(results[f"{cmd} {h}"]) for h in ("cold", "warm"))
        print(f"  {cmd}: warm start saves {c - w:.2f} s of {c:.2f} s ({c / w:.1f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="launches per figure (0: none)")
    ap.add_argument("--sweeps", action="store_true", help="also the sweeps cold/warm/lanes")
    ap.add_argument("--trials", type=int, default=6, help="micro pretraining sweep's trials")
    ap.add_argument("--grpo-steps", type=int, default=25, help="steps of each GRPO trial")
    ap.add_argument("--lab", action="store_true", help="also a probe level and a bench, cold/warm")
    ap.add_argument("--profile", action="store_true", help="also print a cProfile of the start")
    a = ap.parse_args()
    from smollab.config import DataConfig
    from smollab.config.load import load_config
    from smollab.data.prepare import prepare
    from smollab.train.pretrain import train

    tmp = Path(tempfile.mkdtemp(prefix="smollab-start-bench-"))
    data = tmp / "data"
    prepare(DataConfig(dir=str(data), num_stories=400, vocab_size=256), log=lambda _: None)
    model = tmp / "model"
    with contextlib.redirect_stdout(io.StringIO()):  # the GRPO base, not a figure
        train(load_config("pretrain", None, pretrain_overrides(data, model, steps=30)))

    print(f"cpu: {cpu_model_name()}; load average now: {os.getloadavg()}", flush=True)
    if a.repeats > 0:
        launches(a.repeats, tmp, data, model)
    if a.sweeps:
        for line in sweeps(tmp, data, model, a.trials, a.grpo_steps):
            print(line, flush=True)
    if a.lab:
        for line in lab_figures(tmp, data):
            print(line, flush=True)
    if a.profile:
        print(profile_start(data, tmp / "profiled"))


if __name__ == "__main__":
    main()
