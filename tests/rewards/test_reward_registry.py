"""Registry: built-ins by name, module:function, spec and param validation."""

import textwrap

import pytest
from pydantic import ValidationError

from smollab.errors import UserError
from smollab.rewards import BUILTINS, RewardSpec, get_reward, validate_specs
from smollab.rewards.happy import happy_binary


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards_mod.py").write_text(
        textwrap.dedent(
            """
            def exclaim(completions, prompts=None, *, bonus=1.0, **kwargs):
                return [bonus * c.count("!") for c in completions]

            def needs_scale(completions, scale, **kwargs):
                return [scale] * len(completions)

            def no_kwargs(completions):
                return [0.0] * len(completions)

            not_callable = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "my_rewards_mod"


def test_builtins_by_name():
    assert get_reward("happy_binary") is happy_binary
    assert set(BUILTINS) == {
        "happy_binary",
        "happy_count",
        "happy_density",
        "contains_words",
        "sentiment",
        "sentence_length",
        "wordle_format",
        "wordle_feedback_use",
        "wordle_info_gain",
        "wordle_solved",
        "fen_valid",
        "fen_exact",
        "fen_distance",
        "chess_legal_move",
        "word_problem_correct",
    }


def test_unknown_name_suggests():
    with pytest.raises(
        UserError, match=r"unknown reward 'happy_binry'; did you mean 'happy_binary'"
    ):
        get_reward("happy_binry")


def test_module_function_loads(user_module):
    fn = get_reward(f"{user_module}:exclaim")
    assert fn(["a!!", "b"], bonus=2.0) == [4.0, 0.0]


@pytest.mark.parametrize(
    "spec, match",
    [
        ("no_such_module_xyz:fn", "reward 'no_such_module_xyz:fn': cannot import module"),
        (
            "my_rewards_mod:missing",
            "reward 'my_rewards_mod:missing': .* has no attribute 'missing'",
        ),
        ("my_rewards_mod:not_callable", "is not callable"),
        ("my_rewards_mod:", "expected module:function"),
    ],
)
def test_bad_module_function(user_module, spec, match):
    with pytest.raises(UserError, match=match) as e:
        get_reward(spec)
    assert "\n" not in str(e.value)


def test_validate_specs_params(user_module):
    specs = validate_specs(
        [
            {"name": "sentence_length", "params": {"target": 8}},
            {"name": f"{user_module}:exclaim", "weight": 0.5},
        ]
    )
    assert [s.key for s in specs] == ["sentence_length", f"{user_module}:exclaim"]
    assert specs[0].params == {"target": 8} and specs[1].weight == 0.5
    with pytest.raises(UserError, match="reward sentence_length: unknown param 'targt'"):
        validate_specs([RewardSpec(name="sentence_length", params={"targt": 8})])
    with pytest.raises(UserError, match=f"reward {user_module}:exclaim: unknown param 'bonsu'"):
        validate_specs([{"name": f"{user_module}:exclaim", "params": {"bonsu": 1}}])
    with pytest.raises(UserError, match="missing required param 'scale'"):
        validate_specs([{"name": f"{user_module}:needs_scale"}])
    with pytest.raises(UserError, match="param 'prompts' is passed by the trainer"):
        validate_specs([{"name": "happy_binary", "params": {"prompts": []}}])
    with pytest.raises(UserError, match="no_kwargs: must accept keyword argument"):
        validate_specs([{"name": f"{user_module}:no_kwargs"}])
    # values of built-in params are checked eagerly too
    with pytest.raises(UserError, match="sentence_length: unit must be one of"):
        validate_specs([{"name": "sentence_length", "params": {"unit": "lines"}}])
    with pytest.raises(UserError, match="at least one"):
        validate_specs([])


def test_spec_model_forbids_extra_and_nonfinite_weight():
    with pytest.raises(ValidationError):
        RewardSpec(name="happy_binary", wieght=2.0)
    with pytest.raises(ValidationError):
        RewardSpec(name="happy_binary", weight=float("nan"))
    with pytest.raises(UserError, match="reward spec"):
        validate_specs([{"name": "happy_binary", "extra": 1}])


def test_repeated_names_get_unique_keys():
    specs = validate_specs(
        [{"name": "sentence_length"}, {"name": "sentence_length", "params": {"target": 5}}]
    )
    assert [s.key for s in specs] == ["sentence_length", "sentence_length#2"]
