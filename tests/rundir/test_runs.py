import csv
import errno
import json
import os
from pathlib import Path

import pytest

from smollab.errors import UserError
from smollab.rundir.atomic import atomic_write, atomic_write_json, writing
from smollab.rundir.rows import read_metrics
from smollab.rundir.writer import CheckpointError, RunDir


def test_start_writes_config_and_log(tmp_path):
    run = RunDir.start(tmp_path / "r", {"a": 1}, "auto", "pretrain")
    run.update_summary(status="running")
    run.close()
    assert json.loads((tmp_path / "r" / "config.json").read_text()) == {"a": 1}
    log = (tmp_path / "r" / "training.log").read_text()
    assert "versions" in log and "torch=" in log


def _cfg(*overrides):
    from smollab.config.load import load_config, to_dict

    return to_dict(load_config("pretrain", None, ["optim.warmup_steps=0", *overrides]))


def _finished_run(path, config, status="completed"):
    run = RunDir.start(path, config, "auto", "pretrain")
    run.update_summary(status=status)
    run.close()


def test_a_changed_config_is_refused_naming_the_keys(tmp_path):
    _finished_run(tmp_path / "r", _cfg("run.dir=r"))
    new = _cfg(
        "run.dir=r",
        "optim.lr=3e-3",
        "train.max_steps=900",
        "train.batch_size=8",
        "perf.precision=bf16",
    )
    with pytest.raises(UserError) as e:
        RunDir.start(tmp_path / "r", new, "auto", "pretrain")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"run.dir {tmp_path / 'r'} holds a run")
    assert "optim.lr 0.001 -> 0.003" in msg and "train.max_steps 1000 -> 900" in msg
    assert "and 1 more" in msg  # the first three keys are named
    assert "a new run.dir" in msg and "run.resume=never" in msg
    # nothing of the old run was touched
    assert json.loads((tmp_path / "r" / "config.json").read_text())["optim"]["lr"] == 1e-3


def test_the_same_config_reuses_a_finished_run_and_resumes_an_open_one(tmp_path):
    cfg = _cfg("run.dir=r")
    _finished_run(tmp_path / "done", cfg)
    again = RunDir.start(tmp_path / "done", cfg, "auto", "pretrain")
    assert again.already_done and again.read_summary()["status"] == "completed"
    again.close()
    _finished_run(tmp_path / "open", cfg, status="interrupted")
    again = RunDir.start(tmp_path / "open", cfg, "auto", "pretrain")
    assert not again.already_done
    again.close()


def test_keys_free_on_rerun_and_keys_from_other_versions(tmp_path):
    from smollab.rundir.writer import config_changes

    old = _cfg("run.dir=a")
    # how to open the run, where it is and how many threads it gets are not the run
    assert (
        config_changes(old, _cfg("run.dir=./a", "run.resume=never", "perf.threads=3"), "pretrain")
        == []
    )
    # a key the old config lacks counts as its default; a key removed since is not compared
    older = json.loads(json.dumps(old))
    del older["train"]["keep_last"]
    older["perf"]["num_workers"] = 0
    assert config_changes(older, old, "pretrain") == []
    assert config_changes(older, _cfg("train.keep_last=3"), "pretrain") == [
        "train.keep_last 2 -> 3"
    ]


def test_resume_never_starts_over_and_removes_only_the_run(tmp_path):
    from smollab.rundir.runs import CHILD_LOG, RUN_FILES

    d = tmp_path / "r"
    _finished_run(d, _cfg())
    for name in ("metrics.csv", "samples.jsonl", "report.md", CHILD_LOG, "notes.txt"):
        (d / name).write_text("x")
    for name in ("checkpoints/final", "plots"):
        (d / name).mkdir(parents=True)
    run = RunDir.start(d, _cfg("optim.lr=0.5"), "never", "pretrain")
    assert not run.already_done and run.resume_from is None
    run.close()
    left = {p.name for p in d.iterdir()}
    assert left == {"config.json", "training.log", CHILD_LOG, "notes.txt"}  # new config and log
    assert set(RUN_FILES) >= {
        "config.json",
        "metrics.csv",
        "summary.json",
        "samples.jsonl",
        "training.log",
        "checkpoints",
        "plots",
        "report.md",
    }
    assert json.loads((d / "config.json").read_text())["optim"]["lr"] == 0.5
    assert (d / "training.log").read_text().count("versions") == 1  # the old log went too
    # a directory that holds no run: nothing is removed
    other = tmp_path / "plain"
    other.mkdir()
    (other / "plots").mkdir()
    RunDir.start(other, _cfg(), "never", "pretrain").close()
    assert (other / "plots").is_dir()


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
    from smollab.rundir.writer import load_trainer_state

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

    from smollab.rundir.writer import load_trainer_state

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
        (1, "c1"),
        (2, "c2"),
        (3, "c3"),
        (4, "again"),
    ]
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
