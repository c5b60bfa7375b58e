"""GRPO with 2 gloo processes under torchrun: one step on the same rollouts equals the 1-process
step for every loss type (and its AdamW step, a parameter without a gradient included), a
short run keeps the replicas equal bit for bit, a run killed mid-way
resumes to the uninterrupted run's weights, and a batch the ranks cannot split is refused.
The step and the uninterrupted run share one torchrun (a module-scoped fixture): its workers
take the step, then run the CLI, which spares a torchrun and its interpreter starts.

Timeouts below only guard against a hang (the bug these tests catch); nothing asserts a time.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from smollab.cli import main
from smollab.rundir.rows import read_metrics
from smollab.train.distributed import SINGLE, Dist
from smollab.train.grpo import ranks as grpo_ranks
from smollab.train.grpo.loss import LOSS_TYPES
from smollab.train.grpo.policies import policy_forward
from smollab.train.grpo.update import Batch, RunRows, loss_backward
from tests.conftest import micro_grpo_overrides
from tests.train.grpo.test_update import GEN, STATS, _batch, _options, _policy
from tests.train.test_distributed import GUARD_S, _env, _kill_tree, _run

# eps large enough that the first step's g / (|g| + eps) cannot flip on a rounding difference
ADAMW = dict(lr=1e-3, eps=1e-3, weight_decay=0.1)

# Each rank takes its half of a saved batch (rows of whole groups) and runs the GRPO step on it
# for every loss type and level, with 1 and 2 micro-batches per rank; rank 0 writes the results.
# Then the same workers run the CLI (EACH_RANK, appended) with the arguments after the first
# three, in the group the step joined: the CLI's setup hands it that group.
STEP = """
import json, sys, torch
import torch.distributed as dist
from pathlib import Path
from smollab.engine.rollout import Rollout
from smollab.train import distributed, scaffold
from smollab.train.grpo.loss import LOSS_TYPES
from tests.train.grpo.test_update import GEN, GROUPS, _options, _policy
from tests.train.grpo.test_ranks import ADAMW, rank_step

model_dir, batch_file, out = (Path(a) for a in sys.argv[1:4])
d, _ = distributed.setup(torch.device("cpu"))
saved = torch.load(batch_file, weights_only=True)
n = GROUPS * GEN // d.world
rows = slice(d.rank * n, (d.rank + 1) * n)
r = Rollout(**saved["rollout"]).select(rows)
adv, mask, old, ref = (saved[k][rows] for k in ("adv", "mask", "old", "ref"))
batch = (r, adv, mask, old, ref)
policy = _policy(model_dir)
policy.train()
trainable = [p for p in policy.parameters() if p.requires_grad]
results = {}
for level in ("token", "sequence"):
    for loss_type in LOSS_TYPES:
        if loss_type == "vespo" and level == "sequence":
            continue
        for accum in (1, 2):
            loss, stats = rank_step(policy, batch, accum, _options(loss_type, level), trainable, d)
            norm = torch.nn.utils.clip_grad_norm_(trainable, float("inf"))
            policy.zero_grad(set_to_none=True)
            results[f"{loss_type} {level} {accum}"] = dict(loss=loss, grad_norm=float(norm), **stats)
# one AdamW step, weight decay on, with a trainable parameter no rank's loss touches
policy.register_parameter("unused", torch.nn.Parameter(torch.ones(4)))
trainable = [p for p in policy.parameters() if p.requires_grad]
opt = torch.optim.AdamW(trainable, **ADAMW)
rank_step(policy, batch, 2, _options("grpo"), trainable, d)
opt.step()
if d.main:
    out.write_text(json.dumps(results))
    torch.save({k: v.detach() for k, v in policy.state_dict().items()}, str(out) + ".pt")
distributed.setup = lambda device: (d, device)
sys.argv = [sys.argv[0], *sys.argv[4:]]
"""

# A torchrun worker that also writes its own final weights (every rank's, not only rank 0's
# checkpoint) when the loop checks the replicas, so the test compares them element by element.
EACH_RANK = """
import os, sys
from safetensors.torch import save_file
from smollab.train import scaffold
real = scaffold.check_replicas
def check_and_save(run, dist, model, optimizer, scaler):
    out = os.path.join(os.environ["WEIGHTS_DIR"], f"rank{dist.rank}.safetensors")
    save_file({k: v.detach().clone() for k, v in model.state_dict().items()}, out)
    real(run, dist, model, optimizer, scaler)
