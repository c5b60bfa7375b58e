"""Wordle games: secret sampling, a solver, solver-played transcripts, games mid-play as data,
and `play_games`, the multi-turn evaluation of any model callable.

The solver plays hard mode (it guesses only words consistent with all feedback so far, so its
transcripts teach the use of feedback) and picks the candidate of highest expected information;
`top_k > 1` picks at random among the k best, so transcripts are not one fixed opening.

Files, in the seed's format (`smollab.data.wordle`):
    python -m smollab.data.wordle_games transcripts data/wordle/transcripts.txt --games 4000
    python -m smollab.data.wordle_games games data/wordle/train.jsonl --n 2000
    python -m smollab.data.wordle_games games data/wordle/heldout.jsonl --n 200 --seed 1
    python -m smollab.data.wordle_games games data/wordle/chat-train.jsonl --n 2000 --chat
A transcript line is a prompt, a space and the solver's completion (one pretraining document a
line, as data.source=files reads them). A games row is a position of a solver-played game (turn
1 to the turn before the solve, so GRPO sees every stage): `prompt` (text, or with --chat the
system and user messages), `secret` and `past_guess_history`, the columns the rewards read.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from smollab.data.wordle import (
    NUM_CODES,
    WORDS,
    build_chat,
    build_prompt,
    candidate_mask,
    completion,
    entropy_bits,
    feedback,
    history_row,
    is_word,
    parse_guess,
    parse_history,
    word_table,
)
from smollab.rundir.atomic import atomic_write_text

GenerateFn = Callable[[list[Any]], Sequence[str]]
History = list[tuple[str, str]]


def sample_secrets(n: int, seed: int = 0) -> list[str]:
    """`n` secrets from WORDS: without repeats while n <= len(WORDS), then with."""
    rng = random.Random(seed)
    return rng.sample(WORDS, n) if n <= len(WORDS) else rng.choices(WORDS, k=n)


def solver_move(
    history: History, rng: random.Random | None = None, top_k: int = 1
) -> tuple[str, int]:
    """(guess, candidates left) for the position `history`: the consistent word whose feedback
    partitions the candidates best (highest entropy); ties and `top_k` resolved by `rng`."""
    table, _ = word_table()
    idx = np.flatnonzero(candidate_mask(history))
    if len(idx) == 0:
        raise ValueError(f"no word of the list is consistent with {history}")
    sub = table[np.ix_(idx, idx)].astype(np.intp)  # rows: secrets, cols: guesses
    n = len(idx)
    counts = np.bincount((sub + NUM_CODES * np.arange(n)).ravel(), minlength=NUM_CODES * n)
    gains = entropy_bits(counts.reshape(n, NUM_CODES))
    rng = rng or random.Random(0)
    order = sorted(range(n), key=lambda j: (-round(gains[j], 9), rng.random()))
    return WORDS[idx[rng.choice(order[:top_k])]], n


def solver_completion(history: History, rng: random.Random | None = None, top_k: int = 1) -> str:
    guess, left = solver_move(history, rng, top_k)
    return completion(_think(left), guess)


def _think(left: int) -> str:
    return f"{left} words still fit"


def solver_turns(
    secret: str, rng: random.Random, top_k: int = 1, max_turns: int = 12
) -> list[tuple[History, str, int]]:
    """A whole solver-played game: per turn, the history before it, the guess and the
    candidates it chose among."""
    history: History = []
    turns = []
    for _ in range(max_turns):
        guess, left = solver_move(history, rng, top_k)
        turns.append((list(history), guess, left))
        if guess == secret:
            break
        history.append((guess, feedback(secret, guess)))
    return turns


def solver_game(
    secret: str, rng: random.Random, top_k: int = 1, max_turns: int = 12
) -> list[tuple[str, str]]:
    """A whole solver-played game as (prompt, completion) pairs, one per turn."""
    return [
        (build_prompt(h), completion(_think(left), guess))
        for h, guess, left in solver_turns(secret, rng, top_k, max_turns)
    ]


def write_transcripts(path: str | Path, games: int, seed: int = 0, top_k: int = 3) -> int:
    """Solver-played games, one turn a line (prompt, space, completion); returns the lines."""
    rng = random.Random(seed)
    lines = [f"{p} {c}" for s in sample_secrets(games, seed) for p, c in solver_game(s, rng, top_k)]
    atomic_write_text(Path(path), "\n".join(lines) + "\n")
    return len(lines)


def game_rows(n: int, seed: int = 0, top_k: int = 3, chat: bool = False) -> list[dict[str, Any]]:
    """`n` games mid-play as rows, one per secret: a random turn of a solver-played game before
    its solve, as its prompt (text, or chat messages), `secret` and `past_guess_history`."""
    rng = random.Random(seed + 1)
    rows = []
    for secret in sample_secrets(n, seed):
        history, _, _ = rng.choice(solver_turns(secret, rng, top_k))
        rows.append(
            {
                "prompt": build_chat(history) if chat else build_prompt(history),
                "secret": secret.upper(),
                "past_guess_history": history_row(history),
            }
        )
    return rows


def write_games(path: str | Path, n: int, seed: int = 0, top_k: int = 3, chat: bool = False) -> int:
    """`game_rows` as JSON lines; returns the rows."""
    rows = game_rows(n, seed, top_k, chat)
    atomic_write_text(Path(path), "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return len(rows)


def solver_generate(prompts: list[Any]) -> list[str]:
    """The solver as a model callable (prompts, text or chat messages -> completion texts) for
    `play_games`."""
    texts = [p if isinstance(p, str) else "\n".join(m["content"] for m in p) for p in prompts]
    return [solver_completion(parse_history(t)) for t in texts]


def play_games(
    generate_fn: GenerateFn,
    secrets: Sequence[str],
    max_turns: int = 6,
    prompt: Callable[[History], Any] = build_prompt,
) -> dict:
    """Play one game per secret with `generate_fn` (a batch of prompts -> completions), each
    prompt `prompt(history)` (`build_prompt`, or `build_chat` for a chat model); all unfinished
    games advance together, one batched call a turn.

    A guess that is unreadable or not in WORDS wastes its turn (nothing is added to the history),
    as the game refuses non-words. Returns games, solved, turns (taken in all games), solve_rate,
    mean_guesses (turns to solve, over solved games; nan when none is solved), invalid_rate
    (share of turns wasted) and format_error_rate (share of turns whose completion had no
    readable `<guess>` tag: the part of invalid_rate that is the format, not the word).
    """
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    words = set(WORDS)
    histories: list[History] = [[] for _ in secrets]
    solved_at: list[int | None] = [None] * len(secrets)
    invalid = unreadable = taken = 0
    for turn in range(1, max_turns + 1):
        live = [i for i, t in enumerate(solved_at) if t is None]
        if not live:
            break
        outs = list(generate_fn([prompt(histories[i]) for i in live]))
        if len(outs) != len(live):
            raise ValueError(f"generate_fn returned {len(outs)} completions for {len(live)}")
        for i, out in zip(live, outs, strict=True):
            taken += 1
            guess = parse_guess(out)
            unreadable += guess is None
            if guess is None or not is_word(guess) or guess not in words:
                invalid += 1
            elif guess == secrets[i]:
                solved_at[i] = turn
            else:
                histories[i].append((guess, feedback(secrets[i], guess)))
    solved = [t for t in solved_at if t is not None]
    return {
        "games": len(secrets),
        "solved": len(solved),
        "turns": taken,
        "solve_rate": len(solved) / len(secrets) if secrets else 0.0,
        "mean_guesses": sum(solved) / len(solved) if solved else math.nan,
        "invalid_rate": invalid / taken if taken else 0.0,
        "format_error_rate": unreadable / taken if taken else 0.0,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m smollab.data.wordle_games",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("kind", choices=("transcripts", "games"))
    ap.add_argument("out", help="the .txt (transcripts) or .jsonl (games) file to write")
    ap.add_argument("--games", type=int, default=4000, help="transcripts: games to play")
    ap.add_argument("--n", type=int, default=2000, help="games: rows to write")
    ap.add_argument("--chat", action="store_true", help="games: prompts as chat messages")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--top-k", type=int, default=3, help="solver picks among the k best guesses")
    a = ap.parse_args(argv)
    if a.games < 1 or a.n < 1 or a.top_k < 1:
        ap.error("--games, --n and --top-k must be >= 1")
    if a.chat and a.kind != "games":
        ap.error("--chat writes games rows as chat messages: transcripts are text")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    if a.kind == "transcripts":
        lines = write_transcripts(a.out, a.games, a.seed, a.top_k)
    else:
        lines = write_games(a.out, a.n, a.seed, a.top_k, a.chat)
    print(f"wrote {lines} lines to {a.out}")


if __name__ == "__main__":
    main()
