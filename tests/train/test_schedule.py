import pytest

from smollab.config import OptimConfig
from smollab.train.schedule import lr_at, schedule_note


def test_cosine_warmup_then_min_at_last_step():
    o = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10, schedule="cosine")
    assert lr_at(0, o, 100) == pytest.approx(0.1)
    assert lr_at(9, o, 100) == pytest.approx(1.0)
    assert lr_at(99, o, 100) == pytest.approx(0.1)
    mid = 10 + (99 - 10) / 2
    assert lr_at(int(mid), o, 100) == pytest.approx(0.55, abs=0.02)
    lrs = [lr_at(s, o, 100) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))


def test_constant_and_wsd():
    c = OptimConfig(lr=1.0, min_lr=0.0, warmup_steps=0, schedule="constant")
    assert {lr_at(s, c, 50) for s in range(50)} == {1.0}
    w = OptimConfig(lr=1.0, min_lr=0.0, warmup_steps=0, schedule="wsd", decay_fraction=0.2)
    assert lr_at(70, w, 101) == 1.0
    assert lr_at(100, w, 101) == pytest.approx(0.0)
    assert 0 < lr_at(90, w, 101) < 1


def test_warmup_longer_than_run_is_clamped_and_noted():
    o = OptimConfig(lr=1.0, min_lr=0.0, warmup_steps=1000)
    lrs = [lr_at(s, o, 5) for s in range(5)]
    assert lrs == sorted(lrs) and lrs[-1] == pytest.approx(1.0)  # rises, reaching lr at the end
    note = schedule_note(o, 5)
    assert "optim.warmup_steps=1000" in note and "train.max_steps=5" in note
    assert schedule_note(o, 1001) is None
    assert schedule_note(OptimConfig(warmup_steps=0), 1) is None


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_min_lr_ratio_ends_the_schedule_at_that_fraction_of_any_lr(schedule):
    for lr in (3e-4, 4e-3, 30.0):
        o = OptimConfig(lr=lr, min_lr_ratio=0.1, warmup_steps=10, schedule=schedule)
        assert o.final_lr == pytest.approx(lr * 0.1)
        assert lr_at(9, o, 100) == pytest.approx(lr)
        assert lr_at(99, o, 100) == pytest.approx(lr * 0.1)
        same = OptimConfig(lr=lr, min_lr=lr * 0.1, warmup_steps=10, schedule=schedule)
        assert [lr_at(s, o, 100) for s in range(100)] == pytest.approx(
            [lr_at(s, same, 100) for s in range(100)]
        )
