import csv
import errno
import json
import os
from pathlib import Path

import pytest

from smollab.errors import UserError
from smollab.runs import (
    CheckpointError,
    RunDir,
    atomic_write,
    atomic_write_json,
    read_metrics,
    writing,
)


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

    torch.save({"x": Evil()}, tmp_path / "trainer_state.pt", pickle_module=pickle)
    with pytest.raises(CheckpointError) as e:
        load_trainer_state(tmp_path)
    msg = str(e.value)
    assert "trainer_state.pt: unreadable" in msg and "GLOBAL print" in msg
    assert "\n" not in msg and "weights_only=False" not in msg
    (tmp_path / "trainer_state.pt").write_bytes(b"not a zip")
    with pytest.raises(CheckpointError, match="trainer_state.pt: unreadable"):
        load_trainer_state(tmp_path)


def test_summary_atomic_and_status_checked(tmp_path):
    run = RunDir.start(tmp_path, {}, "auto", "pretrain")
    run.update_summary(status="completed", steps=3)
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 3
    with pytest.raises(ValueError):
        run.update_summary(status="exploded")
    atomic_write_json(tmp_path / "x.json", {"k": 1})
    assert not list(tmp_path.glob(".*tmp*"))


def test_resume_cuts_every_append_only_file_and_drops_lines_cut_short(tmp_path):
    run = RunDir.start(tmp_path, {}, "auto", "grpo")
    run.open_metrics(["step", "loss"], resume_step=None)
    for s in range(1, 6):
        run.metrics.append({"step": s, "loss": 0.5})
        run.append_samples([{"step": s, "completion": f"c{s}"}])
    run.close()
    with open(tmp_path / "metrics.csv", "a") as f:
        f.write("1")  # step 17's row, cut by a kill after its first digit
    with open(tmp_path / "samples.jsonl", "a") as f:
        f.write('{"step": 1, "compl')
    run.open_metrics(["step", "loss"], resume_step=3)
    run.metrics.append({"step": 4, "loss": 0.1})
    run.append_samples([{"step": 4, "completion": "again"}])
    run.close()
    assert [int(r["step"]) for r in read_metrics(tmp_path / "metrics.csv")] == [1, 2, 3, 4]
    samples = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["completion"]) for r in samples] == [
        (1, "c1"), (2, "c2"), (3, "c3"), (4, "again")
    ]  # fmt: skip
    run.open_metrics(["step", "loss"], resume_step=None)  # a fresh start empties both
    run.close()
    assert read_metrics(tmp_path / "metrics.csv") == []
    assert (tmp_path / "samples.jsonl").read_text() == ""
    assert not list(tmp_path.glob(".*"))


def _micro_model():
    from transformers import AutoModelForCausalLM

    from smollab.models.presets import preset_config

    return AutoModelForCausalLM.from_config(preset_config("micro"))


def test_a_failed_checkpoint_write_leaves_the_old_one_and_no_temp(tmp_path):
    run = RunDir.start(tmp_path, {}, "auto", "pretrain")
    run.save_checkpoint("best", _micro_model())

    class HalfWritten:
        def save_pretrained(self, d, **kwargs):
            Path(d).mkdir()
            (Path(d) / "model.safetensors").write_bytes(b"half")
            raise RuntimeError("IoError(Os { code: 28, kind: StorageFull })")

    with pytest.raises(OSError) as e:
        run.save_checkpoint("best", HalfWritten())
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(run.ckpt_dir / "best")
    assert (run.ckpt_dir / "best" / "model.safetensors").stat().st_size > 4
    assert not list(run.ckpt_dir.glob(".*"))


def test_keep_last_prunes_only_up_to_the_step_saved(tmp_path):
    model = _micro_model()
    run = RunDir.start(tmp_path, {}, "auto", "pretrain")
    for step in (3, 9, 6):  # step_9 is left by an attempt that resumed from step_3
        run.save_checkpoint(f"step_{step}", model, state={"step": step}, keep_last=1)
    assert [p.name for p in run.step_checkpoints()] == ["step_6", "step_9"]


def test_leftovers_of_a_killed_writer_are_ignored_then_cleaned(tmp_path):
    run = RunDir.start(tmp_path, {}, "auto", "pretrain")
    ckpts = run.ckpt_dir
    for name in (".step_4.tmp", ".step_2.old", ".best.old", ".final.old", "final", "step_3"):
        (ckpts / name).mkdir(parents=True)
    (ckpts / ".best.old" / "f").write_text("the best before")
    (ckpts / "step_3" / "trainer_state.pt").write_bytes(b"")
    dead, mine = (
        tmp_path / ".summary.json.tmp999999999",
        tmp_path / f".config.json.tmp{os.getpid()}",
    )
    dead.write_text("{")
    mine.write_text("{")
    assert run.latest_checkpoint().name == "step_3"  # hidden names are never checkpoints
    done = run.clean_leftovers()
    assert "restored best" in done and "removed .step_4.tmp" in done
    assert sorted(p.name for p in ckpts.iterdir()) == ["best", "final", "step_3"]
    assert (ckpts / "best" / "f").read_text() == "the best before"
    assert not dead.exists() and mine.exists()  # a live writer's temp file is its own


@pytest.mark.skipif(not Path("/dev/full").is_char_device(), reason="needs /dev/full")
def test_a_full_disk_names_the_file_meant_and_leaves_no_temp(tmp_path):
    target = tmp_path / "samples.jsonl"
    with pytest.raises(OSError) as e, writing(target), open("/dev/full", "w") as f:
        f.write("x")
        f.flush()
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(target)
    (tmp_path / "s.json").write_text("old")

    def half(f):
        f.write("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="s.json"):
        atomic_write(tmp_path / "s.json", half)
    assert (tmp_path / "s.json").read_text() == "old" and not list(tmp_path.glob(".*"))
