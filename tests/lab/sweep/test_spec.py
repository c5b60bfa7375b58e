"""The sweep spec: one-line errors, overrides, names and the metric lists."""

from __future__ import annotations

import pytest

from smollab.errors import UserError
from smollab.lab.probe.spec import ProbeSpec
from smollab.lab.spec_common import override_value
from smollab.lab.sweep.spec import Distribution, SweepSpec
from smollab.lab.sweep.spec_load import load_spec
from smollab.lab.sweep.trials import trial_name
from smollab.rundir.columns import BY_COMMAND as METRIC_COLUMNS

SPEC = """\
command: pretrain
overrides: {model.preset: micro, optim.warmup_steps: 2, train: {max_steps: 20}}
space:
  optim.lr: [1e-4, 1e-3, 1e-2]
metric: {name: val_loss, goal: min}
concurrency: 2
"""


@pytest.fixture
def spec_file(tmp_path):
    p = tmp_path / "lr.yaml"
    p.write_text(SPEC)
    return p


def test_loads_with_numbers_flattened_keys_and_default_dir(spec_file):
    spec = load_spec(spec_file)
    assert spec.space == {"optim.lr": [1e-4, 1e-3, 1e-2]}  # 1e-4 without a dot is a number
    assert spec.overrides == {
        "model.preset": "micro",
        "optim.warmup_steps": 2,
        "train.max_steps": 20,
    }
    assert spec.dir == "sweeps/lr" and spec.total_runs() == 3 and spec.sampler == "grid"


