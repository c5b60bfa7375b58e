"""Crashes are recorded and resumes are exact: kill -9 then rerun matches an uninterrupted run;
a failing reward leaves status failed; damaged checkpoints fall back or fail in one line."""

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
from safetensors.torch import load_file, save_file

from smollab import api
from smollab.cli import main
from smollab.config.load import load_config
from smollab.errors import RunFailed
from smollab.rundir.runs import read_metrics
from smollab.train import pretrain

SRC = str(Path(pretrain.__file__).resolve().parents[2])


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}


def _samples(run: Path) -> list[tuple]:
    path = run / "samples.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return [(r["step"], r["prompt"], r["completion"], round(r["reward"], 6)) for r in rows]


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    final = run / "checkpoints" / "final"
    name = "adapter_model.safetensors" if (final / "adapter_model.safetensors").exists() else None
    return load_file(final / (name or "model.safetensors"))


def _assert_same_run(ref: Path, run: Path, loss_key: str) -> None:
    """Same final weights, each metrics step once and the same steps, same sample rows."""
    a, b = _final_weights(ref), _final_weights(run)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)
    want, got = read_metrics(ref / "metrics.csv"), read_metrics(run / "metrics.csv")
    steps = [int(r["step"]) for r in got]
    assert steps == sorted(set(steps)) and steps == [int(r["step"]) for r in want]
    for w, g in zip(want, got, strict=True):
        assert g[loss_key] == pytest.approx(w[loss_key], rel=1e-5, abs=1e-7), g["step"]
    assert _samples(run) == _samples(ref)


def _kill_after_checkpoint(cmd: list[str], run: Path, ckpt_step: int) -> None:
    """Start `cmd`, wait until checkpoints/step_<ckpt_step> exists and a later step is logged,
    then kill -9 it mid-run."""
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ckpt, deadline = run / "checkpoints" / f"step_{ckpt_step}", time.time() + 300
    try:
        while time.time() < deadline and proc.poll() is None:
            rows = read_metrics(run / "metrics.csv") if ckpt.exists() else []
            if rows and rows[-1]["step"] > ckpt_step:
                break
            time.sleep(0.02)
        assert proc.poll() is None, f"ended before the kill: {proc.stderr.read()[-2000:]!r}"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert json.loads((run / "summary.json").read_text())["status"] == "running"


CHATS = [
    "what is two plus two",
    "name a red fruit",
    "say hello",
    "count to three",
    "what color is the sky",
]


def _chat_task(replicas, tmp_path) -> list[str]:
    """GRPO on chat-message prompts (a JSONL with a column) of an offline Qwen2.5 replica, for 2
    epochs of 5 prompts, 2 a step: the third step straddles the epochs, and the checkpoint at step
    2 resumes mid-epoch."""
    rows = [
        {"prompt": [{"role": "system", "content": "one word"}, {"role": "user", "content": q}]}
        | {"topic": i}
        for i, q in enumerate(CHATS)
    ]
    f = tmp_path / "chat.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [
        f"model.path={replicas('qwen2.5')}",
        f"grpo.prompts_file={f}",
        "train.epochs=2",
        "train.batch_size=4",
        "grpo.num_generations=2",
        "grpo.max_completion_length=6",
        "train.eval_interval=0",
        "train.save_interval=2",
        "train.log_interval=1",
        "grpo.log_samples=2",
        "reward=[{name: sentence_length, params: {target: 3}}]",
        "run.plots=false",
    ]


