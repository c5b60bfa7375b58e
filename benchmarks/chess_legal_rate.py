"""The legal-move rate of a model on held-out positions (the chess legal-move task), never run by CI.

GRPO's evaluation records the mean `chess_legal_move` reward, which mixes legal moves (1.0) with
moves of the right colour's piece (0.25); this prints the fraction of legal moves alone, sampled
(temperature 1) and greedy, for each model given, on the same prompts:

    python benchmarks/chess_legal_rate.py data/chess-heldout/move_prompts.txt \
        runs/chess-fen-1.25m runs/chess-legal-move [--n 8]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from smollab.engine.sample_texts import sample_texts
from smollab.rewards.chess_moves import chess_legal_move


def legal_rate(run: str, prompts: list[str], n: int, temperature: float) -> float:
    pairs = list(
        sample_texts(
            run,
            prompts,
            n=n,
            max_new_tokens=6,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            seed=0,
            device="cpu",
        )
    )
    shown = [p for p, _ in pairs]
    completions = [full[len(p) :] for p, full in pairs]
    rewards = chess_legal_move(completions, shown, own_piece=0.0)
    return sum(r == 1.0 for r in rewards) / len(rewards)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prompts", help="a move_prompts.txt file: 'FEN: <fen> Move:' per line")
    ap.add_argument("runs", nargs="+", help="run directories or checkpoints")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt at temperature 1")
    args = ap.parse_args()
    prompts = [line.strip() for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    print(f"{len(prompts)} positions from {args.prompts}")
    print(f"{'model':<40}{'sampled (T=1)':>15}{'greedy':>10}")
    for run in args.runs:
        sampled = legal_rate(run, prompts, args.n, 1.0)
        greedy = legal_rate(run, prompts, 1, 0.0)
        print(f"{run:<40}{sampled:>15.1%}{greedy:>10.1%}")


if __name__ == "__main__":
    main()
