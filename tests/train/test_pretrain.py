import json

import pytest
import torch
from safetensors.torch import load_file

from smollab.cli import main
from smollab.config.load import load_config
from smollab.errors import RunFailed
from smollab.rundir.runs import read_metrics
from smollab.train import pretrain


def _run(overrides):
    return pretrain.train(load_config("pretrain", None, overrides))


def test_end_to_end_writes_the_run_directory(micro_pretrain, tmp_path):
    summary = _run([*micro_pretrain, "run.plots=true"])
    run = tmp_path / "run"
    assert summary["status"] == "completed" and summary["steps"] == 20
    rows = read_metrics(run / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [1, 5, 10, 15, 20]
    assert rows[-1]["val_loss"] is not None and rows[-1]["tokens_per_s"] > 0
    assert rows[-1]["train_loss"] < rows[0]["train_loss"]
    for name in ("best", "final"):
        assert (run / "checkpoints" / name / "model.safetensors").exists()
        assert (run / "checkpoints" / name / "tokenizer.json").exists()
    assert (run / "plots" / "loss_curves.png").exists()
    assert (run / "plots" / "lr_schedule.png").exists()
    assert json.loads((run / "config.json").read_text())["train"]["max_steps"] == 20
    log = (run / "training.log").read_text()
    assert "runtime: device cpu" in log and "git commit" in log
    # Running it again leaves the finished run as it is.
    assert _run(micro_pretrain)["status"] == "completed"
    assert len(read_metrics(run / "metrics.csv")) == 5


def test_resume_after_crash_is_exact(micro_pretrain, tmp_path, monkeypatch):
    ref = _run([*micro_pretrain, f"run.dir={tmp_path / 'ref'}"])
    assert ref["status"] == "completed"

    calls = {"n": 0}
    real = pretrain.get_batch

    def crash_at_step_13(*a, **k):
        calls["n"] += 1
        if calls["n"] == 13:
            raise RuntimeError("simulated crash")
        return real(*a, **k)

    monkeypatch.setattr(pretrain, "get_batch", crash_at_step_13)
    with pytest.raises(RunFailed, match="RuntimeError: simulated crash"):
        _run(micro_pretrain)
    monkeypatch.setattr(pretrain, "get_batch", real)
    resumed = _run(micro_pretrain)
    assert resumed["status"] == "completed"
    steps = [int(r["step"]) for r in read_metrics(tmp_path / "run" / "metrics.csv")]
    assert steps == [1, 5, 10, 15, 20]
    a = load_file(tmp_path / "ref" / "checkpoints" / "final" / "model.safetensors")
    b = load_file(tmp_path / "run" / "checkpoints" / "final" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)


def test_divergence_is_a_result(micro_pretrain, tmp_path):
    summary = _run(
        [
            *micro_pretrain,
            "optim.lr=50",
            "optim.warmup_steps=0",
            "optim.grad_clip=0",
            "train.log_interval=1",
            "train.diverge_factor=1.5",
        ]
    )
    assert summary["status"] == "diverged"
    assert "loss" in summary["evidence"]
    assert summary["steps"] < 20


def test_stops_on_max_tokens(micro_pretrain, tmp_path):
    summary = _run([*micro_pretrain, "train.max_tokens=1000"])
    assert summary["steps"] == 8  # 8 x 128 tokens >= 1000
    assert summary["status"] == "completed"
    assert not (tmp_path / "run" / "plots").exists()  # run.plots=false (micro_pretrain's)


def test_bad_values_stop_before_writing(micro_pretrain, tmp_path, capsys):
    assert main(["pretrain", *micro_pretrain, "train.seq_len=100000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("smollab: error: train.seq_len") and "\n" not in err
    assert not (tmp_path / "run").exists()


def test_checkpoint_names_the_tokenizers_eos(micro_pretrain, tmp_path):
    _run(micro_pretrain)
    cfg = json.loads((tmp_path / "run" / "checkpoints" / "final" / "config.json").read_text())
    tok = json.loads(
        (tmp_path / "run" / "checkpoints" / "final" / "tokenizer_config.json").read_text()
    )
    assert tok["eos_token"] == "[EOS]"
    assert cfg["eos_token_id"] == 1 and cfg["pad_token_id"] == 1 and cfg["bos_token_id"] is None