scaffold.check_replicas = check_and_save
from smollab.cli import main
sys.exit(main())
"""


def rank_step(policy, batch, accum, options, trainable, d: Dist = SINGLE):
    """The loss and backward as the GRPO step takes it on a rank: the step's token and row counts
    across the ranks, this rank's loss and backward, the ranks' gradients and stats summed."""
    r, adv, mask, old, ref = batch
    [(loss, stats)] = loss_backward(
        policy_forward(policy, 1.0),
        Batch(r, adv, mask, old, ref),
        [RunRows(slice(0, mask.shape[0]), options, grpo_ranks.step_totals(mask, d))],
        num_generations=GEN,
        grad_accum=accum,
    )
    level = options.importance_sampling_level
    return grpo_ranks.sum_over_ranks(loss, stats, mask, level, trainable, d)


def _torchrun(script: Path, *args: str) -> list[str]:
    import sys

    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        *args,
    ]


def _grpo_args(micro_grpo: list[str], run: Path) -> list[str]:
    return [
        "grpo",
        *micro_grpo,
        "train.batch_size=16",
        "grpo.beta=0.04",
        "train.log_interval=1",
        "perf.threads=1",
        f"run.dir={run}",
    ]


@pytest.fixture(scope="module")
def two_rank_torchrun(micro_model, micro_data, tmp_path_factory):
    """One 2-rank torchrun for two tests: each rank takes the GRPO step on its half of a saved
    batch (STEP), then the same workers run an uninterrupted GRPO run of 6 steps (4 prompt groups
    of 4, 2 per rank) that writes each rank's final weights (EACH_RANK)."""
    tmp = tmp_path_factory.mktemp("grpo_ddp")
    policy = _policy(micro_model)
    r, adv, mask, old, ref = _batch(policy, micro_model)
    fields = (
        "prompt_ids",
        "prompt_mask",
        "completion_ids",
        "completion_mask",
        "logprobs",
        "truncated",
    )
    batch_file = tmp / "batch.pt"
    torch.save(
        {
            "rollout": {k: getattr(r, k) for k in fields},
            "adv": adv,
            "mask": mask,
            "old": old,
            "ref": ref,
        },
        batch_file,
    )
    step_script, script, out = tmp / "step.py", tmp / "each_rank.py", tmp / "two.json"
    step_script.write_text(STEP + EACH_RANK)
    script.write_text(EACH_RANK)
    weights = tmp / "weights"
    weights.mkdir()
    grpo = _grpo_args(micro_grpo_overrides(micro_model, micro_data, tmp / "grpo"), tmp / "ref")
    root = str(Path(__file__).resolve().parents[3])  # the step imports tests.train...
    with pytest.MonkeyPatch.context() as mp:  # _run's environment is os.environ's
        mp.setenv("WEIGHTS_DIR", str(weights))
        mp.setenv("PYTHONPATH", root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        _run(_torchrun(step_script, str(micro_model), str(batch_file), str(out), *grpo))
    return SimpleNamespace(
        policy=policy,
        batch=(r, adv, mask, old, ref),
        step_out=out,
        ref=tmp / "ref",
        weights=weights,
        script=script,
    )


def test_two_ranks_take_the_one_process_step(two_rank_torchrun):
    """Same rollouts, same weights: the 2-rank step's loss, KL, other stats and gradient norm
    equal the 1-process step's within 1e-5, for every loss type (global token and row counts);
    the AdamW step's weights too, a parameter no rank has a gradient for left alone (no decay)."""
    policy, out = two_rank_torchrun.policy, two_rank_torchrun.step_out
    r, adv, mask, old, ref = two_rank_torchrun.batch
    two = json.loads(out.read_text())

    policy.train()
    trainable = [p for p in policy.parameters() if p.requires_grad]
    checked = 0
    for level in ("token", "sequence"):
        for loss_type in LOSS_TYPES:
            if loss_type == "vespo" and level == "sequence":
                continue
            options = _options(loss_type, level)
            loss, stats = rank_step(policy, (r, adv, mask, old, ref), 1, options, trainable)
            norm = float(torch.nn.utils.clip_grad_norm_(trainable, float("inf")))
            policy.zero_grad(set_to_none=True)
            assert norm > 0
            for accum in (1, 2):
                got, what = two[f"{loss_type} {level} {accum}"], f"{loss_type} {level} {accum}"
                assert got["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-6), what
                assert got["grad_norm"] == pytest.approx(norm, rel=1e-5, abs=1e-6), what
                for key in STATS:
                    assert got[key] == pytest.approx(stats[key], rel=1e-5, abs=1e-6), (what, key)
                checked += 1
    assert checked == 2 * (2 * len(LOSS_TYPES) - 1)

    policy.register_parameter("unused", torch.nn.Parameter(torch.ones(4)))
    start = {k: v.detach().clone() for k, v in policy.state_dict().items()}
    trainable = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, **ADAMW)
    rank_step(policy, (r, adv, mask, old, ref), 1, _options("grpo"), trainable)
    assert policy.unused.grad is None
    opt.step()
    one, stepped = policy.state_dict(), torch.load(str(out) + ".pt", weights_only=True)
    assert one.keys() == stepped.keys()
    assert torch.equal(stepped["unused"], start["unused"])  # AdamW skipped it, as in one process
    for k in one:
        torch.testing.assert_close(stepped[k], one[k], rtol=0, atol=1e-6, msg=k)
    assert any(not torch.equal(one[k], start[k]) for k in one)  # the step moved the others


def test_a_two_rank_run_keeps_the_replicas_equal_and_resumes(
    two_rank_torchrun, micro_grpo, tmp_path, monkeypatch
):
    ref, weights = two_rank_torchrun.ref, two_rank_torchrun.weights
    script = two_rank_torchrun.script
    a, b = load_file(weights / "rank0.safetensors"), load_file(weights / "rank1.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k  # bit for bit
    summary = json.loads((ref / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["world_size"] == 2
    assert summary["replicas_agree"] and summary["steps"] == 6
    rows = read_metrics(ref / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(float(r["grad_norm"]) > 0 for r in rows)

    # kill -9 of every process after the step-2 checkpoint, then resume: the same final weights
    run = tmp_path / "run"
    cmd = _torchrun(script, *_grpo_args(micro_grpo, run))
    monkeypatch.setenv("WEIGHTS_DIR", str(tmp_path / "weights2"))
    (tmp_path / "weights2").mkdir()
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + GUARD_S
    while time.time() < deadline and proc.poll() is None:
        if list((run / "checkpoints").glob("step_*/trainer_state.pt")):
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be killed mid-way"
    _kill_tree(proc.pid)
    proc.wait()
    _run(cmd)
    assert "resumed from step_" in (run / "training.log").read_text()
    assert [int(r["step"]) for r in read_metrics(run / "metrics.csv")] == [1, 2, 3, 4, 5, 6]
    final_ref = load_file(ref / "checkpoints" / "final" / "model.safetensors")
    final_run = load_file(run / "checkpoints" / "final" / "model.safetensors")
    for k in final_ref:
        torch.testing.assert_close(final_run[k], final_ref[k], rtol=0, atol=1e-6)


def test_a_batch_the_ranks_cannot_split_is_refused_in_one_line(
    micro_grpo, monkeypatch, tmp_path, capsys
):
    monkeypatch.setenv("WORLD_SIZE", "2")
    run = tmp_path / "odd"
    args = ["grpo", *micro_grpo, "train.batch_size=12", f"run.dir={run}"]  # 3 groups of 4
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("smollab: error: train.batch_size=12 holds 3 prompt groups")
    assert "\n" not in err and not run.exists()
    assert main([*args[:-2], "train.batch_size=16", "train.grad_accum=4", f"run.dir={run}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("smollab: error: train.grad_accum=4 must divide each rank's 2 prompt")
    assert "\n" not in err and not run.exists()
    for knob, why in (
        ("grpo.top_entropy_quantile=0.5", "its threshold would be each rank's quantile"),
        ("grpo.steps_per_generation=2", "a slice of every rank's generated batch"),
    ):
        assert main([*args[:-2], "train.batch_size=16", knob, "train.save_interval=2"]) == 2
        err = capsys.readouterr().err.strip()
        assert why in err and "does not run under torchrun" in err and "\n" not in err
    assert grpo_ranks.my_prompts([5, 6, 7, 8], Dist(rank=1, world=2)) == [7, 8]


def _rank_pid(torchrun_pid: int, rank: str) -> int | None:
    """The worker of `rank` among torchrun's children (None until it has started)."""
    kids = Path(f"/proc/{torchrun_pid}/task/{torchrun_pid}/children")
    for kid in kids.read_text().split() if kids.exists() else []:
        try:
            env = Path(f"/proc/{kid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return int(kid)
    return None


def test_sigint_to_one_rank_stops_both_together_with_lora(micro_grpo, tmp_path):
    """SIGINT reaching rank 1 alone: both ranks leave at the next step, rank 0 records the run as
    interrupted, replicas (LoRA adapters summed alone) still agree, and nothing hangs."""
    import signal
    import sys

    run = tmp_path / "int"
    args = [
        *_grpo_args(micro_grpo, run),
        "train.max_steps=500",
        "train.save_interval=0",
        "train.eval_interval=1000",
        "model.lora.enabled=true",
        "model.lora.r=2",
    ]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "smollab",
        *args,
    ]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + GUARD_S
    try:
        while time.time() < deadline and proc.poll() is None:
            metrics = run / "metrics.csv"
            if metrics.exists() and len(metrics.read_text().splitlines()) > 2:
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        os.kill(_rank_pid(proc.pid, "1"), signal.SIGINT)
        proc.wait(timeout=GUARD_S)
    except BaseException:
        _kill_tree(proc.pid)
        raise
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted" and 2 <= summary["steps"] < 500
    assert summary["evidence"] == f"interrupted at step {summary['steps']}"
    assert summary["replicas_agree"] is True
