"""`smollab demo`: the whole path on micro settings, its reuse of finished stages, its report."""

from __future__ import annotations

import json

import torch

from smollab.cli import main
from smollab.demo import collapse, run_demo, stage_overrides
from smollab.report.demo_report import render


def test_quick_demo_writes_report_and_summary_then_reuses_stages(tmp_path, capsys):
    threads = torch.get_num_threads()
    out = tmp_path / "demo"
    try:
        s = run_demo(out, quick=True)
        assert s["status"] == "completed"
        summary = json.loads((out / "summary.json").read_text())
        for key in ("base_reward", "final_reward", "final_unique_fraction"):
            assert isinstance(summary[key], float), key
        assert set(summary["seconds"]) == {"data", "pretrain", "grpo", "report", "total"}
        assert summary["seconds"]["total"] >= summary["seconds"]["pretrain"] > 0
        assert not any(summary["reused"].values())
        report = (out / "report.md").read_text()
        for png in ("pretrain_loss.png", "grpo_reward.png", "grpo_kl.png", "grpo_diversity.png"):
            assert (out / png).read_bytes()[:4] == b"\x89PNG" and f"]({png})" in report
        assert "## Samples before and after RL" in report
        assert len(summary["samples"]) == 4
        assert all(
            {"prompt", "before", "after", "before_reward", "after_reward"} <= set(x)
            for x in summary["samples"]
        )
        assert "smollab pretrain configs/pretrain/simplestories-1.25m.yaml" in report
        capsys.readouterr()

        # again, through the command: every finished stage is reused
        assert main(["demo", "--dir", str(out), "--quick"]) == 0
        printed = capsys.readouterr().out
        assert f"report: {out}/report.md" in printed
        again = json.loads((out / "summary.json").read_text())
        assert again["reused"] == {"data": True, "pretrain": True, "grpo": True}
        assert again["final_reward"] == summary["final_reward"]

        # the full demo into the quick one's directory: one line naming --dir, nothing touched
        assert main(["demo", "--dir", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"smollab: error: --dir {out} holds a demo with other settings")
        assert "\n" not in err
        assert json.loads((out / "summary.json").read_text()) == again
    finally:
        torch.set_num_threads(threads)  # --quick runs on one thread; leave the session as found


def test_stages_are_the_recipes_with_a_few_keys_changed(tmp_path):
    ov = stage_overrides(tmp_path, quick=False)
    assert f"run.dir={tmp_path}/runs/pretrain" in ov["pretrain"]
    assert f"model.path={tmp_path}/runs/pretrain" in ov["grpo"] and "optim.lr=1e-4" in ov["grpo"]
    quick = collapse(stage_overrides(tmp_path, quick=True)["pretrain"])
    keys = [o.split("=")[0] for o in quick]
    assert len(keys) == len(set(keys)) and "train.max_steps=20" in quick


def test_report_renders_odd_samples_in_one_table_row():
    md = render(
        {
            "seconds": {"data": 1.0, "pretrain": 2.0, "grpo": 3.0, "report": 0.5, "total": 6.5},
            "base_reward": 0.25,
            "final_reward": 0.95,
            "final_unique_fraction": 1.0,
            "grpo": {"steps": 50, "status": "completed"},
            "pretrain": {"steps": 500},
            "samples": [
                {
                    "prompt": "once | upon",
                    "before": "a\ntime",
                    "before_reward": 0.0,
                    "after": "happy",
                    "after_reward": 1.0,
                }
            ],
        }
    )
    assert "0.25 before RL -> 0.95 after 50 GRPO steps" in md
    assert "| once \\| upon | a time | 0 | happy | 1 |" in md


def test_a_failing_stage_leaves_the_demo_summary_failed(tmp_path, monkeypatch, capsys):
    import smollab.train.pretrain
    from smollab.errors import RunFailed

    def fails(cfg):
        raise RunFailed("RewardError: reward x raised ValueError: no (after 3 steps)")

    monkeypatch.setattr(smollab.train.pretrain, "train", fails)
    threads = torch.get_num_threads()
    try:
        assert main(["demo", "--dir", str(tmp_path), "--quick"]) == 1
    finally:
        torch.set_num_threads(threads)
    assert "smollab: error: RewardError: reward x raised" in capsys.readouterr().err
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["evidence"].startswith("RewardError: ")