@pytest.mark.parametrize("kind", ["pretrain", "grpo-full", "grpo-lora", "grpo-chat-epochs"])
def test_kill_9_then_rerun_matches_an_uninterrupted_run(
    kind, micro_pretrain, request, tmp_path, capsys
):
    """The killed run is a real `python -m smollab` child; the rerun is the CLI in this process
    (a fresh start all the same: nothing of the killed process's memory reaches it), which
    spares a second interpreter start."""
    if kind == "grpo-chat-epochs":
        args = _chat_task(request.getfixturevalue("replicas"), tmp_path)
        run, ckpt_step, loss_key = tmp_path / "grpo", 2, "loss"
        args.append(f"run.dir={run}")
    elif kind == "pretrain":
        args = [
            *micro_pretrain,
            "train.max_steps=24",
            "train.save_interval=6",
            "train.log_interval=1",
            "train.keep_last=1",
        ]
        run, ckpt_step, loss_key = tmp_path / "run", 12, "train_loss"
    else:
        lora = ["model.lora.enabled=true", "model.lora.r=2"] if kind == "grpo-lora" else []
        args = [
            *request.getfixturevalue("micro_grpo"),
            *lora,
            "train.max_steps=10",
            "train.save_interval=3",
            "train.log_interval=1",
            "grpo.log_samples=2",
        ]
        run, ckpt_step, loss_key = tmp_path / "grpo", 6, "loss"
    command = kind.split("-")[0]
    ref = tmp_path / "ref"  # uninterrupted, in this process
    assert getattr(api, command)(None, [*args, f"run.dir={ref}"])["status"] == "completed"
    cmd = [sys.executable, "-m", "smollab", command, *args]

    _kill_after_checkpoint(cmd, run, ckpt_step)
    # What a kill -9 can leave: a checkpoint directory half written, a half-swapped best/.
    (run / "checkpoints" / f".step_{ckpt_step + 1}.tmp").mkdir()
    (run / "checkpoints" / ".final.old").mkdir()
    capsys.readouterr()
    rc = main([command, *args])
    out = capsys.readouterr()
    assert rc == 0, out.err[-2000:]
    assert f"resumed from step_{ckpt_step}" in out.out
    assert not list((run / "checkpoints").glob(".*"))
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    _assert_same_run(ref, run, loss_key)


FAILING_REWARD = """
CALLS = {"train": 0}

def fails_at_step_5(completions, **kwargs):
    if len(completions) == 8:  # a training batch (evaluations score 4 held-out prompts)
        CALLS["train"] += 1
        if CALLS["train"] == 5:
            return [1 / 0 for _ in completions]
    return [0.0] * len(completions)
"""


