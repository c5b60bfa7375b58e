"""DDP pretraining with 2 gloo processes under torchrun: exact resume after kill -9 of every
process, an already finished run returns on all ranks, and ranks leave the loop together.

Timeouts below only guard against a hang (the bug these tests catch); nothing asserts a time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from smollab.rundir.runs import read_metrics
from smollab.train import pretrain
from tests.conftest import MICRO_DATA

GUARD_S = 300  # a hung collective would otherwise hang the test run

# Rank 1's clock, as the ledger reads it, gains an hour per reading: its train_s passes any
# max_time after one step while rank 0's stays below it, as with ranks at very different speeds.
SKEWED_CLOCK = """
import os, sys, time, types
import smollab.train.ledger as ledger
if os.environ["RANK"] == "1":
    readings = [0]
    def hours_pass():
        readings[0] += 1
        return time.perf_counter() + 3600.0 * readings[0]
    ledger.time = types.SimpleNamespace(time=time.time, perf_counter=hours_pass)
from smollab.cli import main
sys.exit(main())
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(pretrain.__file__).resolve().parents[2])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _torchrun(*entry: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        *entry,
        "pretrain",
    ]


def _ddp_args(micro_pretrain: list[str], run: Path) -> list[str]:
    return [
        *micro_pretrain,
        "train.max_steps=40",
        "train.save_interval=5",
        "train.log_interval=1",
        "perf.threads=1",
        f"run.dir={run}",
    ]


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run to the end; past the guard, kill torchrun and its workers (a hang) and fail."""
    proc = subprocess.Popen(
        cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=GUARD_S)
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        proc.communicate()
        raise
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _kill_tree(pid: int) -> None:
    """SIGKILL `pid` and its descendants: torchrun starts each worker in its own session, so
    killing torchrun's process group would leave the workers running."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    kids = children.read_text().split() if children.exists() else []
    os.kill(pid, signal.SIGKILL)
    for kid in kids:
        _kill_tree(int(kid))


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / "final" / "model.safetensors")


def _replicas_agreed(run: Path) -> bool:
    summary = json.loads((run / "summary.json").read_text())
    return summary["replicas_agree"] and "replicas agree" in (run / "training.log").read_text()


@pytest.fixture(scope="module")
def ddp_reference(micro_data, tmp_path_factory):
    """An uninterrupted 2-process run of 40 steps, and the micro overrides that made it (those of
    conftest's micro_pretrain, which is per test)."""
    base = tmp_path_factory.mktemp("ddp")
    micro = [
        "model.preset=micro",
        f"data.dir={micro_data}",
        *MICRO_DATA,
        "train.batch_size=4",
        "train.seq_len=32",
        "train.eval_interval=10",
        "train.eval_tokens=512",
        "optim.warmup_steps=2",
        "optim.lr=1e-2",
        "run.plots=false",
    ]
    _run([*_torchrun("-m", "smollab"), *_ddp_args(micro, base / "ref")])
    return base / "ref", micro


def test_kill_9_of_all_ranks_then_resume_matches_uninterrupted(ddp_reference, tmp_path):
    ref, micro = ddp_reference
    run = tmp_path / "run"
    cmd = [*_torchrun("-m", "smollab"), *_ddp_args(micro, run)]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + GUARD_S
    while time.time() < deadline and proc.poll() is None:
        if list((run / "checkpoints").glob("step_*/trainer_state.pt")):
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed mid-way"
    _kill_tree(proc.pid)
    proc.wait()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "running"  # killed: nothing wrote an end

    _run(cmd)
    assert "resumed from step_" in (run / "training.log").read_text()
    assert [int(r["step"]) for r in read_metrics(run / "metrics.csv")] == list(range(1, 41))
    assert _replicas_agreed(run) and _replicas_agreed(ref)
    done = json.loads((ref / "summary.json").read_text())
    assert done["world_size"] == 2 and done["tokens"] == 40 * 4 * 32 * 2  # both ranks' batches
    a, b = _final_weights(ref), _final_weights(run)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)


