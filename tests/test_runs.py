import csv
import json

import pytest

from smollab.errors import UserError
from smollab.runs import RunDir, atomic_write_json, read_metrics


def test_start_writes_config_log_and_refuses_overwrite(tmp_path):
    run = RunDir.start(tmp_path / "r", {"a": 1}, "auto", "pretrain")
    run.update_summary(status="running")
    run.close()
    assert json.loads((tmp_path / "r" / "config.json").read_text()) == {"a": 1}
    log = (tmp_path / "r" / "training.log").read_text()
    assert "versions" in log and "torch=" in log
    with pytest.raises(UserError, match="already holds a run"):
        RunDir.start(tmp_path / "r", {"a": 1}, "never", "pretrain")


def test_metrics_resume_drops_rows_after_checkpoint(tmp_path):
    run = RunDir.start(tmp_path, {}, "auto", "pretrain")
    m = run.open_metrics(["step", "loss"], resume_step=None)
    for s in range(1, 6):
        m.append({"step": s, "loss": 1.0 / s})
    m.close()
    m = run.open_metrics(["step", "loss"], resume_step=3)
    for s in range(4, 7):
        m.append({"step": s, "loss": 0.0})
    m.close()
    steps = [int(r["step"]) for r in read_metrics(tmp_path / "metrics.csv")]
    assert steps == [1, 2, 3, 4, 5, 6]
    with open(tmp_path / "metrics.csv") as f:
        assert next(csv.reader(f)) == ["step", "loss"]


def test_checkpoints_atomic_keep_last_and_state(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from smollab.models.presets import preset_config
    from smollab.runs import load_trainer_state

    model = AutoModelForCausalLM.from_config(preset_config("micro"))
    run = RunDir.start(tmp_path, {}, "auto", "pretrain")
    for step in (1, 2, 3):
        run.save_checkpoint(
            f"step_{step}", model, state={"step": step, "t": torch.ones(2)}, keep_last=2
        )
    assert [p.name for p in run.step_checkpoints()] == ["step_2", "step_3"]
    assert run.latest_checkpoint().name == "step_3"
    assert (run.latest_checkpoint() / "model.safetensors").exists()
    assert load_trainer_state(run.latest_checkpoint())["step"] == 3
    assert not list(run.ckpt_dir.glob(".*"))  # no temp leftovers


def test_trainer_state_refuses_pickled_objects(tmp_path):
    import pickle

    import torch

    from smollab.runs import load_trainer_state

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    (tmp_path / "trainer_state.pt").write_bytes(b"")
    torch.save({"x": Evil()}, tmp_path / "trainer_state.pt", pickle_module=pickle)
    with pytest.raises(pickle.UnpicklingError):
        load_trainer_state(tmp_path)


def test_summary_atomic_and_status_checked(tmp_path):
    run = RunDir.start(tmp_path, {}, "auto", "pretrain")
    run.update_summary(status="completed", steps=3)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 3
    with pytest.raises(ValueError):
        run.update_summary(status="exploded")
    atomic_write_json(tmp_path / "x.json", {"k": 1})
    assert not list(tmp_path.glob(".*tmp*"))
