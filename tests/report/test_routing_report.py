"""The routing side of `smollab report` on a hand-written routing_eval.jsonl (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from smollab.cli import main
from smollab.errors import UserError
from smollab.report.routing import (
    final_by_mode,
    read_routing_eval,
    scale_curve,
    task_reward,
    task_weights,
)
from smollab.report.run_report import write_run_report
from tests.report.test_sweep_report import fake_run

CONFIG = {
    "model": {"path": "runs/base"},
    "optim": {"lr": 3e-4},
    "train": {"batch_size": 8},
    "run": {"seed": 0},
    "reward": [{"name": "sentence_length", "weight": 1.0}, {"name": "happy_binary", "weight": 0.5}],
    "grpo": {"routing": {"enabled": True, "mode": "classic", "hack_reward": "happy_binary"}},
}

# (step, mode) -> (sentence_length, happy_binary, hack_rate)
EVAL = {
    (10, "both"): (0.2, 0.3, 0.3),
    (10, "retain_only"): (0.2, 0.2, 0.2),
    (10, "forget_only"): (0.1, 0.3, 0.3),
    (20, "both"): (0.5, 0.9, 0.9),
    (20, "retain_only"): (0.45, 0.0, 0.0),
    (20, "forget_only"): (0.1, 1.0, 1.0),
}


def routed_run(d: Path, torn: bool = False) -> Path:
    fake_run(d, 3e-4, [2.0, 1.5])
    (d / "config.json").write_text(json.dumps(CONFIG))
    lines = []
    for (step, mode), (task, hack_r, rate) in EVAL.items():
        row = {
            "step": step,
            "mode": mode,
            "reward_mean": task + 0.5 * hack_r,
            "reward/sentence_length": task,
            "reward/happy_binary": hack_r,
            "hack_rate": rate,
            "unique_fraction": 0.75,
            "jaccard": 0.125,
        }
        lines.append(json.dumps(row))
    text = "\n".join(lines) + "\n" + ('{"step": 30, "mo' if torn else "")
    (d / "routing_eval.jsonl").write_text(text)
    return d


def test_read_final_and_task_reward(tmp_path):
    rows = read_routing_eval(routed_run(tmp_path / "run", torn=True))  # the torn line is dropped
    assert [(r["step"], r["mode"]) for r in rows] == list(EVAL)
    final = final_by_mode(rows)
    assert list(final) == ["both", "retain_only", "forget_only"]
    assert final["retain_only"]["step"] == 20
    weights = task_weights(CONFIG)
    assert weights == {"sentence_length": 1.0}  # the hack bonus is not task reward
    assert task_reward(final["both"], weights) == pytest.approx(0.5)
    assert task_reward(final["both"], None) == pytest.approx(0.95)  # reward_mean stands in


def test_bad_line_or_mode_is_refused(tmp_path):
    d = routed_run(tmp_path / "run")
    good = (d / "routing_eval.jsonl").read_text()
    (d / "routing_eval.jsonl").write_text("not json\n" + good)
    with pytest.raises(UserError, match="routing_eval.jsonl: line 1"):
        read_routing_eval(d)
    (d / "routing_eval.jsonl").write_text(good + '{"step": 30, "mode": "ablated"}\n')
    with pytest.raises(UserError, match="mode 'ablated' is not one of"):
        read_routing_eval(d)


def test_run_report_has_routing_section_plot_and_headline(tmp_path):
    d = routed_run(tmp_path / "run")
    text = write_run_report(d).read_text()
    assert (d / "plots" / "routing.png").stat().st_size > 0
    assert not (d / "plots" / "routing_scales.png").exists()  # no forget-scale rows
    assert "## Gradient routing" in text and "![routing](plots/routing.png)" in text
    assert text.count("plots/routing.png") == 1  # in its section, not again under Plots
    head = "- adapter mode **both** (step 20): task reward 0.5, reward mean 0.95, hack rate 0.9"
    assert head in text
    assert (
        "| mode | step | reward_mean | reward/happy_binary | reward/sentence_length | hack_rate "
        "| unique_fraction | jaccard |" in text
    )
    assert "| retain_only | 20 | 0.45 | 0 | 0.45 | 0 | 0.75 | 0.125 |" in text
    assert "| forget_only | 20 | 0.6 | 1 | 0.1 | 1 | 0.75 | 0.125 |" in text

    text = write_run_report(d, mode="retain_only").read_text()
    assert "- adapter mode **retain_only** (step 20): task reward 0.45, reward mean 0.45" in text


def test_cli_mode(tmp_path, capsys):
    d = routed_run(tmp_path / "run")
    assert main(["report", str(d), "--mode", "forget_only"]) == 0
    assert "adapter mode **forget_only** (step 20)" in (d / "report.md").read_text()
    plain = tmp_path / "plain"
    fake_run(plain, 1e-3, [3.0, 2.0])
    capsys.readouterr()
    assert main(["report", str(plain), "--mode", "retain_only"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--mode needs a routed GRPO run" in err[0]
    assert main(["report", str(plain)]) == 0  # without --mode a plain run reports as before
    assert "Gradient routing" not in (plain / "report.md").read_text()


def test_training_hack_metrics_get_a_panel(tmp_path):
    from smollab.report.plots import plot_run

    d = tmp_path / "run"
    d.mkdir()
    (d / "metrics.csv").write_text(
        "step,reward_mean,hack_rate,routed_frac,eligible_frac\n1,0.1,0.0,0.0,0.5\n2,0.2,0.25,0.2,0.5\n"
    )
    names = [p.name for p in plot_run(d)]
    assert names == ["reward.png", "hack.png"]  # no routing_eval.jsonl: no routing.png


def test_the_forget_scale_curve_runs_from_retain_only_to_both(tmp_path):
    d = routed_run(tmp_path / "run")
    scaled = [(0.25, 0.4, 0.1), (0.5, 0.3, 0.5)]  # (scale, sentence_length, hack_rate)
    with open(d / "routing_eval.jsonl", "a") as f:
        for scale, task, rate in reversed(scaled):  # read back in scale order
            row = {"step": 20, "mode": "forget_scale", "forget_scale": scale, "reward_mean": 0.0}
            row.update({"reward/sentence_length": task, "reward/happy_binary": rate})
            f.write(json.dumps({**row, "hack_rate": rate}) + "\n")
    rows = read_routing_eval(d)
    assert [r.get("forget_scale") for r in rows if r["step"] == 20] == [None, None, None, 0.25, 0.5]
    assert set(final_by_mode(rows)) == {"both", "retain_only", "forget_only"}
    text = write_run_report(d).read_text()
    assert "Forget-scale curve at step 20" in text
    table = "| 0 | 0.45 | 0 |\n| 0.25 | 0.4 | 0.1 |\n| 0.5 | 0.3 | 0.5 |\n| 1 | 0.5 | 0.9 |"
    image = "![forget scales](plots/routing_scales.png)"
    assert f"{table}\n\n{image}\n" in text  # the plot beside its table, not again under Plots
    assert text.count("plots/routing_scales.png") == 1
    assert (d / "plots" / "routing_scales.png").stat().st_size > 0
    # each evaluation's curve is its own: step 10 sampled no scales
    assert [s for s, _ in scale_curve(rows, 10)] == []
    assert [s for s, _ in scale_curve(rows, 20)] == [0.0, 0.25, 0.5, 1.0]
