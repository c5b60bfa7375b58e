"""The LR analysis on synthetic curves: each pattern, the best and first diverging LR, the ratio."""

from __future__ import annotations

import math

from smollab.report.lr_analysis import RunCurve, analyze, classify, spike

STEPS = [float(s) for s in range(0, 101, 10)]


def curve(name, lr, losses, status="completed", seed=0, final=None):
    return RunCurve(
        name=name,
        lr=lr,
        seed=seed,
        status=status,
        steps=STEPS[: len(losses)],
        loss=losses,
        final=final,
    )


def decay(start, end, n=11, rate=0.5):
    return [end + (start - end) * math.exp(-rate * i) for i in range(n)]


SLOW = curve("slow", 1e-4, decay(8.0, 4.0, rate=0.1))  # still falling, ends high
GOOD = curve("good", 1e-3, decay(8.0, 2.0))
GOOD2 = curve("good2", 3e-3, decay(8.0, 2.05))
SPIKY = curve("spiky", 1e-2, [8, 5, 3, 2.5, 4.5, 4.0, 3.0, 2.8, 2.6, 2.5, 2.4])
NAN = curve("nan", 3e-2, [8, 7, float("nan")], status="diverged")
UP = curve("up", 1e-1, [8, 9, 12, 15])  # no NaN and not flagged by the run: still diverged


def test_patterns():
    a = analyze([SLOW, GOOD, GOOD2, SPIKY, NAN, UP])
    patterns = {r.name: r.pattern for r in a.runs}
    assert patterns == {
        "slow": "too slow",
        "good": "converged",
        "good2": "converged",
        "spiky": "unstable",
        "nan": "diverged",
        "up": "diverged",
    }
    why = {r.name: r.why for r in a.runs}
    assert "still falling" in why["slow"] and "above its start" in why["up"]


def test_best_first_diverging_and_ratio():
    a = analyze([SLOW, GOOD, GOOD2, SPIKY, NAN, UP])
    assert a.best_lr == 1e-3
    assert a.first_diverging_lr == 3e-2
    assert math.isclose(a.ratio, 30.0)
    assert a.largest_stable_lr == 1e-2


def test_seeds_average_and_any_diverged_seed_disqualifies():
    runs = [
        curve("a0", 1e-3, decay(8, 2.2), seed=0),
        curve("a1", 1e-3, decay(8, 2.0), seed=1),
        curve("b0", 3e-3, decay(8, 1.9), seed=0),
        curve("b1", 3e-3, [8, float("inf")], seed=1, status="diverged"),
    ]
    a = analyze(runs)
    per = {p["lr"]: p for p in a.per_lr}
    assert math.isclose(per[1e-3]["mean"], 2.14, rel_tol=1e-2) and per[1e-3]["n"] == 2
    assert per[3e-3]["diverged"] == 1
    assert a.best_lr == 1e-3 and a.first_diverging_lr == 3e-3  # b0 alone was better, but b1 blew up


def test_target_loss_decides_converged_vs_too_slow():
    a = analyze([SLOW, GOOD], target_loss=3.0)
    res = {r.name: (r.pattern, r.met_target) for r in a.runs}
    assert res == {"slow": ("too slow", False), "good": ("converged", True)}
    assert [p["met_target"] for p in a.per_lr] == [False, True]


def test_larger_lr_ending_worse_is_unstable_and_no_divergence_gives_no_ratio():
    worse = curve("worse", 1e-2, decay(8, 2.6))
    a = analyze([GOOD, worse])
    assert {r.name: r.pattern for r in a.runs}["worse"] == "unstable"
    assert a.first_diverging_lr is None and a.ratio is None


def test_final_overrides_the_curve_and_spike_measure():
    c = curve("v", 1e-3, decay(8, 2.0), final=2.5)
    assert c.final_loss() == 2.5
    frac, at = spike(SPIKY)
    assert frac > 0.7 and at == 40.0
    assert classify(GOOD, 1e-3, 2.0)[0] == "converged"
