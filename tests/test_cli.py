import subprocess
import sys

from smollab.cli import build_parser, main


def test_help_lists_every_command(capsys):
    parser = build_parser()
    text = parser.format_help()
    for name in ("data", "pretrain", "grpo", "sample", "models", "config"):
        assert name in text


def test_models_shows_the_family(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for count in ("1,245,824", "5,374,208", "11,015,040", "29,627,904", "35,133,952"):
        assert count in out
    assert "cs336-17m" in out and "gpt2-124m" in out and "micro" in out


def test_config_show_resolves_overrides(capsys, tmp_path):
    f = tmp_path / "g.yaml"
    f.write_text("grpo:\n  beta: 0.05\n")
    assert main(["config", "show", str(f), "optim.lr=0.5"]) == 0
    out = capsys.readouterr().out
    assert "beta: 0.05" in out and "lr: 0.5" in out and "num_generations: 16" in out


def test_user_errors_exit_2_with_one_line(capsys, tmp_path):
    assert main(["pretrain", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config file not found" in err
    assert main(["config", "show", "optim.lrr=1"]) == 2
    assert "did you mean optim.lr" in capsys.readouterr().err
    assert main(["grpo", "train.batch_size=30"]) == 2
    assert "multiple of grpo.num_generations" in capsys.readouterr().err


def test_entry_point_runs_as_module():
    out = subprocess.run(
        [sys.executable, "-m", "smollab", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "pretrain" in out.stdout
