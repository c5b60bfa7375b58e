"""Shared micro fixtures: a tiny prepared corpus and the overrides of a micro pretraining run."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite's CPU peaks and probe results go to a cache of its own (children inherit it), never
# into the user's ~/.cache/smollab: measured under the suite's load they would read low.
if "SMOLLAB_CACHE_DIR" not in os.environ:
    os.environ["SMOLLAB_CACHE_DIR"] = tempfile.mkdtemp(prefix="smollab-test-cache-")
    atexit.register(shutil.rmtree, os.environ["SMOLLAB_CACHE_DIR"], ignore_errors=True)

MICRO_DATA = ["data.num_stories=400", "data.vocab_size=256"]


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """A test that trains in-process with perf.threads sets torch's thread count for the whole
    process; later tests compare in-process runs with child processes, whose float reductions
    depend on it. Each test starts with the count the session started with."""
    import torch

    n = torch.get_num_threads()
    yield
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


@pytest.fixture(scope="session")
def micro_data(tmp_path_factory):
    """A prepared data dir: 400 offline stories, a 256-entry WordPiece tokenizer."""
    from smollab.config import DataConfig
    from smollab.data.prepare import prepare

    d = tmp_path_factory.mktemp("micro_data")
    prepare(DataConfig(dir=str(d), num_stories=400, vocab_size=256), log=lambda _: None)
    return d


@pytest.fixture
def micro_pretrain(micro_data, tmp_path):
    """Overrides for a micro pretraining run that takes a second or two. No plots/: matplotlib
    costs about as much as the run (a test that looks at plots sets run.plots=true)."""
    return [
        "model.preset=micro",
        f"data.dir={micro_data}",
        *MICRO_DATA,
        "train.max_steps=20",
        "train.batch_size=4",
        "train.seq_len=32",
        "train.log_interval=5",
        "train.eval_interval=10",
        "train.eval_tokens=512",
        "train.save_interval=10",
        "optim.warmup_steps=2",
        "optim.lr=1e-2",
        "run.plots=false",
        f"run.dir={tmp_path / 'run'}",
    ]


@pytest.fixture(scope="session")
def micro_model(micro_data, tmp_path_factory):
    """A run directory holding a micro model pretrained for a few steps (the GRPO base)."""
    from smollab.config.load import load_config
    from smollab.train.pretrain import train

    run = tmp_path_factory.mktemp("micro_model") / "run"
    train(
        load_config(
            "pretrain",
            None,
            [
                "model.preset=micro",
                f"data.dir={micro_data}",
                *MICRO_DATA,
                "train.max_steps=30",
                "train.batch_size=8",
                "train.seq_len=64",
                "optim.lr=1e-2",
                "optim.warmup_steps=2",
                "run.plots=false",
                f"run.dir={run}",
            ],
        )
    )
    return run


def micro_grpo_overrides(model, data, run) -> list[str]:
    """micro_grpo's overrides for any model, data and run dir (a module-scoped fixture's too)."""
    return [
        f"model.path={model}",
        f"data.dir={data}",
        "train.max_steps=6",
        "train.batch_size=8",
        "grpo.num_generations=4",
        "grpo.max_completion_length=12",
        "train.eval_interval=3",
        "grpo.eval_prompts=4",
        "train.save_interval=2",
        "optim.lr=1e-3",
        "run.plots=false",
        f"run.dir={run}",
    ]


@pytest.fixture
def micro_grpo(micro_model, micro_data, tmp_path):
    """Overrides for a micro GRPO run: 8 completions (2 prompts x 4) of 12 tokens per step; no
    plots/ (as micro_pretrain)."""
    return micro_grpo_overrides(micro_model, micro_data, tmp_path / "grpo")


# ---- offline replicas of the Hub families (tests/replicas.py) -------------------------------


@pytest.fixture(scope="session")
def replicas(tmp_path_factory):
    """A builder of the families' offline replicas, each built once per session and shared:
    `replicas("qwen3")` is its directory, `replicas("qwen2.5", tie=False)` a variant (keyword
    arguments as `build_replica`'s). Tests read these directories; one that changes files copies
    the directory first."""
    from tests.replicas import build_replica

    built = {}

    def get(family: str, **kwargs):
        key = json.dumps([family, kwargs], sort_keys=True)
        if key not in built:
            out = tmp_path_factory.mktemp(f"replica-{family}")
            built[key] = build_replica(family, out, **kwargs)
        return built[key]

    return get


@pytest.fixture
def replica_dir(replicas, family):
    """The replica of the test's `family`: `@pytest.mark.parametrize("family", FAMILIES)`."""
    return replicas(family)


# ---- lab: a fake `smollab` child (stdlib only, starts in milliseconds) ------------------------

FAKE_CHILD = r'''
"""Stands in for `python -m smollab pretrain|grpo ...` in lab tests.

optim.lr picks the behaviour: >= 100 crashes, >= 10 diverges (NaN at step 3), else the loss
falls as 5 * exp(-lr * step); a grpo one also writes 8 held-out prompts' rewards (-loss plus a
per-prompt offset) to eval_prompts.jsonl every 2 steps. Each step sleeps FAKE_STEP_S x (1 + FAKE_SLOWDOWN x (k - 1)),
k being the fake children alive in the same parent directory. It checkpoints every
train.save_interval steps (default 5) as checkpoints/step_<N>/trainer_state.pt, resumes from
the newest, stops cleanly on SIGINT (status interrupted, exit 130).
Hangs on demand: FAKE_HANG_LR=0.3 makes the trial with that lr ignore SIGINT and sleep forever
before its first step (a child stuck in C code); FAKE_IGNORE_SIGINT=1 makes every child ignore
SIGINT. FAKE_PIDS_FILE: each child appends its pid to that file once its SIGINT handling is
set, so a test can check that none is left behind. FAKE_START_S: seconds it sleeps before
its first step (a slow start: imports, model loading). FAKE_GRANDCHILD=1: it starts a `sleep`
in its own process group first and writes its pid to <run dir>/grandchild.pid.
"""
import csv, json, math, os, resource, signal, sys, time
from pathlib import Path

args = dict(a.split("=", 1) for a in sys.argv[2:] if "=" in a)
command = sys.argv[1]
run = Path(args["run.dir"]); run.mkdir(parents=True, exist_ok=True)
lr = float(args.get("optim.lr", "1e-3"))
max_steps = int(args.get("train.max_steps", "10"))
summary_path, ckpts = run / "summary.json", run / "checkpoints"
save_every = int(args.get("train.save_interval", "5")) or 5
summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
if summary.get("status") in ("completed", "diverged", "degenerate", "stuck", "pruned"):
    print("already", summary["status"]); sys.exit(0)
saved = [json.loads((p / "trainer_state.pt").read_text())["step"] for p in ckpts.glob("step_*") if (p / "trainer_state.pt").exists()]
start = max(saved, default=0)
cols = (["step", "wall_s", "lr", "loss", "reward_mean", "step_s", "peak_mem_mb"] if command == "grpo"
        else ["step", "tokens", "wall_s", "train_s", "lr", "train_loss", "val_loss", "peak_mem_mb"])
rows = []
if start and (run / "metrics.csv").exists():
    rows = [r for r in csv.DictReader(open(run / "metrics.csv")) if int(r["step"]) <= start]
with open(run / "metrics.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols); w.writeheader(); w.writerows(rows)
alive = run / ".alive"; alive.write_text(str(os.getpid()))
if os.environ.get("FAKE_GRANDCHILD"):
    import subprocess
    (run / "grandchild.pid").write_text(str(subprocess.Popen(["sleep", "600"]).pid))
def write_summary(**kw):
    summary.update(kw); tmp = run / ".s.tmp"; tmp.write_text(json.dumps(summary)); os.replace(tmp, summary_path)
write_summary(status="running", command=command, argv=sys.argv[1:])
stop = []
signal.signal(signal.SIGINT, lambda *a: stop.append(1))
if os.environ.get("FAKE_IGNORE_SIGINT") or lr == float(os.environ.get("FAKE_HANG_LR", "nan")):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
if os.environ.get("FAKE_PIDS_FILE"):  # recorded once its SIGINT handling is in place
    with open(os.environ["FAKE_PIDS_FILE"], "a") as pf: pf.write(f"{os.getpid()}\n")
if lr == float(os.environ.get("FAKE_HANG_LR", "nan")):
    while True: time.sleep(3600)
time.sleep(float(os.environ.get("FAKE_START_S", "0")))
t0 = time.time(); train_s = 0.0
step = start; status, evidence = "completed", None
try:
    if lr >= 100:
        raise RuntimeError(f"boom at lr {lr}")
    f = open(run / "metrics.csv", "a", newline=""); w = csv.DictWriter(f, fieldnames=cols)
    while step < max_steps and not stop:
        k = sum(1 for p in run.parent.glob("*/.alive"))
        dt = float(os.environ.get("FAKE_STEP_S", "0.01")) * (1 + float(os.environ.get("FAKE_SLOWDOWN", "0")) * (k - 1))
        time.sleep(dt); train_s += dt; step += 1
        loss = float("nan") if lr >= 10 and step >= 3 else 5 * math.exp(-lr * step)
        mem = float(os.environ.get("FAKE_MEM_MB", "0")) or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        row = ({"step": step, "wall_s": time.time() - t0, "lr": lr, "loss": loss, "reward_mean": -loss, "step_s": dt, "peak_mem_mb": mem}
               if command == "grpo" else
               {"step": step, "tokens": step * 128, "wall_s": time.time() - t0, "train_s": train_s, "lr": lr,
                "train_loss": loss, "val_loss": loss + 0.1 if step % 5 == 0 or step == max_steps else "", "peak_mem_mb": mem})
        w.writerow(row); f.flush()
        if command == "grpo" and step % 2 == 0 and math.isfinite(loss):  # 8 held-out prompts
            with open(run / "eval_prompts.jsonl", "a") as ef:
                ef.write(json.dumps({"step": step, "rewards": [-loss + 0.1 * (i % 3) for i in range(8)]}) + "\n")
        if not math.isfinite(loss):
            status, evidence = "diverged", f"loss is nan at step {step}"; break
        if step % save_every == 0:
            tmp = ckpts / ".c.tmp"; tmp.mkdir(parents=True, exist_ok=True)
            (tmp / "trainer_state.pt").write_text(json.dumps({"step": step})); os.replace(tmp, ckpts / f"step_{step}")
    if stop:
        status, evidence = "interrupted", f"interrupted at step {step}"
finally:
    alive.unlink(missing_ok=True)
write_summary(status=status, evidence=evidence, steps=step)
sys.exit(130 if status == "interrupted" else 0)
'''


@pytest.fixture
def fake_child(tmp_path, monkeypatch):
    """Make the lab launch the fake child above instead of `python -m smollab`; a sweep's warm
    start server (`start: auto` on Linux) then imports nothing it would not need."""
    import sys

    from smollab.lab import children, zygote

    script = tmp_path / "fake_child.py"
    script.write_text(FAKE_CHILD)

    def argv(command, base, overrides):
        return [sys.executable, str(script), command, *([base] if base else []), *overrides]

    monkeypatch.setattr(children, "smollab_argv", argv)
    monkeypatch.setattr(zygote, "WARM_MODULES", ())
    return script
