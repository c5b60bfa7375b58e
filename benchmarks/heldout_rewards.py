"""Each reward's mean on held-out prompts from data, for each model given, never run by CI.

The prompts (a .jsonl, .csv or .parquet table, or a .txt file) are encoded as training encodes
them (text after a document break, chat messages through the model's chat template), sampled
greedy and at temperature 1 (`--n` per prompt), and scored by the named rewards with the
table's columns, exactly as `smollab grpo` scores them:

    python benchmarks/heldout_rewards.py data/wordle/heldout.jsonl runs/wordle-1.25m \
        runs/grpo/wordle --reward wordle_format wordle_feedback_use wordle_info_gain \
        wordle_solved [--n 4] [--max-new-tokens 32]

`--show K` prints the first K greedy completions of each model.
"""

from __future__ import annotations

import argparse
import time

from smollab.data.prompt_encode import encode_rows
from smollab.data.prompt_rows import file_rows
from smollab.engine.sample_texts import load_sampler
from smollab.rewards.registry import compute_rewards, validate_specs


def scores(run, rows, rewards, n, temperature, max_new_tokens):
    """({reward key: mean}, greedy texts) of `run` on `rows`, `n` samples a prompt."""
    sampler, tokenizer, _ = load_sampler(run, "cpu")
    ids = encode_rows(rows, tokenizer, run).ids
    owners = [i for i in range(len(rows)) for _ in range(n)]
    r = sampler.generate([ids[i] for i in owners], max_new_tokens, temperature=temperature, seed=0)
    texts = r.completion_texts(tokenizer)
    values = compute_rewards(rewards, None, texts, r.completion_rows(), rows=rows.select(owners))
    return {k: sum(v) / len(v) for k, v in values.items()}, texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prompts", help="held-out prompts: a table with a prompt column, or .txt")
    ap.add_argument("runs", nargs="+", help="run directories, checkpoints or hub ids")
    ap.add_argument("--reward", nargs="+", required=True, help="reward names (module:function)")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt at temperature 1")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--show", type=int, default=0, help="print this many greedy completions")
    args = ap.parse_args()
    rows = file_rows(args.prompts, "prompts")
    rewards = validate_specs([{"name": r} for r in args.reward], list(rows.columns), rows.source)
    print(f"{len(rows)} prompts from {args.prompts}")
    for run in args.runs:
        t0 = time.perf_counter()
        sampled, _ = scores(run, rows, rewards, args.n, 1.0, args.max_new_tokens)
        greedy, texts = scores(run, rows, rewards, 1, 0.0, args.max_new_tokens)
        print(f"{run} ({time.perf_counter() - t0:.1f} s)")
        print(f"  {'reward':<24}{'sampled (T=1)':>15}{'greedy':>10}")
        for r in rewards:
            print(f"  {r.key:<24}{sampled[r.key]:>15.3f}{greedy[r.key]:>10.3f}")
        for t in texts[: args.show]:
            print(f"  -> {t!r}")


if __name__ == "__main__":
    main()
