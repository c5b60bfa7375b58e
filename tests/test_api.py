"""The Python API: the same functions the CLI calls, returning the summaries the CLI writes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import smollab
from smollab import api
from smollab.cli import main
from smollab.config import PretrainConfig
from smollab.errors import UserError

# measured, not computed: they differ between any two runs
TIMINGS = (
    "train_seconds",
    "wall_seconds",
    "tokens_per_s",
    "peak_flops",
    "seconds_per_step",
    "step_s",
    "mfu",
)


def as_values(overrides: list[str]) -> dict[str, str]:
    return dict(o.split("=", 1) for o in overrides)


def comparable(summary: dict) -> dict:
    return {
        k: v for k, v in summary.items() if k != "environment" and not any(t in k for t in TIMINGS)
    }


def same_summary(a: dict, b: dict) -> None:
    a, b = comparable(a), comparable(b)
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], float):
            assert b[k] == pytest.approx(a[k], rel=1e-5), k
        else:
            assert b[k] == a[k], k


def test_pretrain_from_python_returns_what_the_cli_writes(micro_pretrain, tmp_path):
    cli_dir, api_dir = tmp_path / "cli", tmp_path / "api"
    micro_pretrain = [*micro_pretrain, "train.max_steps=10"]
    assert main(["pretrain", *micro_pretrain, f"run.dir={cli_dir}"]) == 0
    from_cli = json.loads((cli_dir / "summary.json").read_text())

    values = {**as_values(micro_pretrain), "run.dir": str(api_dir)}
    from_api = smollab.pretrain(None, **values)
    assert from_api == json.loads((api_dir / "summary.json").read_text())
    assert from_api["status"] == "completed" and from_api["steps"] == 10
    same_summary(from_cli, from_api)

    # a config object, changed by keyword: the same run again under another directory
    cfg = smollab.load_config("pretrain", None, micro_pretrain)
    assert isinstance(cfg, PretrainConfig)
    again = smollab.pretrain(cfg, **{"run.dir": str(tmp_path / "obj")})
    same_summary(from_cli, again)


def test_grpo_from_python_returns_what_the_cli_writes(micro_grpo, tmp_path):
    cli_dir, api_dir = tmp_path / "cli", tmp_path / "api"
    # the shipped recipe by name, the micro settings as Python values
    micro_grpo = [*micro_grpo, "train.max_steps=3"]  # 3 steps, evaluated at the last
    assert main(["grpo", "happy", *micro_grpo, f"run.dir={cli_dir}"]) == 0
    from_cli = json.loads((cli_dir / "summary.json").read_text())
    values = {**as_values(micro_grpo), "run.dir": str(api_dir)}
    from_api = smollab.grpo("happy", **values)
    assert from_api == json.loads((api_dir / "summary.json").read_text())
    assert from_api["status"] == "completed" and from_api["steps"] == 3
    same_summary(from_cli, from_api)


def test_the_cli_is_argument_parsing_over_the_api(monkeypatch, tmp_path):
    calls = []

    def record(name):
        def fn(*a, **kw):
            calls.append((name, a, kw))
            return {"status": "completed"}

        return fn

    for name in ("pretrain", "grpo", "sweep", "probe", "data_prepare"):
        monkeypatch.setattr(api, name, record(name))
    monkeypatch.setattr(
        api,
        "data_prepare",
        lambda *a, **kw: (
            calls.append(("data", a, kw))
            or {"dir": "d", "tokens": {"train": 1, "val": 1}, "vocab_size": 64}
        ),
    )
    assert main(["pretrain", "simplestories-1.25m", "train.max_steps=5"]) == 0
    assert main(["grpo", "optim.lr=1e-4"]) == 0
    assert main(["sweep", "lr-micro", "--dry-run"]) == 0
    assert main(["probe", "pretrain-micro", "steps=5"]) == 0
    assert main(["data", "prepare", "data.dir=x"]) == 0
    assert calls == [
        ("pretrain", ("simplestories-1.25m", ["train.max_steps=5"]), {}),
        ("grpo", (None, ["optim.lr=1e-4"]), {}),
        ("sweep", ("lr-micro", []), {"dry_run": True}),
        ("probe", ("pretrain-micro", ["steps=5"]), {}),
        ("data", (None, ["data.dir=x"]), {}),
    ]


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: smollab.pretrain(**{"optim.learning_rate": 1e-3}),
            "unknown config key optim.learning_rate",
        ),
        (lambda: smollab.grpo("happy", **{"optim.lr": -1}), "config key optim.lr"),
        (
            lambda: smollab.grpo(PretrainConfig()),
            "grpo: got a PretrainConfig, expected a GRPOConfig",
        ),
        (
            lambda: smollab.pretrain("no-such-recipe"),
            "pretrain recipe no-such-recipe: no such file",
        ),
        (lambda: smollab.sweep("lr-micro", bogus=1), "bogus"),
        (lambda: smollab.sample("nowhere", []), "give at least one prompt"),
        (lambda: smollab.load_config("train"), "command 'train': one of"),
        (lambda: smollab.doctor(timeout=0), "--timeout 0"),
    ],
)
def test_bad_input_is_one_user_error_line(call, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=match) as e:
        call()
    assert "\n" not in str(e.value)
    assert not any(tmp_path.iterdir())  # refused before any work


def test_values_are_python_values_and_mappings_stand_for_their_leaves():
    cfg = smollab.load_config(
        "grpo",
        "happy",
        ["optim.lr=2e-4"],
        train={"max_steps": 7},
        **{"reward": [{"name": "happy_binary", "weight": 2.0}]},
    )
    assert cfg.train.max_steps == 7 and cfg.optim.lr == 2e-4
    assert cfg.train.batch_size == 32 and cfg.train.eval_interval == 25  # the recipe's, kept
    assert cfg.reward[0].weight == 2.0
    assert [r["name"] for r in smollab.recipes()].count("happy") == 1


def test_import_smollab_stays_cheap():
    code = (
        "import sys, smollab; f = smollab.grpo; assert callable(f); "
        "print(sorted(m for m in ('torch', 'transformers', 'pydantic') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
