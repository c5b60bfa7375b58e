import math

from smollab.config import FailureConfig
from smollab.train.diversity import mean_pairwise_jaccard, repetition, unique_fraction
from smollab.train.failure_rules import degenerate, diverged_loss, diverged_rl, stuck


def test_diverged_loss():
    assert diverged_loss(math.nan, 8.0, 3.0, 5).status == "diverged"
    assert diverged_loss(25.0, 8.0, 3.0, 5).evidence.startswith("loss 25.000 at step 5")
    assert diverged_loss(9.0, 8.0, 3.0, 5) is None


def test_diverged_rl():
    assert diverged_rl(math.inf, 0.1, 10.0, 3).status == "diverged"
    assert "kl 12" in diverged_rl(12.0, 0.1, 10.0, 3).evidence
    assert diverged_rl(0.5, 0.1, 10.0, 3) is None


def test_degenerate_by_unique_jaccard_or_repetition():
    limits = FailureConfig(min_unique=0.5, max_jaccard=0.7, max_repetition=0.2)
    assert degenerate(0.3, 0.2, 0.0, limits, 9).status == "degenerate"
    assert "Jaccard" in degenerate(0.9, 0.8, 0.0, limits, 9).evidence
    assert "4-grams 0.30" in degenerate(0.9, 0.2, 0.3, limits, 9).evidence
    assert degenerate(0.9, 0.2, 0.1, limits, 9) is None


def test_stuck_after_grace_only():
    flat = [0.2] * 40
    assert stuck(flat, 5, 50, 0.05, 40) is None  # still in grace
    assert stuck(flat + [0.2] * 20, 5, 50, 0.05, 60).status == "stuck"
    rising = [0.2] * 30 + [0.6] * 30
    assert stuck(rising, 5, 50, 0.05, 60) is None


def test_diversity_metrics():
    assert unique_fraction(["a b", "a b", "c"]) == 2 / 3
    assert mean_pairwise_jaccard(["a b", "a b"]) == 1.0
    assert mean_pairwise_jaccard(["a b", "c d"]) == 0.0
    assert mean_pairwise_jaccard(["a b c", "a b d"]) == 0.5
    assert repetition(["a b c d a b c d"]) == 1 - 4 / 5
    assert repetition(["a b c d e"]) == 0.0


def test_rl_watch_reports_each_status_once_and_reads_old_json_flags():
    from types import SimpleNamespace

    from smollab.train.failure_rules import RLWatch

    limits = SimpleNamespace(
        max_kl=1.0,
        min_unique=0.5,
        max_jaccard=0.9,
        max_repetition=0.9,
        patience=1,
        baseline_steps=2,
        stuck_grace_steps=100,
        stuck_margin=0.0,
    )
    row = dict(kl=5.0, loss=0.1, unique_fraction=1.0, jaccard=0.1, repetition=0.0)
    watch = RLWatch(limits)
    assert watch.new_failure(row, [0.1], 3).status == "diverged"
    assert watch.new_failure(row, [0.1], 4) is None  # already reported
    assert RLWatch(limits, '{"stuck": "reward flat"}').flags == {"stuck": "reward flat"}
