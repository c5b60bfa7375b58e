"""Where a micro trial's start goes: launch to first logged step, cold process vs warm fork (never
run by CI).

Measured, each `--repeats` times, for a micro `smollab pretrain` and a micro `smollab grpo` (the
tests' micro model, 1 thread, a metrics row every step, no plots):

- cold: the command as a fresh process (`python -m smollab ...`), launched as a sweep launches a
  trial (`children.launch`: its own session, child.log), to the first row of its metrics.csv;
- warm: this process, having imported torch, transformers, peft and smollab's training modules
  once, forks and runs the same command line in the child (`cli.main`), to the same row. This is
  the best a fork server could do: the gap to cold is what warm starts can win.

Also printed: the CPU and load, the wall time of importing the heavy libraries in a fresh
interpreter (`python -X importtime`, the top cumulative entries), and a cProfile of one in-process
pretrain step's start (top cumulative functions).

    PYTHONPATH=src python benchmarks/trial_start.py [--repeats 5] [--profile]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from smollab.device.mfu import cpu_model_name
from smollab.lab import children as ch

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


def warm(command: str, overrides: list[str], run: Path) -> float:
    """Fork this (already warm) process and run the command in the child, in its own session,
    output to child.log, as a fork server would."""
    from smollab import cli

    run.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the trial
        code = 1
        try:
            os.setsid()
            fd = os.open(run / ch.CHILD_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            code = cli.main([command, *overrides]) or 0
        finally:
            os._exit(code)
    status: list[int] = []

    def alive() -> int | None:
        if status:
            return status[0]
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status.append(os.waitstatus_to_exitcode(st))
            return status[0]
        return None

    took = wait_first_row(run, t0, alive)
    if not status:
        os.waitpid(pid, 0)
    return took


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
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

    import_s, top = import_figures()
    exec(HEAVY)  # this process becomes the warm parent: what a fork server would hold

    results: dict[str, list[float]] = {}
    overrides = {
        "pretrain": lambda run: pretrain_overrides(data, run),
        "grpo": lambda run: grpo_overrides(model, data, run),
    }
    for cmd, over in overrides.items():
        for how, run_it in (("cold", cold), ("warm", warm)):
            key = f"{cmd} {how}"
            runs = [tmp / f"{cmd}-{how}-{i}" for i in range(a.repeats + 1)]
            times = [run_it(cmd, over(run), run) for run in runs]
            results[key] = times[1:]  # the first warms the page cache

    print(f"cpu: {cpu_model_name()}; load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"fresh interpreter, `{HEAVY}`: {import_s:.2f} s; top cumulative imports:")
    for line in top:
        print(f"  {line}")
    print(f"launch to first logged step, median of {a.repeats} (each):")
    for key, xs in results.items():
        print(f"  {key:14s} {statistics.median(xs):6.2f} s ({', '.join(f'{x:.2f}' for x in xs)})")
    for cmd in ("pretrain", "grpo"):
        c, w = (statistics.median(results[f"{cmd} {h}"]) for h in ("cold", "warm"))
        print(f"  {cmd}: warm fork saves {c - w:.2f} s of {c:.2f} s ({c / w:.1f}x)")
    if a.profile:
        print(profile_start(data, tmp / "profiled"))


if __name__ == "__main__":
    main()
