"""Word-problem accuracy of models on a prompts file (the offline word-problem task), never run by CI.

The fraction of completions the checker `word_problem_correct` accepts, sampled (temperature 1,
`--n` per prompt) and greedy, for each model given, on the same prompts:

    python benchmarks/word_problem_accuracy.py data/word-problems/heldout.txt \
        runs/word-problems-1.25m runs/rft-word-problems [--n 8]

`--show K` prints the first K greedy completions of each model (what it writes, right or not).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from smollab.engine.sample_texts import sample_texts
from smollab.rewards.word_problems import word_problem_correct


def completions(
    run: str, prompts: list[str], n: int, temperature: float, max_new_tokens: int
) -> tuple[list[str], list[str]]:
    pairs = list(
        sample_texts(
            run,
            prompts,
            n=n,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            seed=0,
            device="cpu",
        )
    )
    return [p for p, _ in pairs], [full[len(p) :] for p, full in pairs]


def accuracy(
    run: str, prompts: list[str], n: int, temperature: float, max_new_tokens: int
) -> tuple[float, list[str]]:
    shown, texts = completions(run, prompts, n, temperature, max_new_tokens)
    rewards = word_problem_correct(texts, shown)
    return sum(rewards) / len(rewards), texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prompts", help="a heldout.txt or prompts.txt file: one prompt a line")
    ap.add_argument("runs", nargs="+", help="run directories or checkpoints")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt at temperature 1")
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--show", type=int, default=0, help="print this many greedy completions")
    args = ap.parse_args()
    prompts = [line.strip() for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    print(f"{len(prompts)} prompts from {args.prompts}")
    print(f"{'model':<40}{'sampled (T=1)':>15}{'greedy':>10}{'seconds':>9}")
    for run in args.runs:
        t0 = time.perf_counter()
        sampled, _ = accuracy(run, prompts, args.n, 1.0, args.max_new_tokens)
        greedy, texts = accuracy(run, prompts, 1, 0.0, args.max_new_tokens)
        took = time.perf_counter() - t0
        print(f"{run:<40}{sampled:>15.1%}{greedy:>10.1%}{took:>9.1f}")
        for p, t in list(zip(prompts, texts, strict=True))[: args.show]:
            print(f"  {p[-60:]!r} -> {t!r}")


if __name__ == "__main__":
    main()
