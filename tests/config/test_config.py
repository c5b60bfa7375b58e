from pathlib import Path

import pytest

from smollab.config.load import flatten, load_config, parse_override, to_dict
from smollab.errors import UserError


def test_defaults_yaml_cli_precedence(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  lr: 0.01\n  min_lr: 0.001\ntrain:\n  max_steps: 700\n")
    cfg = load_config("pretrain", f, ["optim.lr=3e-3", "run.dir=x"])
    assert cfg.optim.lr == 3e-3  # CLI beats YAML
    assert cfg.optim.min_lr == 0.001  # YAML beats default
    assert cfg.train.max_steps == 700
    assert cfg.train.batch_size == 32  # default
    assert cfg.run.dir == "x"


def test_override_values_are_typed():
    assert parse_override("optim.lr=3e-4") == ("optim.lr", 3e-4)
    assert parse_override("train.max_steps=10") == ("train.max_steps", 10)
    assert parse_override("model.lora.targets=[q,v]") == ("model.lora.targets", ["q", "v"])
    assert parse_override("perf.compile=true") == ("perf.compile", True)
    assert parse_override("run.name=abc") == ("run.name", "abc")


def test_flatten_round_trip():
    cfg = load_config("grpo", None, ["optim.lr=0.5"])
    flat = flatten(to_dict(cfg))
    assert flat["optim.lr"] == 0.5
    assert "model.lora.r" in flat


BAD = [
    (["optim.lrr=1"], "unknown config key optim.lrr (did you mean optim.lr?)"),
    (["trian.max_steps=1"], "unknown config key trian.max_steps (did you mean train.max_steps?)"),
    (["optim.lr=fast"], "optim.lr"),
    (["optim.lr=-1"], "optim.lr"),
    (["train.max_steps=0"], "train.max_steps"),
    (["perf.device=tpu"], "perf.device"),
    (["perf.precision=fp8"], "perf.precision"),
    (["optim.schedule=linear"], "optim.schedule"),
    (["train.batch_size=1.5"], "train.batch_size"),
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


def _float_keys(command: str) -> list[str]:
    from smollab.config.describe import schema_keys
    from smollab.config.registry import SCHEMAS

    return [k.key for k in schema_keys(SCHEMAS[command]) if k.type.startswith("float")]


NON_FINITE = [
    (command, key)
    for command in ("pretrain", "grpo", "sft", "rft", "data")
    for key in _float_keys(command)
    if "[]" not in key  # a list item's key: the reward weight, below
]


@pytest.mark.parametrize("command,key", NON_FINITE, ids=[f"{c}:{k}" for c, k in NON_FINITE])
def test_every_float_key_refuses_nan_and_infinity(command, key):
    """Once in the schema (`Section`), for every float key of every command: NaN and +-infinity,
    as YAML writes them and as words, are refused in one line naming the key."""
    for value in (".nan", ".inf", "-.inf", "inf", "nan"):
        with pytest.raises(UserError) as e:
            load_config(command, None, [f"{key}={value}"])
        assert f"config key {key}: Input should be a finite number" in str(e.value)
        assert "\n" not in str(e.value)


def test_the_reward_weight_refuses_nan_and_infinity():
    for value in (".nan", ".inf"):
        with pytest.raises(UserError, match=r"reward\.0\.weight: Input should be a finite"):
            load_config("grpo", None, [f"reward=[{{name: happy_binary, weight: {value}}}]"])


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

    root = Path(__file__).resolve().parents[2] / "configs" / "pretrain"
    for recipe in root.glob("*.yaml"):
        assert recipe.read_text().startswith("# smollab "), f"{recipe} lacks its command header"
        load_config("pretrain", recipe)


def test_grpo_recipes_validate():
    from pathlib import Path

    from smollab.rewards.registry import validate_specs

    root = Path(__file__).resolve().parents[2] / "configs" / "grpo"
    for recipe in root.glob("*.yaml"):
        assert recipe.read_text().startswith("# smollab grpo "), recipe
        validate_specs(load_config("grpo", recipe).reward, columns=None)  # no data here


def test_sft_recipes_validate():
    from pathlib import Path

    from smollab.config.load import guess_command

    recipes = list((Path(__file__).resolve().parents[2] / "configs" / "sft").glob("*.yaml"))
    assert recipes
    for recipe in recipes:
        assert recipe.read_text().startswith("# smollab sft "), recipe
        assert guess_command(recipe) == "sft"
        load_config("sft", recipe)


def test_rft_recipes_validate():
    from smollab.config.load import guess_command
    from smollab.rewards.registry import validate_specs

    recipes = list((Path(__file__).resolve().parents[2] / "configs" / "rft").glob("*.yaml"))
    assert recipes
    for recipe in recipes:
        assert recipe.read_text().startswith("# smollab rft "), recipe
        assert guess_command(recipe) == "rft"
        validate_specs(load_config("rft", recipe).reward, columns=None)  # no data here


# Rules across keys: (command, overrides, keys the one line must name).
RULES = [
    ("pretrain", ["optim.min_lr=0.01"], ["optim.min_lr=0.01", "optim.lr=0.001"]),
    ("pretrain", ["optim.schedule=constant", "optim.min_lr=0"], ["optim.min_lr", "constant"]),
    (
        "pretrain",
        ["optim.min_lr=1e-5", "optim.min_lr_ratio=0.1"],
        ["optim.min_lr=1e-05", "optim.min_lr_ratio=0.1", "keep one"],
    ),
    (
        "pretrain",
        ["optim.schedule=constant", "optim.min_lr_ratio=0.1"],
        ["min_lr_ratio", "constant"],
    ),
    ("pretrain", ["optim.lr=3e-4", "optim.min_lr=4e-4"], ["optim.min_lr_ratio", "optim.lr=0.0003"]),
    ("pretrain", ["optim.decay_fraction=0.5"], ["optim.decay_fraction", "optim.schedule=cosine"]),
    ("pretrain", ["perf.compile_mode=max-autotune"], ["perf.compile_mode", "perf.compile"]),
    (
        "pretrain",
        ["train.eval_interval=0", "train.eval_tokens=100"],
        ["train.eval_tokens", "train.eval_interval=0"],
    ),
    (
        "pretrain",
        ["train.save_interval=0", "train.keep_last=5"],
        ["train.keep_last", "train.save_interval=0"],
    ),
    ("pretrain", ["run.dir=x", "run.name=y"], ["run.name=y", "run.dir=x"]),
    ("pretrain", ["model.path=some/dir", "model.preset=micro"], ["model.preset", "model.path"]),
    ("data", ["data.files=[a.txt]"], ["data.files", "data.source=offline"]),
    ("data", ["data.source=files"], ["data.source=files", "data.files"]),
    ("data", ["data.max_stories=100"], ["data.max_stories", "data.source=offline"]),
    (
        "data",
        ["data.source=tinystories", "data.num_stories=100"],
        ["data.num_stories", "data.source=tinystories"],
    ),
    (
        "data",
        ["data.source=files", "data.files=[a.txt]", "data.text_key=body"],
        ["data.text_key", "data.files"],
    ),
    ("data", ["data.source=tinystories", "data.seed=3"], ["data.seed", "data.source=tinystories"]),
    (
        "data",
        ["data.source=tinystories", "data.test_fraction=0.1"],
        ["data.test_fraction", "data.max_stories"],
    ),
    ("grpo", ["model.lora.r=4"], ["model.lora.r", "model.lora.enabled"]),
    ("grpo", ["grpo.export_merged=true"], ["grpo.export_merged", "model.lora.enabled"]),
    (
        "grpo",
        ["grpo.num_iterations=2", "grpo.epsilon_high=0.1"],
        ["grpo.epsilon_high=0.1", "grpo.epsilon=0.2"],
    ),
    ("grpo", ["grpo.epsilon=0.3"], ["grpo.epsilon", "grpo.num_iterations=1"]),
    (
        "grpo",
        ["grpo.num_iterations=2", "grpo.sapo_temperature_pos=2"],
        ["grpo.sapo_temperature_pos", "grpo.loss_type=dapo"],
    ),
    (
        "grpo",
        ["grpo.num_iterations=2", "grpo.loss_type=sapo", "grpo.epsilon=0.3"],
        ["grpo.epsilon", "grpo.loss_type=sapo"],
    ),
    (
        "grpo",
        ["grpo.num_iterations=2", "grpo.loss_type=cispo", "grpo.delta=2"],
        ["grpo.delta", "grpo.loss_type=cispo"],
    ),
    (
        "grpo",
        ["grpo.num_iterations=2", "grpo.loss_type=grpo", "grpo.vespo_k_neg=1"],
        ["grpo.vespo_k_neg", "grpo.loss_type=grpo"],
    ),
    (
        "grpo",
        [
            "grpo.num_iterations=2",
            "grpo.loss_type=cispo",
            "grpo.epsilon_high=5",
            "grpo.epsilon=0.3",
        ],
        ["grpo.epsilon", "grpo.loss_type=cispo"],
    ),
    ("grpo", ["grpo.loss_type=cispo"], ["grpo.loss_type=cispo", "grpo.epsilon_high"]),
    (
        "grpo",
        ["grpo.loss_type=vespo", "grpo.importance_sampling_level=sequence"],
        ["grpo.importance_sampling_level=sequence", "grpo.loss_type=vespo"],
    ),
    (
        "grpo",
        ["grpo.loss_type=sapo", "grpo.sapo_temperature_neg=2"],
        ["grpo.sapo_temperature_neg", "grpo.num_iterations=1"],
    ),
    ("grpo", ["grpo.delta=2"], ["grpo.delta", "grpo.num_iterations=1"]),
    (
        "grpo",
        ["grpo.prompts_file=p.txt", "grpo.prompt_tokens=4"],
        ["grpo.prompt_tokens", "grpo.prompts_file"],
    ),
    ("grpo", ["grpo.beta=0", "grpo.ref_on_cpu=true"], ["grpo.ref_on_cpu", "grpo.beta=0"]),
    ("grpo", ["grpo.beta=0", "failure.max_kl=1"], ["failure.max_kl", "grpo.beta=0"]),
    (
        "grpo",
        ["train.eval_interval=0", "grpo.eval_prompts=8"],
        ["grpo.eval_prompts", "train.eval_interval=0"],
    ),
    (
        "grpo",
        ["failure.baseline_steps=60"],
        ["failure.stuck_grace_steps=100", "failure.baseline_steps=60"],
    ),
    ("grpo", ["train.batch_size=10"], ["train.batch_size=10", "grpo.num_generations=16"]),
    # TRL 1.16's KL correction, entropy, multi-reward and generation-reuse keys
    (
        "grpo",
        ["grpo.beta=0", "grpo.use_bias_correction_kl=false"],
        ["grpo.use_bias_correction_kl", "grpo.beta=0"],
    ),
    (
        "grpo",
        ["grpo.off_policy_mask_threshold=0.5"],
        ["grpo.off_policy_mask_threshold", "grpo.num_iterations=1"],
    ),
    (
        "grpo",
        ["grpo.entropy_target=0.5"],
        ["grpo.entropy_target", "grpo.use_adaptive_entropy"],
    ),
    (
        "grpo",
        [
            "grpo.use_adaptive_entropy=true",
            "grpo.entropy_coef_min=0.5",
            "grpo.entropy_coef_max=0.1",
        ],
        ["grpo.entropy_coef_min=0.5", "grpo.entropy_coef_max=0.1"],
    ),
    (
        "grpo",
        ["grpo.multi_objective_aggregation=normalize_then_sum", "grpo.scale_rewards=batch"],
        ["grpo.scale_rewards", "normalize_then_sum"],
    ),
    (
        "grpo",
        ["train.grad_accum=2", "grpo.steps_per_generation=3"],
        ["grpo.steps_per_generation=3", "train.grad_accum=2"],
    ),
    (
        "grpo",
        ["grpo.steps_per_generation=4", "train.save_interval=50"],
        ["train.save_interval=50", "grpo.steps_per_generation=4"],
    ),
    (
        "grpo",
        ["grpo.steps_per_generation=2", "grpo.routing.enabled=true"],
        ["grpo.steps_per_generation=2", "grpo.routing"],
    ),
    ("grpo", ["grpo.top_entropy_quantile=1.5"], ["grpo.top_entropy_quantile"]),
    # prompts from data
    (
        "grpo",
        ["grpo.prompts_file=p.jsonl", "data.hf_dataset=org/ds"],
        ["grpo.prompts_file=p.jsonl", "data.hf_dataset=org/ds"],
    ),
    ("grpo", ["data.eval_split=test"], ["data.eval_split", "data.hf_dataset"]),
    (
        "grpo",
        ["data.hf_dataset=d", "data.eval_split=test", "grpo.eval_prompts_file=e.jsonl"],
        ["grpo.eval_prompts_file=e.jsonl", "data.eval_split=test"],
    ),
    (
        "grpo",
        ["data.hf_dataset=d", "data.eval_split=test", "data.eval_fraction=0.1"],
        ["data.eval_fraction", "data.eval_split"],
    ),
    ("grpo", ["data.eval_fraction=0.1"], ["data.eval_fraction", "grpo.prompts_file"]),
    (
        "grpo",
        ["grpo.prompts_file=p.txt", "data.prompt_field=q"],
        ["data.prompt_field", ".txt"],
    ),
    (
        "grpo",
        ["data.hf_dataset=d", "grpo.prompt_tokens=4"],
        ["grpo.prompt_tokens", "data.hf_dataset"],
    ),
    ("grpo", ["grpo.system_prompt=be brief"], ["grpo.system_prompt", "story openings"]),
    ("grpo", ["train.epochs=2", "train.max_steps=10"], ["train.epochs=2", "train.max_steps=10"]),
    (
        "grpo",
        ["grpo.prompts_file=p.jsonl", "data.eval_fraction=0.1", "train.eval_interval=0"],
        ["data.eval_fraction", "train.eval_interval=0"],
    ),
    (
        "rft",
        ["rft.prompts_file=p.jsonl", "data.seed=3"],
        ["data.seed", "data.eval_fraction"],
    ),
    ("rft", ["data.hf_name=x"], ["data.hf_name", "data.hf_dataset"]),
]


@pytest.mark.parametrize("command,overrides,keys", RULES)
def test_rules_across_keys_one_line_naming_them(command, overrides, keys):
    with pytest.raises(UserError) as e:
        load_config(command, None, overrides)
    msg = str(e.value)
    assert "\n" not in msg and all(k in msg for k in keys), msg


# The same keys where their condition holds, or set to their defaults (which change nothing).
ACCEPTED = [
    ("pretrain", ["optim.schedule=constant", "optim.lr=1e-5"]),  # min_lr unused: no rise
    ("pretrain", ["optim.min_lr_ratio=0.1", "optim.lr=1e-6"]),  # the end follows the lr
    ("pretrain", ["optim.schedule=wsd", "optim.min_lr_ratio=0", "optim.lr=30"]),
    ("pretrain", ["optim.schedule=wsd", "optim.decay_fraction=0.5", "optim.min_lr=0.001"]),
    ("pretrain", ["optim.warmup_steps=0", "train.max_steps=1"]),
    ("pretrain", ["train.eval_interval=0", "train.save_interval=0", "train.keep_last=2"]),
    ("pretrain", ["perf.compile=true", "perf.compile_mode=max-autotune"]),
    ("pretrain", ["model.path=some/dir", "model.preset=null"]),
    ("pretrain", ["model.path=some/dir", "model.preset=simplestories-1.25m"]),
    ("data", ["data.source=files", "data.files=[a.jsonl]", "data.text_key=body"]),
    ("data", ["data.source=tinystories", "data.max_stories=100", "data.test_fraction=0.1"]),
    ("data", ["data.source=tinystories", "data.num_stories=50000", "data.seed=0"]),
    ("grpo", ["model.lora.enabled=true", "model.lora.r=4", "grpo.export_merged=true"]),
    ("grpo", ["model.lora.r=8", "grpo.epsilon=0.2"]),
    ("grpo", ["grpo.num_iterations=2", "grpo.epsilon=0.1", "grpo.epsilon_high=0.3"]),
    ("grpo", ["grpo.loss_type=cispo", "grpo.epsilon_high=5"]),  # the cap, even on-policy
    ("grpo", ["grpo.loss_type=cispo", "grpo.epsilon_high=5", "grpo.num_iterations=2"]),
    ("grpo", ["grpo.loss_type=sapo", "grpo.num_iterations=2", "grpo.sapo_temperature_pos=2"]),
    ("grpo", ["grpo.loss_type=vespo", "grpo.num_iterations=2", "grpo.vespo_lambda_neg=1"]),
    (
        "grpo",
        [
            "grpo.loss_type=luspo",
            "grpo.num_iterations=2",
            "grpo.delta=2",
            "grpo.importance_sampling_level=sequence",
        ],
    ),
    ("grpo", ["grpo.loss_type=grpo", "grpo.importance_sampling_level=sequence"]),
    ("grpo", ["grpo.loss_type=sapo", "grpo.sapo_temperature_pos=1.0"]),  # the default
    ("grpo", ["train.eval_interval=0", "train.save_interval=0"]),
    ("grpo", ["grpo.beta=0", "grpo.ref_on_cpu=false"]),
    ("grpo", ["failure.baseline_steps=50"]),
    ("grpo", ["grpo.use_bias_correction_kl=false", "grpo.beta=0.04"]),
    ("grpo", ["grpo.off_policy_mask_threshold=0.5", "grpo.num_iterations=2"]),
    ("grpo", ["grpo.off_policy_mask_threshold=0.5", "grpo.steps_per_generation=2"]),
    ("grpo", ["grpo.epsilon_high=0.28", "grpo.steps_per_generation=5", "train.save_interval=10"]),
    ("grpo", ["grpo.use_adaptive_entropy=true", "grpo.entropy_target=0.5"]),
    ("grpo", ["grpo.entropy_coef=0.01", "grpo.top_entropy_quantile=0.2"]),
    ("grpo", ["grpo.multi_objective_aggregation=normalize_then_sum"]),
    ("grpo", ["train.grad_accum=2", "grpo.steps_per_generation=2"]),
    ("grpo", ["grpo.prompts_file=p.jsonl", "data.eval_fraction=0.1", "data.prompt_field=q"]),
    ("grpo", ["grpo.prompts_file=p.txt", "grpo.eval_prompts_file=e.csv", "data.prompt_field=q"]),
    ("grpo", ["data.hf_dataset=d", "data.eval_split=test", "train.epochs=1.5"]),
    ("grpo", ["grpo.prompts_file=p.jsonl", "grpo.system_prompt=be brief"]),
    ("rft", ["rft.prompts_file=p.parquet", "data.eval_fraction=0.2", "data.seed=3"]),
]


@pytest.mark.parametrize("command,overrides", ACCEPTED)
def test_the_same_keys_where_they_apply_are_accepted(command, overrides):
    load_config(command, None, overrides)


@pytest.mark.parametrize("command", ["pretrain", "grpo", "sft", "rft", "data"])
def test_config_show_output_loads_again(command, tmp_path):
    """`smollab config show` prints every key; set to their defaults, none is refused."""
    import yaml

    from smollab.config import SCHEMAS
    from smollab.config.load import validate

    recipes = sorted((Path(__file__).resolve().parents[2] / "configs" / command).glob("*.yaml"))
    for cfg in [load_config(command), *(load_config(command, r) for r in recipes)]:
        tree = yaml.safe_load(yaml.safe_dump(to_dict(cfg)))
        assert validate(SCHEMAS[command], tree) == cfg


def test_keys_another_command_reads_are_refused_with_the_reason():
    with pytest.raises(UserError) as e:
        load_config("grpo", None, ["train.max_tokens=2"])
    assert str(e.value) == (
        "config key train.max_tokens: grpo does not read it (it counts optimizer steps, not "
        "tokens (train.max_steps, max_time))"
    )
    with pytest.raises(UserError, match=r"^config key model.lora.r: pretrain does not read it \("):
        load_config("pretrain", None, ["model.lora.r=4"])
    with pytest.raises(UserError, match=r"^config key perf.compile: grpo does not read it \("):
        load_config("grpo", None, ["perf.compile=false"])  # refused even at its default
    # keys no command has keep their did-you-mean
    with pytest.raises(
        UserError, match=r"unknown config key grpo.betta \(did you mean grpo.beta\?\)"
    ):
        load_config("grpo", None, ["grpo.betta=1"])
