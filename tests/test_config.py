import pytest

from smollab.config import flatten, load_config, parse_override, to_dict
from smollab.errors import UserError


def test_defaults_yaml_cli_precedence(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  lr: 0.01\n  min_lr: 0.001\ntrain:\n  max_steps: 7\n")
    cfg = load_config("pretrain", f, ["optim.lr=3e-4", "run.dir=x"])
    assert cfg.optim.lr == 3e-4  # CLI beats YAML
    assert cfg.optim.min_lr == 0.001  # YAML beats default
    assert cfg.train.max_steps == 7
    assert cfg.train.batch_size == 32  # default
    assert cfg.run.dir == "x"


def test_override_values_are_typed():
    assert parse_override("optim.lr=3e-4") == ("optim.lr", 3e-4)
    assert parse_override("train.max_steps=10") == ("train.max_steps", 10)
    assert parse_override("model.lora.targets=[q,v]") == ("model.lora.targets", ["q", "v"])
    assert parse_override("perf.compile=true") == ("perf.compile", True)
    assert parse_override("run.name=abc") == ("run.name", "abc")


def test_flatten_round_trip():
    cfg = load_config("pretrain", None, ["optim.lr=0.5"])
    flat = flatten(to_dict(cfg))
    assert flat["optim.lr"] == 0.5
    assert "model.lora.r" in flat


BAD = [
    (["optim.lrr=1"], "unknown config key optim.lrr (did you mean optim.lr?)"),
    (["trian.max_steps=1"], "unknown config key trian (did you mean train?)"),
    (["optim.lr=fast"], "optim.lr"),
    (["optim.lr=-1"], "optim.lr"),
    (["train.max_steps=0"], "train.max_steps"),
    (["perf.device=tpu"], "perf.device"),
    (["perf.precision=fp8"], "perf.precision"),
    (["optim.schedule=linear"], "optim.schedule"),
    (["train.batch_size=1.5"], "train.batch_size"),
    (["model.lora.targets=[q,zz]"], "model.lora.targets"),
    (["model.preset=null"], "model.preset or model.path"),
    (["optim=3"], "optim"),
    (["optim.lr.x=3"], "config key optim.lr: Input should be a valid number"),
    (["noequals"], "expected key=value"),
    (["run.resume=sometimes"], "run.resume"),
    (["data.test_fraction=0.9"], "data.test_fraction"),
]


@pytest.mark.parametrize("overrides,needle", BAD)
def test_bad_overrides_one_clear_line(overrides, needle):
    with pytest.raises(UserError) as e:
        load_config("pretrain", None, overrides)
    msg = str(e.value)
    assert needle in msg
    assert "\n" not in msg


def test_bad_files(tmp_path):
    with pytest.raises(UserError, match="config file not found"):
        load_config("pretrain", tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: [1,\n")
    with pytest.raises(UserError, match="invalid YAML"):
        load_config("pretrain", bad)
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(UserError, match="expected a mapping"):
        load_config("pretrain", listy)
    typo = tmp_path / "typo.yaml"
    typo.write_text("optim:\n  learning_rate: 1\n")
    with pytest.raises(UserError, match="unknown config key optim.learning_rate"):
        load_config("pretrain", typo)


def test_recipes_in_repo_validate():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "configs" / "pretrain"
    for recipe in root.glob("*.yaml"):
        assert recipe.read_text().startswith("# smollab "), f"{recipe} lacks its command header"
        load_config("pretrain", recipe)


def test_grpo_recipes_validate():
    from pathlib import Path

    from smollab.rewards.registry import validate_specs

    root = Path(__file__).resolve().parents[1] / "configs" / "grpo"
    for recipe in root.glob("*.yaml"):
        assert recipe.read_text().startswith("# smollab grpo "), recipe
        validate_specs(load_config("grpo", recipe).reward)
