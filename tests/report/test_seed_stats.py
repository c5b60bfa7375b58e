"""Statistics across seeds against independent computations, planted pairs, and `smollab
compare` on synthetic sweep and run directories."""

from __future__ import annotations

import csv
import json
from statistics import NormalDist

import numpy as np
import pytest

from smollab.cli import main
from smollab.report.seed_stats import (
    StatsOptions,
    compare,
    difference_interval,
    iqm,
    mean_interval,
    probability_of_improvement,
    reduce_curve,
    seeds_needed,
)

OPTS = StatsOptions(resamples=2000, seed=3)


def test_mean_interval_agrees_with_scipy_bootstrap():
    """scipy is the oracle (a dev dependency, not one of smollab's)."""
    stats = pytest.importorskip("scipy.stats")
    vals = [0.31, 0.35, 0.29, 0.40, 0.33]
    ref = stats.bootstrap(
        (np.array(vals),),
        np.mean,
        n_resamples=50000,
        confidence_level=0.9,
        method="percentile",
        random_state=np.random.default_rng(1),
    ).confidence_interval
    lo, hi = mean_interval(vals, StatsOptions(resamples=50000, level=0.9))
    assert lo == pytest.approx(ref.low, abs=0.003) and hi == pytest.approx(ref.high, abs=0.003)
    a, b = [1.0, 1.2, 0.9, 1.1], [0.5, 0.7, 0.6]
    ref = stats.bootstrap(
        (np.array(a), np.array(b)),
        lambda x, y, axis=-1: np.mean(x, axis=axis) - np.mean(y, axis=axis),
        n_resamples=50000,
        method="percentile",
        random_state=np.random.default_rng(1),
    ).confidence_interval
    lo, hi = difference_interval(a, b, StatsOptions(resamples=50000))
    assert lo == pytest.approx(ref.low, abs=0.01) and hi == pytest.approx(ref.high, abs=0.01)
    assert iqm([1, 2, 3, 4, 100, 5, 6, 7, 9]) == pytest.approx(
        stats.trim_mean([1, 2, 3, 4, 100, 5, 6, 7, 9], 0.25)
    )


def test_mean_interval_is_the_percentiles_of_resampled_means():
    vals = np.array([0.31, 0.35, 0.29, 0.40, 0.33])
    rng = np.random.default_rng(5)
    means = [rng.choice(vals, len(vals)).mean() for _ in range(20000)]
    ref = np.percentile(means, [2.5, 97.5])
    lo, hi = mean_interval(list(vals), StatsOptions(resamples=20000, seed=9))
    assert lo == pytest.approx(ref[0], abs=0.003) and hi == pytest.approx(ref[1], abs=0.003)
    assert mean_interval(list(vals), OPTS) == mean_interval(list(vals), OPTS)  # seeded


def test_difference_interval_resamples_each_configuration_on_its_own():
    """The stratified bootstrap by hand: each group's seeds resampled independently."""
    a, b = np.array([1.0, 1.2, 0.9, 1.1]), np.array([0.5, 0.7, 0.6])
    rng = np.random.default_rng(0)
    diffs = [rng.choice(a, len(a)).mean() - rng.choice(b, len(b)).mean() for _ in range(20000)]
    ref_lo, ref_hi = np.percentile(diffs, [2.5, 97.5])
    lo, hi = difference_interval(list(a), list(b), StatsOptions(resamples=20000))
    assert lo == pytest.approx(ref_lo, abs=0.02) and hi == pytest.approx(ref_hi, abs=0.02)


def test_iqm_probability_of_improvement_and_seeds_needed_by_hand():
    assert iqm([1, 2, 3, 4, 100, 5, 6, 7]) == pytest.approx(np.mean([3, 4, 5, 6]))
    # 3 of 4 pairs a<b, one tie counts half: goal min
    assert probability_of_improvement([1.0, 2.0], [2.0, 3.0], "min") == pytest.approx(3.5 / 4)
    assert probability_of_improvement([1.0, 2.0], [2.0, 3.0], "max") == pytest.approx(0.5 / 4)
    a, b = [1.0, 1.2, 1.1], [1.5, 1.7, 1.6]
    z = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.8)
    expect = int(np.ceil(2 * z * z * 0.01 / 0.25))
    assert seeds_needed(a, b, StatsOptions()) == max(2, expect)
    assert seeds_needed([1.0, 2.0], [2.0, 1.0], StatsOptions()) is None


def test_reduce_last_best_mean_last_k():
    vals = [5.0, None, 3.0, 4.0, float("nan"), 2.0, 6.0]
    assert reduce_curve(vals, "min", "last", 3) == 6.0
    assert reduce_curve(vals, "min", "best", 3) == 2.0
    assert reduce_curve(vals, "max", "best", 3) == 6.0
    assert reduce_curve(vals, "min", "mean_last_k", 3) == pytest.approx(4.0)
    assert reduce_curve([None], "min", "last", 3) is None


