"""The pruners for noisy curves, on hand-built reward curves: patience, smoothing and the
Wilcoxon test over held-out prompts, then the scheduler reporting them from a trial's run dir."""

from __future__ import annotations

import csv
import json
import math

import optuna
import pytest

from smollab.errors import UserError
from smollab.lab.sweep import resources, scheduler
from smollab.lab.sweep.pruning import curve, intermediate_values, prompt_rewards
from smollab.lab.sweep.scheduler import run_sweep
from smollab.lab.sweep.spec import SweepSpec
from smollab.lab.sweep.spec_load import validate_spec
from smollab.lab.sweep.study import make_pruner

GOOD = [t / 10 for t in range(1, 11)]  # the reward curves of three finished, good trials
SLOW_GOOD = [0.0, 0.0, 0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1]  # a late start, then the best
NON_STARTER = [0.05, 0.0, 0.04, 0.01, 0.03, 0.0, 0.02, 0.01, 0.0, 0.01]  # jitter around 0
FLAT = [0.0] * 10


def grpo_spec(**pruner) -> SweepSpec:
    return SweepSpec.model_validate(
        dict(
            command="grpo",
            space={"optim.lr": [1e-3]},
            metric={"name": "reward_mean", "goal": "max"},
            pruner=pruner,
        )
    )


def pruned_at(spec: SweepSpec, curves: list[list[float]]) -> list[int | None]:
    """Run the curves as trials one after another against the spec's pruner, reported as the
    sweep reports them; the step each was pruned at (None: it finished)."""
    study = optuna.create_study(direction="maximize", pruner=make_pruner(spec))
    out = []
    for values in curves:
        trial = study.ask()
        rows = [{"step": float(s), "reward_mean": v} for s, v in enumerate(values, 1)]
        stop = None
        for step, v in intermediate_values(spec.pruner, "reward_mean", rows, None):
            trial.report(v, step)
            if trial.should_prune():
                stop = step
                break
        state = optuna.trial.TrialState.PRUNED if stop else optuna.trial.TrialState.COMPLETE
        study.tell(trial, values[-1] if stop is None else None, state=state)
        out.append(stop)
    return out


def test_median_stops_a_slow_good_trial_that_patience_keeps_and_both_stop_a_non_starter():
    curves = [GOOD, GOOD, GOOD, SLOW_GOOD, NON_STARTER]
    median = {"type": "median", "n_startup_trials": 3}
    assert pruned_at(grpo_spec(**median), curves)[3:] == [1, 1]
    # patience 2: the slow trial's curve has not fallen below its own best, so the median's
    # verdict never counts; the non-starter's has, by step 4
    assert pruned_at(grpo_spec(**median, patience=2), curves)[3:] == [None, 4]


def test_patience_alone_stops_a_falling_curve_not_a_flat_one():
    """Optuna's PatientPruner calls a curve stalled when its recent best is worse than its best
    before by more than min_delta: an exactly flat curve (reward 0 every step) never is, and is
    left to the stuck failure rule."""
    falling = [0.5, 0.6, 0.4, 0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1]
    spec = grpo_spec(patience=2, min_delta=0.05)
    assert pruned_at(spec, [GOOD, falling, FLAT]) == [None, 5, None]


def test_smoothing_keeps_a_trial_through_one_bad_evaluation():
    dip = [0.3, 0.35, 0.4, 0.05, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7]
    threshold = {"type": "threshold", "lower": 0.2, "n_warmup_steps": 2}
    assert pruned_at(grpo_spec(**threshold), [dip, NON_STARTER]) == [4, 2]
    assert pruned_at(grpo_spec(**threshold, smooth=3), [dip, NON_STARTER]) == [None, 2]


def test_curve_is_the_moving_mean_of_the_logged_values():
    rows = [
        {"step": 1.0, "r": 1.0},
        {"step": 2.0, "r": None},  # not logged at this step: in no window
        {"step": 3.0, "r": 3.0},
        {"step": 4.0, "r": math.nan},
        {"step": 5.0, "r": 5.0},
        {"step": 6.0, "r": 7.0},
    ]
    assert curve(rows, "r", None) == [(1, 1.0), (3, 3.0), (5, 5.0), (6, 7.0)]
    assert curve(rows, "r", 2) == [(1, 1.0), (3, 2.0), (5, 4.0), (6, 6.0)]


def test_prompt_rewards_are_instances_by_evaluation_and_prompt():
    evals = [
        {"step": 0, "rewards": [0.0, 1.0]},
        {"step": 3, "rewards": [0.5, 0.25]},
        {"step": 6, "rewards": [9.0, 9.0]},
        {"step": 6, "rewards": [1.0, math.nan]},  # a resumed run rewrote step 6: the last counts
    ]
    assert prompt_rewards(evals) == [(0, 0.0), (1, 1.0), (2, 0.5), (3, 0.25), (4, 1.0)]
    assert prompt_rewards([]) == []