def test_reward_that_raises_fails_the_run_and_records_why(
    micro_grpo, tmp_path, monkeypatch, capsys
):
    (tmp_path / "failing_reward.py").write_text(FAILING_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = [*micro_grpo, "reward=[{name: 'failing_reward:fails_at_step_5'}]"]
    assert main(["grpo", *args]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("smollab: error: RewardError: reward ")
    summary = json.loads((tmp_path / "grpo" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["steps"] == 4
    assert summary["evidence"] == (
        "RewardError: reward failing_reward:fails_at_step_5 raised ZeroDivisionError: "
        "division by zero (after 4 steps)"
    )
    log = (tmp_path / "grpo" / "training.log").read_text()
    assert "failed: RewardError" in log and "Traceback (most recent call last)" in log
    assert "ZeroDivisionError" in log and "1 / 0" in log
    # A failed run is not a result: the same command resumes it from its last checkpoint.
    monkeypatch.setitem(sys.modules["failing_reward"].CALLS, "train", -100)
    assert main(["grpo", *args]) == 0
    assert "resumed from step_4" in capsys.readouterr().out
    summary = json.loads((tmp_path / "grpo" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["evidence"] is None


def test_an_interrupt_before_the_loop_is_recorded_as_interrupted(
    micro_pretrain, tmp_path, monkeypatch
):
    from smollab.train import checkpoints

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoints, "resume", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _pretrain(micro_pretrain)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["evidence"] == "interrupted"


def _crash_at(monkeypatch, batch: int) -> None:
    """Make pretraining raise on its `batch`-th batch (step `batch` at grad_accum 1)."""
    real, calls = pretrain.get_batch, {"n": 0}

    def get_batch(*a, **k):
        calls["n"] += 1
        if calls["n"] == batch:
            raise RuntimeError("simulated crash")
        return real(*a, **k)

    monkeypatch.setattr(pretrain, "get_batch", get_batch)


def _pretrain(overrides: list[str]) -> dict:
    return pretrain.train(load_config("pretrain", None, overrides))


@pytest.fixture
def crashed_pretrain(micro_pretrain, tmp_path, monkeypatch):
    """A pretraining run that failed at step 18 with checkpoints step_5, 10 and 15, and the
    uninterrupted run of the same config in ref/."""
    args = [*micro_pretrain, "train.save_interval=5", "train.keep_last=3"]
    _pretrain([*args, f"run.dir={tmp_path / 'ref'}"])
    with monkeypatch.context() as m:
        _crash_at(m, 18)
        with pytest.raises(RunFailed, match=r"RuntimeError: simulated crash \(after 17 steps\)"):
            _pretrain(args)
    ckpts = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_10", "step_15", "step_5"]
    return args, ckpts


def test_damaged_latest_checkpoints_fall_back_to_an_earlier_one(crashed_pretrain, tmp_path):
    args, ckpts = crashed_pretrain
    weights = ckpts / "step_15" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a full disk
    (ckpts / "step_10" / "trainer_state.pt").write_bytes(b"\0" * 64)
    summary = _pretrain(args)
    assert summary["status"] == "completed"
    log = (tmp_path / "run" / "training.log").read_text()
    assert "checkpoint step_15 unusable" in log and "checkpoint step_10 unusable" in log
    assert "resumed from step_5 at step 5" in log
    _assert_same_run(tmp_path / "ref", tmp_path / "run", "train_loss")


def test_no_usable_checkpoint_is_one_line_naming_it(crashed_pretrain, tmp_path, capsys):
    import pickle

    args, ckpts = crashed_pretrain

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    for step in (5, 10, 15):
        torch.save({"x": Evil()}, ckpts / f"step_{step}" / "trainer_state.pt", pickle_module=pickle)
    assert main(["pretrain", *args]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "weights_only=False" not in err and "pwned" not in err
    assert "no usable checkpoint in" in err and "step_15/trainer_state.pt: unreadable" in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and "CheckpointError" in summary["evidence"]


def test_checkpoint_missing_a_key_is_one_line_naming_it(crashed_pretrain, tmp_path, capsys):
    args, ckpts = crashed_pretrain
    weights = ckpts / "step_15" / "model.safetensors"
    tensors = load_file(weights)
    dropped = sorted(tensors)[-1]
    del tensors[dropped]
    tensors["extra.weight"] = torch.zeros(2)
    save_file(tensors, weights, metadata={"format": "pt"})
    assert main(["pretrain", *args]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"step_15/model.safetensors does not fit the model: missing {dropped}; " in err
    assert "unexpected extra.weight" in err
    log = (tmp_path / "run" / "training.log").read_text()
    assert "resumed from" not in log.split("RuntimeError: simulated crash")[-1]


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="needs /dev/full")
def test_full_disk_fails_the_run_in_one_line(micro_pretrain, tmp_path, monkeypatch, capsys):
    real_save = torch.save

    def onto_a_full_disk(obj, f, *a, **k):
        with open("/dev/full", "wb") as dev:
            real_save(obj, dev, *a, **k)

    monkeypatch.setattr(torch, "save", onto_a_full_disk)
    assert main(["pretrain", *micro_pretrain]) == 1
    err = capsys.readouterr().err
    ckpt = tmp_path / "run" / "checkpoints" / "step_10"
    assert err.count("\n") == 1 and f"disk full while writing {ckpt} (after 10 steps)" in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["evidence"].startswith("disk full")
    assert not ckpt.exists() and not list(ckpt.parent.glob(".*"))
