"""RewardPool: weighted totals, per-function values, run-time errors, the process pool."""

import textwrap
import time

import pytest
import torch

from smollab.rewards import RewardError
from smollab.rewards.pool import RewardPool


@pytest.fixture
def bad_module(tmp_path, monkeypatch):
    (tmp_path / "bad_rewards_mod.py").write_text(
        textwrap.dedent(
            """
            def boom(completions, **kwargs):
                raise KeyError("no such\\nthing")

            def nan(completions, **kwargs):
                return [float("nan")] + [0.0] * (len(completions) - 1)

            def nan_c(completions, **kwargs):
                return [float("nan") if c == "c" else 0.0 for c in completions]

            def short(completions, **kwargs):
                return [0.0] * (len(completions) - 1)

            def scalar(completions, **kwargs):
                return 1.0

            def with_none(completions, **kwargs):
                return [None] * len(completions)

            def ids_len(completions, completion_ids=None, **kwargs):
                return [float(len(i)) for i in completion_ids]

            def slow(completions, **kwargs):
                import time
                try:
                    time.sleep(60)
                except Exception:  # the time limit is not an Exception to swallow
                    pass
                return [0.0] * len(completions)

            def deaf(completions, **kwargs):  # as if stuck in C code: no signal gets in
                import signal, time
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
                time.sleep(60)
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "bad_rewards_mod"


def test_weighted_sum_and_per_function_values():
    specs = [{"name": "happy_binary", "weight": 2.0}, {"name": "happy_count", "weight": 0.5}]
    with RewardPool(specs) as pool:
        total, per_fn = pool(["p", "p", "p"], ["happy happy", "sad", "Happy"], None)
    assert total.dtype == torch.float32 and total.shape == (3,)
    assert total.tolist() == [3.0, 0.0, 2.5]  # 2*1 + 0.5*2, 0, 2*1 + 0.5*1
    assert per_fn["happy_binary"].tolist() == [1.0, 0.0, 1.0]  # raw, unweighted
    assert per_fn["happy_count"].tolist() == [2.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "fn, match",
    [
        ("boom", r"reward bad_rewards_mod:boom raised KeyError: 'no such\\nthing'"),
        ("nan", r"reward bad_rewards_mod:nan returned nan for completion 0 \('a'\)"),
        ("short", "reward bad_rewards_mod:short returned 1 values for 2 completions"),
        ("scalar", "reward bad_rewards_mod:scalar returned float, expected a list of 2 numbers"),
        ("with_none", "reward bad_rewards_mod:with_none returned None for completion 0"),
    ],
)
def test_runtime_errors_name_the_function(bad_module, fn, match):
    pool = RewardPool([{"name": "happy_binary"}, {"name": f"{bad_module}:{fn}"}])
    with pytest.raises(RewardError, match=match) as e:
        pool(["p", "p"], ["a", "b"], [[1], [2]])
    assert "\n" not in str(e.value)


def test_builtin_user_error_at_call_names_function():
    pool = RewardPool([{"name": "sentence_length", "params": {"unit": "tokens"}}])
    with pytest.raises(RewardError, match="sentence_length: unit 'tokens' needs completion_ids"):
        pool(None, ["a."], None)


def test_process_pool_matches_inline_and_reports_errors(bad_module):
    specs = [
        {"name": "sentiment", "weight": 0.5},
        {"name": "sentence_length", "params": {"target": 3, "unit": "tokens"}},
        {"name": f"{bad_module}:ids_len", "weight": 0.1},
    ]
    completions = [f"I am {w} today. Yes." for w in ["happy", "sad", "fine", "angry", "glad"]]
    ids = [[1] * k for k in range(1, 6)]
    inline_total, inline_per = RewardPool(specs)(None, completions, ids)
    with RewardPool(specs, workers=2) as pool:
        total, per_fn = pool(None, completions, ids)
        assert torch.equal(total, inline_total)
        assert all(torch.equal(per_fn[k], inline_per[k]) for k in inline_per)
        assert per_fn[f"{bad_module}:ids_len"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    # "c" is the first of the second worker's chunk: the index reported is global
    with (
        RewardPool([{"name": f"{bad_module}:nan_c"}], workers=2) as pool,
        pytest.raises(RewardError, match=r"nan_c returned nan for completion 2 \('c'\)"),
    ):
        pool(None, ["a", "b", "c", "d"], None)


def test_a_reward_call_over_its_time_limit_is_an_error_naming_it(bad_module):
    import signal

    before = signal.getsignal(signal.SIGALRM)
    pool = RewardPool([{"name": "happy_binary"}, {"name": f"{bad_module}:slow"}], timeout_s=0.2)
    with pytest.raises(RewardError, match=r"reward bad_rewards_mod:slow took longer than 0.2 s"):
        pool(["p", "p"], ["a", "b"], None)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is before
    with (
        RewardPool([{"name": f"{bad_module}:slow"}], workers=1, timeout_s=0.2) as pool,
        pytest.raises(RewardError, match=r"reward bad_rewards_mod:slow took longer than 0.2 s"),
    ):
        pool(None, ["a", "b"], None)


def test_a_worker_deaf_to_the_time_limit_is_stopped(bad_module, monkeypatch):
    monkeypatch.setattr(RewardPool, "WORKER_MARGIN_S", 0.5)
    pool = RewardPool([{"name": f"{bad_module}:deaf"}], workers=1, timeout_s=0.2)
    workers = list(pool._executor._processes.values())
    with pytest.raises(RewardError, match=r"a worker did not answer within 0.7 s"):
        pool(None, ["a", "b"], None)
    # The executor's own thread reaps the killed worker too; whichever waitpid loses sees
    # ECHILD, and the Process reports alive until the winner has stored the exit code.
    deadline = time.monotonic() + 30
    while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(w.is_alive() for w in workers)
    with pytest.raises(RuntimeError, match="closed"):
        pool(None, ["a", "b"], None)
