"""`smollab report` on synthetic run and sweep directories (no training)."""

from __future__ import annotations

import csv
import fcntl
import json
import math
from pathlib import Path

from smollab.cli import main
from smollab.report.run_report import write_run_report
from smollab.report.sweep_data import load_sweep
from smollab.report.sweep_report import write_sweep_report

COLS = [
    "step",
    "tokens",
    "wall_s",
    "train_s",
    "lr",
    "train_loss",
    "val_loss",
    "grad_norm",
    "tokens_per_s",
    "mfu",
    "peak_mem_mb",
]


def fake_run(d: Path, lr: float, losses: list[float], status: str = "completed", evidence=None):
    d.mkdir(parents=True)
    with open(d / "metrics.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLS)
        w.writeheader()
        for i, loss in enumerate(losses):
            step = 10 * (i + 1)
            w.writerow(
                {
                    "step": step,
                    "tokens": step * 4096,
                    "wall_s": step / 10,
                    "train_s": step / 10,
                    "lr": lr,
                    "train_loss": loss,
                    "val_loss": loss + 0.05 if i % 2 else "",
                    "tokens_per_s": 8000,
                    "peak_mem_mb": 300,
                }
            )
    (d / "summary.json").write_text(
        json.dumps(
            {
                "status": status,
                "evidence": evidence,
                "command": "pretrain",
                "steps": 10 * len(losses),
            }
        )
    )


def fake_lr_sweep(d: Path, seeds=(0, 1)) -> Path:
    lrs = [1e-4, 1e-3, 1e-2, 1e-1]
    rows = []
    n = 0
    for lr in lrs:
        for seed in seeds:
            name = f"{n:03d}-lr{lr:.3g}-s{seed}"
            if lr == 1e-1:
                losses, status, ev = [8.0, 9.0, float("nan")], "diverged", "loss is nan at step 30"
            else:
                end = {1e-4: 4.0, 1e-3: 2.5, 1e-2: 2.3}[lr] + 0.05 * seed
                losses = [end + (8 - end) * math.exp(-0.6 * i) for i in range(10)]
                status, ev = "completed", None
            fake_run(d / "trials" / name, lr, losses, status, ev)
            final = losses[-1] + 0.05 if status == "completed" else ""
            rows.append(
                {
                    "trial": f"{n:03d}",
                    "optim.lr": lr,
                    "seed": seed,
                    "status": status,
                    "val_loss": final,
                    "steps": 10 * len(losses),
                    "wall_s": 3.0,
                    "reason": ev or "",
                    "run_dir": f"trials/{name}",
                }
            )
            n += 1
    with open(d / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    spec = {
        "command": "pretrain",
        "base": "configs/pretrain/simplestories-1.25m.yaml",
        "overrides": {"train.max_steps": 100},
        "space": {"optim.lr": lrs},
        "sampler": "grid",
        "seeds": list(seeds),
        "metric": {"name": "val_loss", "goal": "min"},
        "pruner": {"type": "none"},
    }
    (d / "sweep.json").write_text(json.dumps({"spec": spec, "identity": spec}))
    return d


def test_lr_sweep_report(tmp_path):
    d = fake_lr_sweep(tmp_path / "sw")
    path = write_sweep_report(d, target_loss=2.6)
    text = path.read_text()
    assert "**Best LR: 0.01**" in text
    assert "**First diverging LR: 0.1**" in text
    assert "**Ratio (first diverging LR / best LR): 10**" in text
    assert "not the 'edge of stability' of Cohen et al." in text
    assert "Target loss 2.6: met at LR 0.001, 0.01" in text
    assert "| 0.0001 | 0 | too slow |" in text and "| 0.1 | 1 | diverged |" in text
    assert "### Across seeds" in text and "- **diverged**: 2" in text
    assert (d / "results.json").exists() and "](seed_intervals.png)" in text
    for png in (
        "lr_sweep_comparison.png",
        "lr_vs_final_loss.png",
        "curves.png",
        "metric_vs_optim_lr.png",
    ):
        assert (d / png).exists() and f"]({png})" in text
    analysis = json.loads((d / "lr_analysis.json").read_text())
    assert analysis["best_lr"] == 0.01 and analysis["ratio"] == 10.0


def test_report_without_sweep_json_and_while_running(tmp_path):
    d = fake_lr_sweep(tmp_path / "sw", seeds=(0,))
    (d / "sweep.json").unlink()
    with open(d / "results.csv") as f:
        rows = list(csv.DictReader(f))
    rows[0]["status"] = "running"
    with open(d / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with open(d / ".sweep.lock", "w") as lock:  # a live sweep holds its dir's lock
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = load_sweep(d)
        assert data.space == ["optim.lr"] and data.trials[0].status == "running"
        text = write_sweep_report(d, plots=False).read_text()
        assert "1 running" in text


def test_running_rows_of_a_dead_sweep_read_as_their_runs_ended(tmp_path):
    """A killed sweep leaves `running` in results.csv: with no sweep holding the lock, the run's
    own final status shows, else `interrupted`; failed trials are listed by name with evidence."""
    d = fake_lr_sweep(tmp_path / "sw", seeds=(0,))
    with open(d / "results.csv") as f:
        rows = list(csv.DictReader(f))
    rows[0]["status"] = rows[1]["status"] = "running"
    summary = d / rows[1]["run_dir"] / "summary.json"
    summary.write_text(json.dumps({"status": "running", "command": "pretrain"}))
    rows[2].update(status="failed", reason="timed out after 60 s", **{"val_loss": ""})
    with open(d / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (d / ".sweep.lock").write_text("12345\n")  # left by the dead sweep, not locked
    data = load_sweep(d)
    assert [t.status for t in data.trials[:3]] == ["completed", "interrupted", "failed"]
    assert data.trials[1].row["reason"] == "the sweep process ended while it ran"
    text = write_sweep_report(d, plots=False).read_text()
    name = Path(rows[2]["run_dir"]).name
    tally = text.splitlines()[2]
    assert "1 interrupted" in tally and "1 failed" in tally and "running" not in tally
    assert f"| `{name}` | 0.01 | 0 | failed | 100 | timed out after 60 s |" in text


def test_run_report_and_the_cli(tmp_path, capsys):
    run = tmp_path / "run"
    fake_run(run, 1e-3, [8, 6, 4, 3], status="completed")
    (run / "config.json").write_text(
        json.dumps(
            {
                "model": {"preset": "micro"},
                "optim": {"lr": 1e-3},
                "train": {"batch_size": 4},
                "run": {"seed": 0},
            }
        )
    )
    text = write_run_report(run).read_text()
    assert "status: **completed**" in text and "plots/loss_curves.png" in text
    assert (run / "plots" / "loss_curves.png").exists()

    sweep = fake_lr_sweep(tmp_path / "sw", seeds=(0,))
    assert main(["report", str(sweep)]) == 0
    assert "report.md" in capsys.readouterr().out
    assert main(["report", str(run)]) == 0
    assert main(["report", str(tmp_path / "nope")]) == 2
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "not a run directory" in capsys.readouterr().err
