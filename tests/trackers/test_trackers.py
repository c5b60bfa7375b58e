"""run.report_to: each tracker logs a micro run, read back with the tracker's own reader; the metric
names, steps and values must equal metrics.csv (the source of truth)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from smollab.config.load import load_config
from smollab.errors import UserError
from smollab.rundir.runs import RunView


def csv_series(run: Path) -> dict[str, dict[int, float]]:
    """metrics.csv as {column: {step: value}}, empty cells left out."""
    out: dict[str, dict[int, float]] = {}
    for row in RunView(run).metrics():
        for k, v in row.items():
            if k != "step" and v is not None:
                out.setdefault(k, {})[int(row["step"])] = v
    return out


def pretrain(overrides: list[str]) -> dict:
    from smollab.train.pretrain import train

    return train(load_config("pretrain", None, overrides))


def crash_at(monkeypatch, args: list[str], call: int) -> None:
    """Run pretrain with its `call`-th batch raising: the run fails (a checkpoint at step 10 and
    rows up to 15 when `call` is 18)."""
    from smollab.errors import RunFailed
    from smollab.train import pretrain as loop

    real, calls = loop.get_batch, {"n": 0}

    def crashing(*a, **k):
        calls["n"] += 1
        if calls["n"] == call:
            raise RuntimeError("simulated crash")
        return real(*a, **k)

    with monkeypatch.context() as m:
        m.setattr(loop, "get_batch", crashing)
        with pytest.raises(RunFailed):
            pretrain(args)


# ---- TensorBoard: tensorboard's EventAccumulator -------------------------------------------


def tb_series(logdir: Path) -> tuple[dict[str, dict[int, float]], object]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    series = {t: {e.step: e.value for e in acc.Scalars(t)} for t in acc.Tags()["scalars"]}
    return series, acc


def as_float32(series: dict[str, dict[int, float]]) -> dict[str, dict[int, float]]:
    """TensorBoard keeps scalars as float32."""
    return {k: {s: float(np.float32(v)) for s, v in d.items()} for k, d in series.items()}


def test_tensorboard_pretrain_equals_metrics_csv(micro_pretrain, tmp_path):
    pytest.importorskip("tensorboard")
    summary = pretrain([*micro_pretrain, "run.report_to=tensorboard"])
    run = tmp_path / "run"
    series, acc = tb_series(run / "tb")
    logged = {k: v for k, v in series.items() if not k.startswith("summary/")}
    assert as_float32(csv_series(run)) == logged
    assert set(logged) >= {"train_loss", "val_loss", "lr", "tokens"}
    assert series["summary/final_val_loss"] == {20: pytest.approx(summary["final_val_loss"])}
    config = acc.Tensors("config/text_summary")[0]
    assert b'"lr": 0.01' in config.tensor_proto.string_val[0]


def test_tensorboard_after_a_crash_and_resume_equals_metrics_csv(
    micro_pretrain, tmp_path, monkeypatch
):
    """The crashed process logged step 15 past its step-10 checkpoint; the resumed one logs 15
    again: TensorBoard, like metrics.csv, holds each step once, the resumed value."""
    pytest.importorskip("tensorboard")
    args = [*micro_pretrain, "run.report_to=tensorboard"]
    crash_at(monkeypatch, args, 18)
    run = tmp_path / "run"
    assert sorted(tb_series(run / "tb")[0]["train_loss"]) == [1, 5, 10, 15]
    assert tb_series(run / "tb")[0]["summary/steps"] == {15: 17.0}  # the failed summary
    pretrain(args)
    series, _ = tb_series(run / "tb")
    logged = {k: v for k, v in series.items() if not k.startswith("summary/")}
    assert as_float32(csv_series(run)) == logged
    assert sorted(logged["train_loss"]) == [1, 5, 10, 15, 20]
    assert series["summary/steps"] == {20: 20.0}


def test_tensorboard_resume_that_fails_before_a_row_keeps_the_earlier_events(
    micro_pretrain, tmp_path, monkeypatch
):
    """A resumed attempt that dies before its first row purges nothing: the events the earlier
    attempt logged stay readable (a purge from step 0 would hide them all)."""
    pytest.importorskip("tensorboard")
    args = [*micro_pretrain, "run.report_to=tensorboard"]
    crash_at(monkeypatch, args, 18)
    crash_at(monkeypatch, args, 1)  # resumed from step 10, fails before logging
    series, _ = tb_series(tmp_path / "run" / "tb")
    assert sorted(series["train_loss"]) == [1, 5, 10, 15]
    assert sorted(series["val_loss"]) == [10]
    pretrain(args)  # the next resume still purges past its checkpoint
    series, _ = tb_series(tmp_path / "run" / "tb")
    logged = {k: v for k, v in series.items() if not k.startswith("summary/")}
    assert as_float32(csv_series(tmp_path / "run")) == logged


def test_tensorboard_grpo_equals_metrics_csv(micro_grpo, tmp_path):
    pytest.importorskip("tensorboard")
    from smollab.train.grpo.run import train

    train(load_config("grpo", None, [*micro_grpo, "run.report_to=[tensorboard]"]))
    run = tmp_path / "grpo"
    series, _ = tb_series(run / "tb")
    logged = {k: v for k, v in series.items() if not k.startswith("summary/")}
    assert as_float32(csv_series(run)) == logged
    assert {"reward_mean", "kl", "eval_reward_mean"} <= set(logged)


# ---- W&B: the offline run's .wandb file, parsed into wandb's own Record protos ------------


def wandb_records(path: Path):
    """The records of a .wandb file: W&B's 7-byte header, then LevelDB log blocks of 32 KiB
    (7-byte chunk headers: crc, length, type 1 full / 2 first / 3 middle / 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        buf += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            buf = b""
            yield record


def key(item) -> str:
    """A W&B record item's name: `key`, or its `nested_key` path."""
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_equals_metrics_csv(micro_pretrain, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    summary = pretrain([*micro_pretrain, "run.report_to=wandb", "run.group=sweep-x"])
    run = tmp_path / "run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
    [file] = (run / "wandb").glob("offline-run-*/run-*.wandb")
    series: dict[str, dict[int, float]] = {}
    final: dict[str, object] = {}
    info = None
    for r in wandb_records(file):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            step = r.history.step.num
            for item in r.history.item:
                if not key(item).startswith("_"):
                    series.setdefault(key(item), {})[step] = json.loads(item.value_json)
        elif kind == "summary":
            final.update({key(i): json.loads(i.value_json) for i in r.summary.update})
        elif kind == "run":
            info = r.run
    assert csv_series(run) == series
    assert info.run_id == summary["wandb_run_id"] and info.run_group == "sweep-x"
    assert info.display_name == "run"
    config = {key(i): json.loads(i.value_json) for i in info.config.update}
    assert config["optim"]["lr"] == 0.01 and config["run"]["group"] == "sweep-x"
    assert final["status"] == "completed"
    assert final["final_val_loss"] == pytest.approx(summary["final_val_loss"])


def wandb_attempt(file: Path) -> tuple[object, dict[str, dict[int, float]]]:
    """An offline W&B run file's run record and its logged series. The run record can reach the
    file a moment after `finish()` returns (W&B's service process writes it; seen under load),
    so a file without one is read again for up to 30 s before the test fails on it."""
    deadline = time.time() + 30
    while True:
        info, series = _wandb_attempt(file)
        if info is not None or time.time() > deadline:
            return info, series
        time.sleep(0.5)


def _wandb_attempt(file: Path) -> tuple[object, dict[str, dict[int, float]]]:
    info, series = None, {}
    for r in wandb_records(file):
        kind = r.WhichOneof("record_type")
        if kind == "history":
            for item in r.history.item:
                if not key(item).startswith("_"):
                    series.setdefault(key(item), {})[r.history.step.num] = json.loads(
                        item.value_json
                    )
        elif kind == "run":
            info = r.run
    return info, series


def test_wandb_resume_is_a_new_run_holding_the_steps_it_logged(
    micro_pretrain, tmp_path, monkeypatch
):
    """W&B ignores steps at or below a run's last: a resumed attempt (from the step-10 checkpoint,
    after a crash past step 15) is a run of its own, `run-resume10`, in the same group."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    args = [*micro_pretrain, "run.report_to=wandb", "run.group=g"]
    crash_at(monkeypatch, args, 18)
    summary = pretrain(args)
    run = tmp_path / "run"
    files = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))
    attempts = {info.display_name: (info, series) for info, series in map(wandb_attempt, files)}
    assert sorted(attempts) == ["run", "run-resume10"]
    (first, dead), (second, resumed) = attempts["run"], attempts["run-resume10"]
    assert [first.run_id, second.run_id] == summary["wandb_run_ids"]
    assert second.run_id == summary["wandb_run_id"] != first.run_id
    assert first.run_group == second.run_group == "g"
    csv = csv_series(run)
    assert sorted(dead["train_loss"]) == [1, 5, 10, 15]
    assert {k: {s: v for s, v in d.items() if s <= 10} for k, d in dead.items()} == {
        k: {s: v for s, v in d.items() if s <= 10} for k, d in csv.items()
    }
    assert resumed == {k: {s: v for s, v in d.items() if s > 10} for k, d in csv.items()}


# ---- Trackio: its local SQLite store, through trackio's own storage API --------------------

TRACKIO_RUN = """
import json, sys
from smollab.config.load import load_config
from smollab.train.pretrain import train
train(load_config("pretrain", None, json.loads(sys.argv[1])))
from trackio.sqlite_storage import SQLiteStorage
logs = SQLiteStorage.get_logs("smollab", "run")
print("LOGS=" + json.dumps(logs, default=str))
print("CONFIG=" + json.dumps(SQLiteStorage.get_run_config("smollab", "run"), default=str))
"""


def test_trackio_equals_metrics_csv(micro_pretrain, tmp_path):
    pytest.importorskip("trackio")
    # TRACKIO_DIR is read when trackio is imported: a child process gets a store of its own.
    env = {
        **os.environ,
        "TRACKIO_DIR": str(tmp_path / "trackio"),
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[2] / "src"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    overrides = [*micro_pretrain, "run.report_to=trackio", "run.group=sweep-x"]
    out = subprocess.run(
        [sys.executable, "-c", TRACKIO_RUN, json.dumps(overrides)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = dict(
        x.split("=", 1) for x in out.stdout.splitlines() if x.startswith(("LOGS=", "CONFIG="))
    )
    logs, config = json.loads(lines["LOGS"]), json.loads(lines["CONFIG"])
    series: dict[str, dict[int, float]] = {}
    final: dict[str, float] = {}
    for entry in logs:
        for k, v in entry.items():
            if k.startswith("summary/"):
                final[k] = v
            elif k not in ("step", "timestamp") and not k.startswith("_") and v is not None:
                series.setdefault(k, {})[entry["step"]] = v
    run = tmp_path / "run"
    assert csv_series(run) == series
    assert config["optim"]["lr"] == 0.01 and config["_Group"] == "sweep-x"
    summary = RunView(run).summary()
    assert final["summary/final_val_loss"] == pytest.approx(summary["final_val_loss"])
    assert (tmp_path / "trackio" / "smollab.db").exists()


# ---- the rules around them -----------------------------------------------------------------


def test_report_to_spellings():
    assert load_config("pretrain", None, ["run.report_to=none"]).run.report_to == []
    cfg = load_config("pretrain", None, ["run.report_to=tensorboard,wandb"])
    assert cfg.run.report_to == ["tensorboard", "wandb"]
    with pytest.raises(UserError, match="run.report_to"):
        load_config("pretrain", None, ["run.report_to=[none,wandb]"])
    with pytest.raises(UserError, match="run.report_to"):
        load_config("pretrain", None, ["run.report_to=mlflow"])


def test_missing_package_is_one_line_before_any_work(micro_pretrain, tmp_path, monkeypatch):
    """Refused when the config is read: no data prepared, no model built, no run directory; a
    sweep whose overrides name the tracker fails once, in the parent, before any trial."""
    import importlib.util

    import yaml

    from smollab.lab.sweep.spec_load import load_spec

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    line = "run.report_to wandb: the wandb package is not installed; pip install 'smollab[wandb]'"
    fresh = [x for x in micro_pretrain if not x.startswith("data.dir=")]
    fresh.append(f"data.dir={tmp_path / 'data'}")  # not prepared: preparing it would be work
    with pytest.raises(UserError) as e:
        pretrain([*fresh, "run.report_to=[tensorboard,wandb]"])
    assert str(e.value) == f"config: {line}"
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            dict(
                command="pretrain",
                overrides={"model.preset": "micro", "run.report_to": ["wandb"]},
                space={"optim.lr": [1e-2, 3e-3]},
                metric={"name": "val_loss", "goal": "min"},
                dir=str(tmp_path / "sweep"),
            )
        )
    )
    with pytest.raises(UserError, match=line.replace("[", r"\[").replace("]", r"\]")):
        load_spec(spec)
    assert not (tmp_path / "sweep").exists()


def test_tracker_error_keeps_every_csv_row(micro_pretrain, tmp_path, monkeypatch):
    """A tracker that fails mid-run is logged once and dropped; the run and its CSV go on."""
    from smollab.trackers import fanout

    class Flaky:
        rows = 0

        def row(self, row):
            Flaky.rows += 1
            if Flaky.rows == 2:
                raise ConnectionError("upload refused")

        def close(self, summary):
            raise AssertionError("a dropped tracker is not closed")

    pytest.importorskip("tensorboard")  # run.report_to=tensorboard needs it installed
    monkeypatch.setattr(fanout, "_open", lambda *a: Flaky())
    summary = pretrain([*micro_pretrain, "run.report_to=tensorboard"])
    run = RunView(tmp_path / "run")
    assert summary["status"] == "completed" and Flaky.rows == 2
    assert [r["step"] for r in run.metrics()] == [1, 5, 10, 15, 20]
    assert run.summary()["tracker_errors"] == {"tensorboard": "ConnectionError: upload refused"}
    assert sum("tracker tensorboard failed" in x for x in run.log_lines()) == 1


# ---- a sweep: each trial its own tracker run, grouped by the study ---------------------------


def test_sweep_trials_log_as_runs_grouped_by_the_study(micro_pretrain, tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    import yaml

    from smollab.lab.sweep.scheduler import run_sweep
    from smollab.lab.sweep.spec_load import load_spec
    from smollab.lab.sweep.study import open_study

    monkeypatch.setenv("WANDB_MODE", "offline")  # the children inherit it
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    overrides = {
        k: yaml.safe_load(v)
        for k, v in (x.split("=", 1) for x in micro_pretrain)
        if k not in ("run.dir", "optim.lr")
    }
    overrides.update({"train.max_steps": 10, "run.report_to": ["tensorboard", "wandb"]})
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(
        yaml.safe_dump(
            dict(
                command="pretrain",
                overrides=overrides,
                space={"optim.lr": [1e-2, 3e-3]},
                metric={"name": "val_loss", "goal": "min"},
                concurrency=2,
                dir=str(tmp_path / "sweep"),
            )
        )
    )
    assert run_sweep(load_spec(spec_path)) == {"completed": 2}
    study = open_study(load_spec(spec_path), tmp_path / "sweep").study_name
    trials = sorted((tmp_path / "sweep" / "trials").iterdir())
    assert len(trials) == 2
    for trial in trials:
        series, _ = tb_series(trial / "tb")
        logged = {k: v for k, v in series.items() if not k.startswith("summary/")}
        assert as_float32(csv_series(trial)) == logged
        [file] = (trial / "wandb").glob("offline-run-*/run-*.wandb")
        [info] = [r.run for r in wandb_records(file) if r.WhichOneof("record_type") == "run"]
        assert (info.run_group, info.display_name) == (study, trial.name)