def test_overrides_on_the_spec(spec_file):
    spec = load_spec(
        spec_file,
        [
            "dir=/tmp/x",
            "concurrency=4",
            "space.optim.lr=[1e-3,3e-3]",
            "overrides.train.max_steps=5",
            "seeds=[0,1]",
        ],
    )
    assert spec.dir == "/tmp/x" and spec.concurrency == 4
    assert spec.space["optim.lr"] == [1e-3, 3e-3] and spec.overrides["train.max_steps"] == 5
    assert spec.total_runs() == 4


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["samplr=tpe"], "unknown sweep key samplr (did you mean sampler?)"),
        (
            ["sampler=bogus"],
            "sweep key sampler: Input should be 'grid', 'random', 'qmc', 'tpe' or 'pbt'",
        ),
        (
            ["space.optim.lrr=[1,2]"],
            "space.optim.lrr: unknown pretrain config key (did you mean optim.lr?)",
        ),
        (["metric.name=val_los"], "pretrain logs no metric 'val_los' (did you mean val_loss?)"),
        (["metric.goal=minimize"], "sweep key metric.goal: Input should be 'min' or 'max'"),
        (["command=pretrian"], "unknown command 'pretrian' (did you mean pretrain?)"),
        (
            ["space.optim.lr={low: 1e-4, high: 1e-2, log: true}"],
            "sampler grid needs a list of values",
        ),
        (["sampler=tpe"], "sampler tpe needs n_trials"),
        (["n_trials=3"], "the grid sampler runs every point (3 here)"),
        (["space.optim.lr=[]"], "space.optim.lr: empty list of values"),
        (
            ["space.optim.lr=[-1, 1e-3]"],
            "sweep trial {optim.lr=-1}: config key optim.lr: Input should be greater than 0",
        ),
        (["space.run.seed=[1,2]"], "space.run.seed: set by the sweep"),
        (["pruner.type=asha"], "asha needs an explicit min_resource"),
        (["pruner.type=threshold"], "threshold needs lower or upper"),
        (["pruner.metric=reward_mean"], "pretrain logs no metric 'reward_mean'"),
        (["concurrency=0"], "concurrency: at least 1"),
        (["seeds=[1,1]"], "repeated seeds"),
        (
            ["sampler=random", "n_trials=2", "space.optim.lr={low: 1e-2, high: 1e-4}"],
            "low (0.01) must be below high",
        ),
        (
            ["sampler=random", "n_trials=2", "space.optim.lr={low: 0, high: 1, log: true}"],
            "log: true needs low > 0",
        ),
        (
            ["sampler=random", "n_trials=2", "space.optim.lr={low: 1e-4, hgh: 1}"],
            "unknown sweep key space.optim.lr.hgh (did you mean space.optim.lr.high?)",
        ),
        (
            ["sampler=random", "n_trials=2", "enqueue=[{optim.beta1: 0.9}]"],
            "enqueue.0.optim.beta1: not a key of space",
        ),
        (["overrides.optim.lr=1e-3"], "overrides.optim.lr: also swept in space"),
        (["base=nope.yaml"], "sweep key base: file not found: nope.yaml"),
        (
            ["overrides=[train.max_steps, 5]"],
            "sweep key overrides: expected a mapping of config keys (train.max_steps: 50), got list",
        ),
        (["overrides=[{a: 1}]"], "sweep key overrides: expected a mapping of config keys"),
        (
            ["overrides=5"],
            "sweep key overrides: expected a mapping of config keys (train.max_steps: 50), got int 5",
        ),
        (["space=[optim.lr]"], "sweep key space: expected a mapping of config keys"),
        (
            ["sampler=random", "n_trials=2", "enqueue=[0.1]"],
            "sweep key enqueue.0: expected a mapping of space keys to values, got 0.1",
        ),
        (
            ["sampler=random", "n_trials=2", "space.optim.lr={low: true, high: 1}"],
            "sweep key space.optim.lr.low: expected a number, not true or false",
        ),
        (
            ["sampler=random", "n_trials=true"],
            "sweep key n_trials: expected a number, not true or false",
        ),
        (["seeds=[0, true]"], "sweep key seeds: expected numbers, not true or false"),
        (
            ["concurrency=true"],
            "sweep key concurrency: at least 1 (trials at once, a whole number) or auto, got True",
        ),
        (["concurrency=1.5"], "sweep key concurrency: at least 1"),
        (["concurrency=many"], "sweep key concurrency: at least 1"),
        (["threads=true"], "sweep key threads: expected a number, not true or false"),
        (["metric.at_step=true"], "sweep key metric.at_step: expected a step number, got True"),
        (["metric=[val_loss]"], "sweep key metric: Input should be a valid dictionary"),
        (
            ["pruner.type=median", "pruner.n_warmup_steps=x"],
            "sweep key pruner.n_warmup_steps: Input should be a valid integer",
        ),
        (
            ["report.plots_every_s=false"],
            "sweep key report.plots_every_s: expected a number, not true or false",
        ),
        (["trial_timeout_s=0"], "sweep key trial_timeout_s: Input should be greater than 0"),
        (["stall_timeout_s=-1"], "sweep key stall_timeout_s: Input should be greater than 0"),
        (["study_name=''"], "sweep key study_name: String should have at least 1 character"),
        (
            ["storage=foo://bar"],
            "sweep key storage: unknown database scheme 'foo' in 'foo://bar'; use sqlite, postgresql or mysql",
        ),
        (["storage=not a url"], "sweep key storage: 'not a url' is not a database URL"),
        (["storage=sqlite://"], "sweep key storage: 'sqlite://' is an in-memory database"),
        (
            ["storage=sqlite:////nonexistent-dir/x.db"],
            "sweep key storage: directory not found for /nonexistent-dir/x.db",
        ),
    ],
)
def test_invalid_specs_fail_with_one_line(spec_file, overrides, message):
    with pytest.raises(UserError) as e:
        load_spec(spec_file, overrides)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "overrides: [model.preset, micro]\n",
            "sweep key overrides: expected a mapping of config keys",
        ),
        ("storage: redis://localhost\n", "sweep key storage: unknown database scheme 'redis'"),
        ("base: missing.yaml\n", "sweep key base: file not found: missing.yaml"),
        ("enqueue: 3\n", "sweep key enqueue: Input should be a valid list"),
    ],
)
def test_spec_file_mistakes_through_the_cli_leave_nothing_behind(tmp_path, capsys, text, message):
    from smollab.cli import main

    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC + f"dir: {tmp_path / 'sweep'}\n" + text)
    assert main(["sweep", str(spec)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "sweep").exists()


def test_empty_space_and_missing_file(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("command: pretrain\nspace: {}\nmetric: {name: val_loss}\n")
    with pytest.raises(UserError, match="sweep key space: empty"):
        load_spec(p)
    with pytest.raises(UserError, match="sweep spec not found"):
        load_spec(tmp_path / "nope.yaml")


def test_grpo_metrics_and_distributions(tmp_path):
    p = tmp_path / "g.yaml"
    p.write_text(
        "command: grpo\nspace:\n  grpo.beta: {low: 0.001, high: 0.1, log: true}\n"
        "sampler: tpe\nn_trials: 4\nseeds: [0, 1]\nmetric: {name: reward_mean, goal: max}\n"
        "enqueue: [{grpo.beta: 0.02}]\n"
    )
    spec = load_spec(p)
    assert isinstance(spec.space["grpo.beta"], Distribution) and spec.total_runs() == 8
    assert spec.space["grpo.beta"].optuna().log


def test_metric_names_are_the_loops_columns():
    from smollab.lab.sweep.command_names import metric_names
    from smollab.train import pretrain
    from smollab.train.grpo import run_state

    assert metric_names("pretrain") == pretrain.COLUMNS
    assert metric_names("grpo") == run_state.COLUMNS
    assert set(METRIC_COLUMNS["pretrain"]) <= set(pretrain.COLUMNS)  # the fallback lists


def test_names_and_override_values():
    assert trial_name(3, {"optim.lr": 1e-3, "grpo.beta": 0.02}, 1) == "003-lr0.001-beta0.02-s1"
    assert trial_name(0, {"optim.lr": 3e-5}, 0) == "000-lr3e-05-s0"
    from smollab.config.load import parse_override

    for v in (1e-4, 3e-2, 0.1, 7, True, None, "wsd", 1e-12):
        assert parse_override(f"k={override_value(v)}")[1] == v


def test_cli_sweep_errors_and_dry_run(spec_file, capsys):
    from smollab.cli import main

    assert main(["sweep", str(spec_file), "samplr=tpe"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean sampler?" in err
    assert main(["sweep", str(spec_file), "seeds=[0,1]", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "grid: 3 points x 2 seed(s) = 6 trials" in out and "optim.lr=0.001" in out
    assert main(["probe", str(spec_file.parent / "nope.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def _spec_float_keys(schema) -> list[str]:
    from smollab.config.describe import schema_keys

    return [k.key for k in schema_keys(schema) if k.type.startswith("float")]


SPEC_FLOATS = _spec_float_keys(SweepSpec)


@pytest.mark.parametrize("key", SPEC_FLOATS)
def test_every_float_key_of_the_spec_refuses_nan_and_infinity(spec_file, key):
    section = (  # a section without defaults: valid but for the key
        ["sampler=pbt", "pbt={population: 2, interval: 1, budget: 2, perturb: {optim.lr: [2]}}"]
        if key.startswith("pbt.")
        else []
    )
    for value in (".nan", ".inf", "-.inf"):
        with pytest.raises(UserError) as e:
            load_spec(spec_file, [*section, f"{key}={value}"])
        assert f"sweep key {key}: Input should be a finite number" in str(e.value)


def test_a_range_or_a_swept_value_refuses_nan_and_infinity(spec_file):
    with pytest.raises(UserError, match=r"space\.optim\.lr\.high: Input should be a finite"):
        load_spec(
            spec_file, ["sampler=random", "n_trials=2", "space.optim.lr={low: 0, high: .inf}"]
        )
    with pytest.raises(UserError, match=r"optim\.lr: Input should be a finite number"):
        load_spec(spec_file, ["space.optim.lr=[0.1, .nan]"])


@pytest.mark.parametrize("key", _spec_float_keys(ProbeSpec))
def test_every_float_key_of_a_probe_refuses_nan_and_infinity(key):
    from smollab.lab.probe.spec import load_probe

    for value in (".nan", ".inf"):
        with pytest.raises(UserError, match=rf"probe key {key}: Input should be a finite"):
            load_probe("pretrain-micro", [f"{key}={value}"])


def _training_recipes() -> list[tuple[str, str]]:
    from smollab.config.recipes import list_recipes

    return [(r.command, r.name) for r in list_recipes() if r.command in SCHEMA_COMMANDS]


SCHEMA_COMMANDS = ("pretrain", "grpo", "sft", "rft")


@pytest.mark.parametrize("command,recipe", _training_recipes())
def test_a_learning_rate_grid_over_any_shipped_recipe_runs_as_written(command, recipe, tmp_path):
    """From far below to far above the recipe's LR: every point validates, because the recipes
    end their schedules at a fraction of the LR (`optim.min_lr_ratio`), not at a fixed LR."""
    spec = tmp_path / "lr.yaml"
    spec.write_text(
        f"command: {command}\nbase: {recipe}\nmetric: {{name: step, goal: min}}\n"
        "space: {optim.lr: [1.0e-7, 3.0e-4, 3.0e-2, 30.0]}\n"
    )
    assert len(load_spec(spec, [f"dir={tmp_path / 's'}"]).grid_points()) == 4


def test_a_grid_that_still_conflicts_is_refused_before_any_trial_naming_both_keys(
    spec_file, tmp_path
):
    with pytest.raises(UserError) as e:
        load_spec(spec_file, ["overrides.optim.min_lr=5e-4", f"dir={tmp_path / 's'}"])
    assert "optim.min_lr=0.0005 is above optim.lr=0.0001" in str(e.value)
    assert "optim.min_lr_ratio" in str(e.value)
    assert not (tmp_path / "s").exists()
