"""The study's sampler: every setting pinned, so a spec and seed give the same trials again."""

from __future__ import annotations

import math

import optuna
import pytest

from smollab.errors import UserError
from smollab.lab.sweep.spec_load import validate_spec
from smollab.lab.sweep.study import distributions, make_sampler


def spec(**fields):
    tree = dict(
        command="pretrain",
        overrides={"model.preset": "micro", "train.max_steps": 5},
        space={
            "optim.lr": {"low": 1e-4, "high": 1e-1, "log": True},
            "optim.weight_decay": {"low": 0.0, "high": 0.3},
        },
        sampler="tpe",
        n_trials=14,
        metric={"name": "val_loss", "goal": "min"},
    )
    tree.update(fields)
    return validate_spec(tree)


def suggested(s, n: int = 14, pending: int = 2) -> list[dict]:
    """Ask and tell `n` trials on a fresh in-memory study, `pending` of them always running (as a
    packed sweep does), each told a value computed from its point."""
    study = optuna.create_study(direction="minimize", sampler=make_sampler(s))
    dists = distributions(s)
    running, points = [], []
    while len(points) < n:
        while len(running) < pending and len(points) + len(running) < n:
            running.append(study.ask(dists))
        t = running.pop(0)
        points.append(t.params)
        study.tell(
            t, (math.log10(t.params["optim.lr"]) + 2.5) ** 2 + t.params["optim.weight_decay"]
        )
    return points


@pytest.mark.parametrize("sampler", ["tpe", "random", "qmc"])
def test_the_same_spec_and_seed_give_the_same_trials_twice(sampler):
    fields = {"sampler": sampler}
    if sampler == "tpe":
        fields["tpe"] = {"n_startup_trials": 4}  # the model, not only its random start, is used
    first, second = suggested(spec(**fields)), suggested(spec(**fields))
    assert first == second
    assert first != suggested(spec(**fields, sampler_seed=1))


def test_tpe_settings_are_pinned_not_left_to_optunas_defaults():
    s = make_sampler(spec())
    assert (s._multivariate, s._constant_liar, s._group) == (True, True, False)
    assert (s._n_startup_trials, s._n_ei_candidates) == (10, 24)
    s = make_sampler(
        spec(tpe={"multivariate": False, "constant_liar": False, "n_startup_trials": 3})
    )
    assert (s._multivariate, s._constant_liar, s._n_startup_trials) == (False, False, 3)


def test_qmc_settings_are_pinned():
    s = make_sampler(spec(sampler="qmc", qmc={"type": "halton", "scramble": True}))
    assert (s._qmc_type, s._scramble, s._seed) == ("halton", True, 0)
    assert make_sampler(spec(sampler="qmc"))._qmc_type == "sobol"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"sampler": "random", "tpe": {"multivariate": True}}, "sweep key tpe: set only with"),
        ({"qmc": {"scramble": True}}, "sweep key qmc: set only with sampler: qmc"),
        ({"tpe": {"group": True, "multivariate": False}}, "group needs multivariate"),
        ({"tpe": {"n_startup_trials": -1}}, "tpe.n_startup_trials"),
        ({"tpe": {"liar": True}}, "tpe.liar"),
    ],
)
def test_sampler_settings_bad_input_is_one_line(fields, message):
    with pytest.raises(UserError, match=message) as e:
        spec(**fields)
    assert "\n" not in str(e.value)