def test_planted_identical_pair_indistinguishable_and_large_difference_distinguished():
    rng = np.random.default_rng(7)
    base = list(0.5 + 0.05 * rng.standard_normal(5))
    twin = list(rng.permutation(base))  # the same values: an identical configuration
    far = [v + 0.5 for v in base]
    s = compare({"best": ({}, far), "twin": ({}, base), "base": ({}, base)}, "max", "reward", OPTS)
    assert [c.name for c in s.configs][0] == "best"
    s2 = compare({"a": ({}, base), "b": ({}, twin)}, "max", "reward", OPTS)
    v = s2.versus[0]
    assert not v.distinguished and v.ci[0] < 0 < v.ci[1]
    assert v.probability_of_improvement == pytest.approx(0.5) and v.seeds_needed is None
    for v in s.versus:
        assert v.distinguished and v.ci[1] < 0 and v.probability_of_improvement == 0.0


def test_one_seed_has_no_interval():
    s = compare({"a": ({}, [1.0]), "b": ({}, [2.0])}, "min", "loss", OPTS)
    assert s.configs[0].ci == (None, None) and s.versus[0].ci == (None, None)
    assert not s.versus[0].distinguished


def _sweep(d, values):
    """A sweep dir whose trials logged `reward` curves; values: {lr: [per-seed curves]}."""
    rows = []
    for i, (lr, curves) in enumerate(values.items()):
        for seed, curve in enumerate(curves):
            name = f"trials/{i}-{seed}"
            (d / name).mkdir(parents=True)
            with open(d / name / "metrics.csv", "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["step", "reward"])
                w.writerows([[10 * (j + 1), v] for j, v in enumerate(curve)])
            (d / name / "summary.json").write_text(json.dumps({"status": "completed"}))
            rows.append(
                {
                    "trial": f"{i}{seed}",
                    "optim.lr": lr,
                    "seed": seed,
                    "status": "completed",
                    "reward": curve[-1],
                    "run_dir": name,
                }
            )
    with open(d / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    spec = {
        "command": "grpo",
        "space": {"optim.lr": list(values)},
        "seeds": [0, 1, 2],
        "metric": {"name": "reward", "goal": "max"},
        "report": {"resamples": 500, "reduce": "mean_last_k", "last_k": 2},
    }
    (d / "sweep.json").write_text(json.dumps({"spec": spec}))
    return d


def test_sweep_report_and_compare_on_a_sweep(tmp_path, capsys):
    d = _sweep(
        tmp_path / "sw",
        {
            1e-3: [[0.1, 0.8, 0.9], [0.1, 0.7, 0.8], [0.2, 0.9, 0.9]],
            1e-4: [[0.1, 0.2, 0.3], [0.1, 0.3, 0.2], [0.0, 0.2, 0.2]],
        },
    )
    assert main(["report", str(d)]) == 0
    text = (d / "report.md").read_text()
    assert "### Across seeds" in text and "500 resamples, seed 0" in text
    assert "mean of the last 2" in text and "distinguished" in text
    res = json.loads((d / "results.json").read_text())
    assert res["optuna"] and res["configs"][0]["params"] == {"optim.lr": 0.001}
    assert res["configs"][0]["values"] == pytest.approx([0.85, 0.75, 0.9])
    assert (d / "seed_intervals.png").exists()
    out = tmp_path / "cmp"
    assert main(["compare", str(d), "--out", str(out), "--reduce", "best"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["configs"][0]["values"] == pytest.approx([0.9, 0.8, 0.9])
    assert res["versus_best"][0]["distinguished"] is True
    assert (out / "report.md").exists() and (out / "seed_intervals.png").exists()


def test_compare_runs_picked_by_hand_groups_by_config_less_seed(tmp_path):
    from smollab.config.load import to_dict
    from smollab.config.registry import SCHEMAS

    runs = []
    for lr in (1e-3, 1e-4):
        for seed in range(3):
            r = tmp_path / f"r{lr}-{seed}"
            r.mkdir()
            config = to_dict(SCHEMAS["grpo"]())  # a real run's config.json: every section
            config["optim"]["lr"] = lr
            config["run"].update(seed=seed, dir=str(r), name=f"lr{lr}-s{seed}", plots=seed > 0)
            (r / "config.json").write_text(json.dumps(config))
            (r / "summary.json").write_text(json.dumps({"status": "completed"}))
            reward = (0.8 if lr == 1e-3 else 0.2) + 0.01 * seed
            (r / "metrics.csv").write_text(f"step,reward\n10,0.0\n20,{reward}\n")
            runs.append(str(r))
    out = tmp_path / "cmp"
    assert main(["compare", *runs, "--metric", "reward", "--goal", "max", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert [c["name"] for c in res["configs"]] == ["lr=0.001", "lr=0.0001"]
    assert [len(c["values"]) for c in res["configs"]] == [3, 3]
