"""wordle_info_gain, vectorized (numpy) vs plain Python, on 256 completions (never run by CI).

The batch is GRPO-shaped: 16 prompts x 16 completions. Each prompt is a position of a
solver-played game (turn 1 to the turn before the solve, so candidate sets from all 303 words
down to a few); each completion guesses a random listed word, the solver's word, or a
five-letter non-word. Printed: the CPU, the one-time cost of the word x word feedback-code table
(paid once per process, in the trainer or in each pool worker), the median seconds of `--repeats`
calls of each implementation, their ratio, and whether the values agree.

    PYTHONPATH=src python benchmarks/wordle_rewards.py
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from smollab.data.wordle import WORDS, completion, parse_guess, word_table
from smollab.data.wordle_games import sample_secrets, solver_game
from smollab.device.mfu import cpu_model_name
from smollab.rewards.wordle import info_gain_plain, wordle_info_gain


def batch(prompts: int, per_prompt: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    ps, cs = [], []
    for secret in sample_secrets(prompts, seed):
        prompt, solver_completion = rng.choice(solver_game(secret, rng, top_k=3))
        for _ in range(per_prompt):
            roll = rng.random()
            if roll < 0.6:
                guess = rng.choice(WORDS)
            elif roll < 0.9:
                guess = parse_guess(solver_completion)
            else:
                guess = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(5))
            ps.append(prompt)
            cs.append(completion("hm", guess))
    return ps, cs


def timed(fn, repeats: int) -> tuple[float, list[float]]:
    times, out = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--per-prompt", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    prompts, comps = batch(a.prompts, a.per_prompt, a.seed)
    word_table.cache_clear()
    t = time.perf_counter()
    word_table()
    table_s = time.perf_counter() - t
    vec_s, vec = timed(lambda: wordle_info_gain(comps, prompts=prompts), a.repeats)
    plain_s, plain = timed(lambda: info_gain_plain(comps, prompts), a.repeats)
    agree = max(abs(x - y) for x, y in zip(vec, plain, strict=True)) < 1e-9
    print(f"cpu: {cpu_model_name()}")
    print(
        f"completions: {len(comps)} ({a.prompts} prompts x {a.per_prompt}), "
        f"median of {a.repeats} calls"
    )
    print(f"feedback-code table ({len(WORDS)}x{len(WORDS)}), once per process: {table_s:.4f} s")
    print(
        f"vectorized: {vec_s:.4f} s   plain Python: {plain_s:.4f} s   "
        f"ratio plain/vectorized: {plain_s / vec_s:.1f}x   values agree: {agree}"
    )


if __name__ == "__main__":
    main()
