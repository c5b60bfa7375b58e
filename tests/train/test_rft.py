"""`smollab rft`: the keep rule and deduplication, a two-round micro run's files, resume after a
crash mid-round equal to an uninterrupted run, a round that keeps nothing, bad keys in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from smollab.config.load import load_config
from smollab.errors import RunFailed, UserError
from smollab.rundir.runs import read_metrics
from smollab.train import rft, scaffold
from smollab.train.rft_data import Scored, histogram, select

REWARDS = '''
def has_e(completions, **kwargs):
    """1 when the completion holds the letter e: some micro-model completions do, some not."""
    return [1.0 if "e" in c else 0.0 for c in completions]


def never(completions, **kwargs):
    return [0.0 for _ in completions]
'''


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory) -> tuple[Path, Path]:
    """8 training and 4 held-out prompts: openings of offline stories, and a reward module."""
    from smollab.data.stories import generate_stories

    d = tmp_path_factory.mktemp("rft")
    openings = [" ".join(s.split()[:4]) for s in generate_stories(12, seed=3)]
    (d / "train.txt").write_text("\n".join(openings[:8]) + "\n")
    (d / "eval.txt").write_text("\n".join(openings[8:]) + "\n")
    (d / "rft_test_rewards.py").write_text(REWARDS)
    return d / "train.txt", d / "eval.txt"


@pytest.fixture
def micro_rft(micro_model, prompt_files, tmp_path, monkeypatch) -> list[str]:
    monkeypatch.syspath_prepend(str(prompt_files[0].parent))
    sys.modules.pop("rft_test_rewards", None)
    return [
        f"model.path={micro_model}",
        f"rft.prompts_file={prompt_files[0]}",
        f"rft.eval_prompts_file={prompt_files[1]}",
        "rft.rounds=2",
        "rft.oversample=4",
        "rft.max_new_tokens=8",
        "rft.gen_batch_size=3",
        "reward=[{name: rft_test_rewards:has_e}]",
        "train.epochs=null",
        "train.max_steps=4",
        "train.batch_size=4",
        "train.seq_len=32",
        "train.log_interval=1",
        "train.save_interval=2",
        "optim.lr=3e-3",
        "optim.warmup_steps=1",
        "run.plots=false",
        f"run.dir={tmp_path / 'rft'}",
    ]


def _run(args: list[str]) -> dict:
    return rft.train(load_config("rft", None, args))


def _s(i: int, text: str, reward: float) -> Scored:
    return Scored(i, f"p{i}", text, reward, {"r": reward})


def test_keep_threshold_top_k_and_dedup():
    scored = [
        _s(0, "a b", 1.0),
        _s(0, " a  b ", 1.0),
        _s(0, "c", 0.5),
        _s(0, "d", 1.0),
        _s(1, "x", 0.0),
        _s(1, "y", 2.0),
        _s(1, "y", 2.0),
    ]
    kept = select(scored, 1.0, None, dedup=True)
    assert [(s.prompt_index, s.completion) for s in kept] == [(0, "a b"), (0, "d"), (1, "y")]
    assert len(select(scored, 1.0, None, dedup=False)) == 5
    top = select(scored, None, 1, dedup=True)  # the best of each prompt; ties: sampling order
    assert [(s.prompt_index, s.completion) for s in top] == [(0, "a b"), (1, "y")]
    assert select(scored, 3.0, 2, dedup=True) == []
    assert histogram([0.0, 1.0, 1.0]) == {"0": 1, "1": 2}
    assert sum(histogram([i / 100 for i in range(100)]).values()) == 100


def test_two_rounds_write_data_stats_and_an_accuracy_row_each(micro_rft, tmp_path):
    summary = _run([*micro_rft, "run.plots=true"])
    assert summary["status"] == "completed" and summary["rounds_done"] == 2
    run = tmp_path / "rft"
    rows = read_metrics(run / "metrics.csv")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(0 <= r["accuracy"] <= 1 for r in rows) and rows[0]["kept"] is None
    assert summary["accuracy_per_round"] == [r["accuracy"] for r in rows]
    for n in (1, 2):
        d = run / "rounds" / str(n)
        records = [json.loads(x) for x in (d / "data.jsonl").read_text().splitlines()]
        stats = json.loads((d / "stats.json").read_text())
        assert stats["generated"] == 8 * 4 and stats["kept"] == len(records) > 0
        assert all("e" in r["completion"] and r["reward"] == 1.0 for r in records)
        assert rows[n]["kept"] == stats["kept"] and sum(stats["reward_histogram"].values()) == 32
        assert json.loads((d / "sft" / "summary.json").read_text())["steps"] == 4
    assert "| round |" in (run / "report.md").read_text()
    assert (run / "plots" / "accuracy.png").exists()
    assert (run / "rounds" / "1" / "sft" / "plots" / "loss_curves.png").exists()
    assert _run(micro_rft)["status"] == "completed"  # a finished run is reported, not rerun


def _crash_at_step(monkeypatch, n: int) -> None:
    real, calls = scaffold.optimizer_step, {"n": 0}

    def crash(*a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            raise RuntimeError("simulated crash")
        return real(*a, **k)

    monkeypatch.setattr(scaffold, "optimizer_step", crash)


def test_resume_mid_round_equals_an_uninterrupted_run(micro_rft, tmp_path, monkeypatch):
    _run([*micro_rft, f"run.dir={tmp_path / 'ref'}"])
    with monkeypatch.context() as m:
        _crash_at_step(m, 7)  # round 2's SFT, step 3: after its data and a checkpoint at step 2
        with pytest.raises(RunFailed, match="simulated crash"):
            _run(micro_rft)
    crashed = json.loads((tmp_path / "rft" / "summary.json").read_text())
    assert crashed["status"] == "failed" and "simulated crash" in crashed["evidence"]
    assert (tmp_path / "rft" / "rounds" / "2" / "stats.json").exists()
    assert _run(micro_rft)["status"] == "completed"
    ref, got = tmp_path / "ref", tmp_path / "rft"
    log = (got / "training.log").read_text()
    assert "round 2: data reused" in log and "round 1: data reused" not in log
    assert "resumed from step_2" in (got / "rounds" / "2" / "sft" / "training.log").read_text()
    keys = (
        "step",
        "accuracy",
        "eval_reward_mean",
        "generated",
        "kept",
        "sft_steps",
        "sft_train_loss",
    )
    want_rows, got_rows = read_metrics(ref / "metrics.csv"), read_metrics(got / "metrics.csv")
    assert [[r[k] for k in keys] for r in got_rows] == [[r[k] for k in keys] for r in want_rows]
    for n in ("1", "2"):
        assert (got / "rounds" / n / "data.jsonl").read_text() == (
            ref / "rounds" / n / "data.jsonl"
        ).read_text()
    a = load_file(ref / "rounds/2/sft/checkpoints/final/model.safetensors")
    b = load_file(got / "rounds/2/sft/checkpoints/final/model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)


def test_a_round_that_keeps_nothing_ends_stuck(micro_rft, tmp_path):
    summary = _run([*micro_rft, "reward=[{name: rft_test_rewards:never}]"])
    assert (
        summary["status"] == "stuck"
        and "round 1: none of 32 completions kept" in (summary["evidence"])
    )
    assert [r["step"] for r in read_metrics(tmp_path / "rft" / "metrics.csv")] == [0]
    assert not (tmp_path / "rft" / "rounds" / "1" / "sft").exists()


def test_lora_rounds_merge_their_adapters(micro_rft, tmp_path):
    summary = _run(
        [
            *micro_rft,
            "model.lora.enabled=true",
            "model.lora.r=2",
            "rft.restart_from=base",
            "rft.keep.top_k=1",
        ]
    )
    assert summary["status"] == "completed"
    for n in ("1", "2"):
        assert (tmp_path / "rft" / "rounds" / n / "model" / "model.safetensors").exists()
        records = (tmp_path / "rft" / "rounds" / n / "data.jsonl").read_text().splitlines()
        assert len(records) <= 8  # at most one per prompt
        assert not (tmp_path / "rft" / "rounds" / n / "sft" / "plots").exists()  # run.plots=false
    assert not (tmp_path / "rft" / "report.md").exists()


@pytest.mark.parametrize(
    "args, expected",
    [
        (["data.train_file=x.jsonl"], "rft does not read it"),
        (["train.eval_interval=5"], "rft does not read it"),
        (["model.preset=micro"], "rft does not read it"),
        (["rft.keep.threshold=null"], "rft.keep: set threshold, top_k or both"),
        (["rft.eval_samples=2"], "rft.eval_temperature=0 is greedy"),
        (["train.max_steps=5", "train.epochs=1"], "both set"),
        (["rft.accuracy_reward=nope"], "names no reward entry"),
        (["rft.rounds=0"], "rft.rounds"),
        (["rft.prompts_file=/no/such.txt"], "rft.prompts_file: no such file"),
        (["reward=[]"], "reward: rft scores completions"),
        (["reward=[{name: rft_test_rewards:nope}]"], "has no attribute"),
        (["model.path=null"], "model.path"),
    ],
)
def test_bad_config_is_refused_in_one_line(micro_rft, tmp_path, args, expected):
    with pytest.raises(UserError, match=expected) as e:
        _run([*micro_rft, *args])
    assert "\n" not in str(e.value)
    assert not (tmp_path / "rft").exists()  # refused before the run directory


def test_python_api_and_cli(micro_rft, tmp_path):
    import smollab
    from smollab.cli import main

    summary = smollab.rft(None, micro_rft, **{"rft.rounds": 1})
    assert summary["status"] == "completed" and summary["rounds_done"] == 1
    assert main(["rft", *micro_rft, "rft.rounds=1", f"run.dir={tmp_path / 'cli'}"]) == 0


def test_sweeps_take_rft_and_probes_refuse_it(micro_rft, tmp_path):
    """`command: rft` in a sweep (its metric is a column of the rounds' rows); a probe, which
    times optimizer steps, refuses it in one line."""
    import yaml

    from smollab.config.load import parse_override
    from smollab.lab.probe.spec import load_probe
    from smollab.lab.sweep.command_names import metric_names
    from smollab.lab.sweep.spec_load import load_spec

    overrides = dict(parse_override(a) for a in micro_rft if not a.startswith(("run.", "optim.lr")))
    overrides["reward"] = [{"name": "sentence_length"}]
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "command": "rft",
                "overrides": overrides,
                "space": {"optim.lr": [1e-3, 3e-3]},
                "sampler": "grid",
                "metric": {"name": "accuracy", "goal": "max"},
                "dir": str(tmp_path / "sw"),
            }
        )
    )
    spec = load_spec(str(spec_file), [])
    assert spec.command == "rft" and len(spec.grid_points()) == 2
    assert metric_names("rft") == rft.COLUMNS
    recipe = tmp_path / "rft.yaml"
    recipe.write_text(yaml.safe_dump({"rft": {"rounds": 1}}))
    with pytest.raises(UserError, match="rft's unit is a round"):
        load_probe(str(recipe), [])