def test_wilcoxon_stops_a_trial_worse_prompt_by_prompt_and_keeps_an_equal_one(tmp_path):
    spec = grpo_spec(type="wilcoxon", p_threshold=0.1, n_startup_steps=4)
    study = optuna.create_study(direction="maximize", pruner=make_pruner(spec))
    best = [0.2 + 0.05 * (i % 7) for i in range(16)]

    def run(rewards: list[float]) -> int | None:
        d = tmp_path / f"t{len(study.trials)}"
        d.mkdir()
        with open(d / "eval_prompts.jsonl", "w") as f:
            for e in range(2):  # two evaluations of 8 prompts
                f.write(json.dumps({"step": 3 * e, "rewards": rewards[8 * e : 8 * e + 8]}) + "\n")
        trial = study.ask()
        for step, v in intermediate_values(spec.pruner, "reward_mean", [], d):
            trial.report(v, step)
            if trial.should_prune():
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                return step
        study.tell(trial, sum(rewards) / len(rewards))
        return None

    assert run(best) is None
    worse = [r - 0.1 - 0.01 * (i % 3) for i, r in enumerate(best)]
    assert run(worse) is not None
    assert run([r + 0.01 * (-1) ** i for i, r in enumerate(best)]) is None  # as good, jittered


@pytest.fixture
def no_config_resolution(monkeypatch):
    monkeypatch.setattr(resources, "detect_device", lambda spec: "cpu")
    monkeypatch.setattr(scheduler, "preflight_data", lambda spec, say, out: None)


def test_a_sweep_reports_held_out_prompt_rewards_to_the_wilcoxon_pruner(
    fake_child, no_config_resolution, tmp_path, monkeypatch
):
    """The fake grpo child writes 8 prompts' rewards every 2 steps: after the good trial, the
    poor one is stopped on them, and its evidence says so."""
    monkeypatch.setenv("FAKE_STEP_S", "0.05")
    spec = SweepSpec.model_validate(
        dict(
            command="grpo",
            overrides={"train.max_steps": 30},
            space={"optim.lr": {"low": 1e-3, "high": 1.0, "log": True}},
            sampler="random",
            n_trials=2,
            enqueue=[{"optim.lr": 1.0}, {"optim.lr": 1e-3}],
            metric={"name": "reward_mean", "goal": "max"},
            pruner={"type": "wilcoxon", "n_startup_steps": 4},
            concurrency=1,
            dir=str(tmp_path / "sweep"),
            poll_s=0.05,
        )
    )
    assert run_sweep(spec) == {"completed": 1, "pruned": 1}
    with open(tmp_path / "sweep" / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[1]["status"] == "pruned" and "held-out prompt rewards" in rows[1]["reason"]


BAD = [
    (dict(command="pretrain", pruner={"type": "wilcoxon"}), "wilcoxon needs each held-out"),
    (dict(pruner={"type": "median", "patience": -1}), "pruner.patience: .*greater than or equal"),
    (dict(pruner={"type": "median", "smooth": 0}), "pruner.smooth: .*greater than or equal to 1"),
    (dict(pruner={"type": "median", "min_delta": 0.1}), "min_delta needs patience"),
    (dict(pruner={"smooth": 3}), "smooth needs a pruner"),
    (dict(pruner={"type": "median", "p_threshold": 0.05}), "p_threshold is for type wilcoxon"),
    (dict(pruner={"type": "wilcoxon", "smooth": 3}), "smooth acts on a logged curve"),
    (dict(pruner={"type": "wilcoxon", "patience": 2}), "patience acts on a logged curve"),
    (dict(pruner={"type": "wilcoxon"}, metric={"name": "kl", "goal": "min"}), "has goal min"),
    (
        dict(pruner={"type": "wilcoxon"}, overrides={"train.eval_interval": 0}),
        "train.eval_interval > 0",
    ),
    (
        dict(pruner={"type": "wilcoxon"}, space={"grpo.eval_prompts": [4, 8]}),
        "space.grpo.eval_prompts: not with pruner wilcoxon",
    ),
]


@pytest.mark.parametrize("fields, message", BAD)
def test_pruner_bad_input_is_one_line(fields, message):
    tree = dict(
        command="grpo",
        space={"optim.lr": [1e-3, 1e-2]},
        metric={"name": "eval_reward_mean", "goal": "max"},
    )
    tree.update(fields)
    if tree["command"] == "pretrain":
        tree["metric"] = {"name": "val_loss", "goal": "min"}
    with pytest.raises(UserError, match=message) as e:
        validate_spec(tree)
    assert "\n" not in str(e.value)


def test_the_evidence_names_patience_smoothing_and_the_wilcoxon_test():
    from smollab.lab.sweep.study import prune_evidence

    p = grpo_spec(type="median", patience=3, smooth=5).pruner
    said = prune_evidence(p, "reward_mean", 12, 0.25)
    assert said.startswith("patient median pruner at step 12: reward_mean 0.25 (mean of 5)")
    assert "its best of its last 4 reports is worse than its best before" in said
    assert prune_evidence(grpo_spec(patience=2).pruner, "r", 3, 1.0).startswith("patient pruner")
    said = prune_evidence(grpo_spec(type="wilcoxon").pruner, "reward_mean", 9, 0.1)
    assert said.startswith("wilcoxon pruner after 10 held-out prompt rewards") and "p < 0.1" in said