def test_a_finished_run_returns_on_every_rank(ddp_reference):
    ref, micro = ddp_reference
    before = (ref / "metrics.csv").read_text()
    out = _run([*_torchrun("-m", "smollab"), *_ddp_args(micro, ref)])
    assert out.stdout.count("already completed; nothing to do") == 1  # rank 0 says it, once
    assert (ref / "metrics.csv").read_text() == before


def test_ranks_leave_together_when_one_runs_out_of_time(ddp_reference, tmp_path):
    _, micro = ddp_reference
    script = tmp_path / "skewed_clock.py"
    script.write_text(SKEWED_CLOCK)
    run = tmp_path / "run"
    _run([*_torchrun(str(script)), *_ddp_args(micro, run), "train.max_time=60"])
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 1
    assert _replicas_agreed(run)


# Each rank records whether the data was ready when it joined the group, what it joined with,
# and what torch.compile was given (returned as it was: nothing is compiled).
RECORDING = """
import json, os, sys
from pathlib import Path
import torch
import torch.distributed as dist

record = Path(os.environ["RECORD_DIR"]) / f"rank{os.environ['RANK']}.json"
seen = {}
join = dist.init_process_group

def init_process_group(*args, **kwargs):
    seen["data_ready"] = (Path(os.environ["DATA_DIR"]) / "meta.json").is_file()
    seen["backend"] = args[0] if args else kwargs.get("backend")
    seen["kwargs"] = sorted(kwargs)
    return join(*args, **kwargs)

def compile(module, **kwargs):
    seen.setdefault("compiled", []).append(type(module).__name__)
    return module

dist.init_process_group = init_process_group
torch.compile = compile
from smollab.cli import main
try:
    sys.exit(main())
finally:
    record.write_text(json.dumps(seen))
"""


def test_data_is_prepared_before_the_group_and_ddp_is_compiled_whole(micro_pretrain, tmp_path):
    """Every rank joins with the data already there (no rank left waiting at a barrier while
    another builds it: NCCL's watchdog allows 10 minutes), and torch.compile gets the DDP module,
    so its graphs split at DDP's buckets."""
    script = tmp_path / "recording.py"
    script.write_text(RECORDING)
    data = tmp_path / "fresh-data"  # prepared by this run
    args = [a for a in micro_pretrain if not a.startswith(("data.dir=", "run.dir="))]
    env = {"RECORD_DIR": str(tmp_path), "DATA_DIR": str(data)}
    cmd = [
        *_torchrun(str(script)),
        *args,
        f"data.dir={data}",
        "train.max_steps=4",
        "perf.compile=true",
        "perf.threads=1",
        f"run.dir={tmp_path / 'run'}",
    ]
    done = subprocess.run(
        cmd, env={**_env(), **env}, capture_output=True, text=True, timeout=GUARD_S
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # one rank builds (the first to take the data dir's lock); rank 0 alone speaks, once
    said = done.stdout.count("data: loading corpus") + done.stdout.count("data: reusing")
    assert said == 1, done.stdout
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["data_ready"] is True, (rank, seen)
        assert seen["backend"] == "gloo" and "device_id" not in seen["kwargs"]
        assert seen["compiled"] == ["DistributedDataParallel"], (rank, seen)


def test_nccl_is_bound_to_the_ranks_gpu(monkeypatch):
    """Under torchrun on CUDA: NCCL with `device_id` (the communicator forms at once, on this
    rank's GPU), the device made current first. torch's CUDA and NCCL are replaced by fakes."""
    import torch.distributed as dist

    from smollab.train import distributed

    calls: list = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: calls.append(("init", a, kw)))
    d, device = distributed.setup(torch.device("cuda"))
    assert device == torch.device("cuda", 1) and (d.rank, d.world, d.local_rank) == (1, 2, 1)
    assert calls == [
        ("set_device", torch.device("cuda", 1)),
        ("init", ("nccl",), {"device_id": torch.device("cuda", 1)}),
    ]
    assert distributed.launch_rank() == 1
    calls.clear()
    assert distributed.setup(torch.device("cpu"))[1] == torch.device("cpu")
    assert calls == [("init", ("gloo",), {})]
