"""Chess FEN transitions, generated offline (the chess tasks): "FEN: <fen> Move: <move> Next FEN:" and
the FEN after the move.

Positions come from random legal games: each example plays a uniformly random number of plies
(0..max_plies, stopping early at a finished game) of uniformly random legal moves from the
initial position, then one more random legal move is the example's move. One `random.Random(seed)`
drives everything, so a seed always gives the same examples. FENs follow the FEN specification's
en passant rule (`en_passant="fen"`), as the rewards (smollab.rewards.chess_fen) do: they
recompute the answer from the prompt alone, so a prompts file needs no answers beside it.

    python -m smollab.data.chess_fen --out data/chess --prompts 256 --corpus 50000

writes `prompts.txt` (one GRPO prompt a line, for grpo.prompts_file), the same as data in
`prompts.jsonl` (`fen`, `move` and `next_fen` columns, which the FEN rewards read instead of
recomputing the answer), `pairs.jsonl` ({"prompt", "answer"} per line, for SFT or evaluation)
and `corpus.txt` (one whole transition a line, for `smollab pretrain` with data.source=files; no
corpus line shares a prompt with prompts.txt, so GRPO is scored on positions pretraining never
showed).

`--move-prompts N` also writes `move_prompts.txt`: N prompts "FEN: <fen> Move:" of distinct
positions for the legal-move task (reward chess_legal_move), drawn from the same stream after the
prompts and the corpus, so adding it changes no other file; and `move_prompts.jsonl`, the same
with `fen` and `legal_moves` (UCI) columns. A file is written only when its count
is above 0. `--exclude FILE...` keeps out of move_prompts.txt every position (placement, side,
castling, en passant) written after "FEN: " in those files, drawing on until N remain; a held-out
set that neither pretraining nor GRPO saw is another seed with the training files excluded:

    python -m smollab.data.chess_fen --out data/chess --move-prompts 2048
    python -m smollab.data.chess_fen --out data/chess-heldout --seed 1 --prompts 0 --corpus 0 \
        --move-prompts 256 --exclude data/chess/corpus.txt data/chess/prompts.txt \
        data/chess/move_prompts.txt
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from smollab.errors import UserError
from smollab.rundir.atomic import atomic_write_text

NOTATIONS = ("uci", "san")
FEN_IN_TEXT = re.compile(r"FEN: (\S+ [wb] \S+ \S+)")  # a position: the first four fields


def _chess() -> Any:
    try:
        import chess
    except ImportError:
        raise UserError("chess data needs python-chess: pip install 'smollab[chess]'") from None
    return chess


def prompt_of(fen: str, move: str) -> str:
    return f"FEN: {fen} Move: {move} Next FEN:"


def move_prompt_of(fen: str) -> str:
    """The legal-move task's prompt: the model writes the move."""
    return f"FEN: {fen} Move:"


def examples(
    n: int, seed: int = 0, max_plies: int = 80, notation: str = "uci"
) -> list[dict[str, str]]:
    """`n` examples {"prompt", "answer"} from random legal games (see the module docstring)."""
    if n < 0:
        raise UserError(f"n must be >= 0, got {n}")
    return list(itertools.islice(stream(seed, max_plies, notation), n))


def stream(seed: int = 0, max_plies: int = 80, notation: str = "uci") -> Iterator[dict[str, str]]:
    """The endless example stream `examples` takes its prefix of: one seed, one sequence."""
    chess = _chess()
    if notation not in NOTATIONS:
        raise UserError(f"notation {notation!r}: expected one of {', '.join(NOTATIONS)}")
    if max_plies < 0:
        raise UserError(f"max_plies must be >= 0, got {max_plies}")
    return _games(chess, random.Random(seed), max_plies, notation)


def _games(
    chess: Any, rng: random.Random, max_plies: int, notation: str
) -> Iterator[dict[str, str]]:
    while True:
        board = chess.Board()
        for _ in range(rng.randint(0, max_plies)):
            moves = list(board.legal_moves)
            if not moves:
                break
            board.push(rng.choice(moves))
        moves = list(board.legal_moves)
        if not moves:  # mate or stalemate: no move to ask about
            continue
        move = rng.choice(moves)
        text = board.uci(move) if notation == "uci" else board.san(move)
        fen = board.fen(en_passant="fen")
        board.push(move)
        yield {"prompt": prompt_of(fen, text), "answer": board.fen(en_passant="fen")}


def position(fen: str) -> str:
    """A FEN's first four fields (placement, side to move, castling, en passant): the position,
    whatever the move counters say."""
    return " ".join(fen.split()[:4])


def excluded_positions(files: Sequence[str | Path]) -> set[str]:
    """Every position after a "FEN: " in `files` (prompts, corpus lines' both FENs, pairs, move
    prompts); UserError naming a file that is missing or shows none."""
    seen: set[str] = set()
    for f in files:
        try:
            text = Path(f).read_text(encoding="utf-8")
        except OSError as e:
            raise UserError(f"--exclude {f}: cannot read it ({e.strerror or e})") from None
        found = FEN_IN_TEXT.findall(text)
        if not found:
            raise UserError(f"--exclude {f}: no 'FEN: <fen>' in it")
        seen.update(found)
    return seen


def move_prompts_from(
    rows: Iterator[dict[str, str]],
    n: int,
    exclude: Iterable[str] = (),
    max_draws: int | None = None,
) -> list[str]:
    """`n` prompts "FEN: <fen> Move:" of distinct positions from `rows`, none in `exclude`."""
    out: list[str] = []
    seen = set(exclude)
    limit = max_draws if max_draws is not None else 100 * n + 10_000
    for draws, row in enumerate(rows, 1):
        if len(out) >= n:
            break
        if draws > limit:
            raise UserError(
                f"--move-prompts {n}: only {len(out)} new positions in {limit} "
                "random games (--exclude covers the rest; raise --max-plies)"
            )
        fen = row["prompt"].removeprefix("FEN: ").partition(" Move: ")[0]
        if position(fen) not in seen:
            seen.add(position(fen))
            out.append(move_prompt_of(fen))
    return out


def write_prompts(path: str | Path, rows: Sequence[dict[str, str]]) -> Path:
    """One prompt a line: the format grpo.prompts_file reads."""
    p = Path(path)
    atomic_write_text(p, "".join(r["prompt"] + "\n" for r in rows))
    return p


def write_pairs(path: str | Path, rows: Sequence[dict[str, str]]) -> Path:
    """JSON lines of {"prompt", "answer"}."""
    p = Path(path)
    atomic_write_text(p, "".join(json.dumps(r) + "\n" for r in rows))
    return p


def write_table(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    """JSON lines of the task as data: a prompt and the columns its rewards read."""
    p = Path(path)
    atomic_write_text(p, "".join(json.dumps(r) + "\n" for r in rows))
    return p


def transition_row(row: dict[str, str]) -> dict[str, str]:
    """A FEN transition as data: the prompt, its `fen` and `move`, the `next_fen` to write."""
    fen, _, move = (
        row["prompt"].removeprefix("FEN: ").removesuffix(" Next FEN:").partition(" Move: ")
    )
    return {"prompt": row["prompt"], "fen": fen, "move": move, "next_fen": row["answer"]}


def move_row(prompt: str) -> dict[str, Any]:
    """A legal-move prompt as data: the prompt, its `fen` and its `legal_moves` in UCI."""
    chess = _chess()
    fen = prompt.removeprefix("FEN: ").removesuffix(" Move:")
    moves = sorted(m.uci() for m in chess.Board(fen).legal_moves)
    return {"prompt": prompt, "fen": fen, "legal_moves": moves}


def write_corpus(path: str | Path, rows: Sequence[dict[str, str]]) -> Path:
    """One transition a line ("FEN: ... Move: ... Next FEN: ..."): with no blank line in the
    file, data.source=files reads each line as one document."""
    p = Path(path)
    atomic_write_text(p, "".join(f"{r['prompt']} {r['answer']}\n" for r in rows))
    return p


def write_all(
    out: str | Path,
    *,
    prompts: int,
    corpus: int,
    seed: int = 0,
    max_plies: int = 80,
    notation: str = "uci",
    move_prompts: int = 0,
    exclude: Sequence[str | Path] = (),
) -> dict[str, Path]:
    """prompts.txt and pairs.jsonl (`prompts` examples), corpus.txt (`corpus` examples from the
    same stream, any whose prompt is in prompts.txt dropped) and move_prompts.txt (`move_prompts`
    positions from the stream after them, none in `exclude`'s files) under `out`; a file whose
    count is 0 is not written."""
    if min(prompts, corpus, move_prompts) < 0 or max(prompts, corpus, move_prompts) < 1:
        raise UserError(
            f"--prompts, --corpus and --move-prompts must be >= 0, one of them > 0, "
            f"got {prompts}, {corpus} and {move_prompts}"
        )
    if exclude and not move_prompts:
        raise UserError("--exclude filters move_prompts.txt: give --move-prompts N as well")
    banned = excluded_positions(exclude)  # before any work: a bad file fails fast
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    rows = stream(seed, max_plies, notation)
    held = list(itertools.islice(rows, prompts))
    rest = list(itertools.islice(rows, corpus))
    paths = {}
    if prompts:
        paths["prompts"] = write_prompts(d / "prompts.txt", held)
        paths["pairs"] = write_pairs(d / "pairs.jsonl", held)
        paths["prompts_table"] = write_table(d / "prompts.jsonl", [transition_row(r) for r in held])
    if corpus:
        seen = {r["prompt"] for r in held}
        train = [r for r in rest if r["prompt"] not in seen]
        paths["corpus"] = write_corpus(d / "corpus.txt", train)
    if move_prompts:
        lines = move_prompts_from(rows, move_prompts, banned)
        paths["move_prompts"] = d / "move_prompts.txt"
        atomic_write_text(paths["move_prompts"], "".join(f"{x}\n" for x in lines))
        paths["move_prompts_table"] = write_table(
            d / "move_prompts.jsonl", [move_row(x) for x in lines]
        )
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m smollab.data.chess_fen", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--out", default="data/chess", help="directory for the files")
    p.add_argument("--prompts", type=int, default=256, help="GRPO prompts (and pairs.jsonl rows)")
    p.add_argument("--corpus", type=int, default=50_000, help="pretraining transitions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-plies", type=int, default=80, help="longest random game before the move")
    p.add_argument("--notation", choices=NOTATIONS, default="uci")
    p.add_argument(
        "--move-prompts",
        type=int,
        default=0,
        help="legal-move prompts 'FEN: <fen> Move:' (move_prompts.txt), distinct positions",
    )
    p.add_argument(
        "--exclude",
        nargs="+",
        default=[],
        metavar="FILE",
        help="keep out of move_prompts.txt every position these files show",
    )
    a = p.parse_args(argv)
    try:
        paths = write_all(
            a.out,
            prompts=a.prompts,
            corpus=a.corpus,
            seed=a.seed,
            max_plies=a.max_plies,
            notation=a.notation,
            move_prompts=a.move_prompts,
            exclude=a.exclude,
        )
    except UserError as e:
        print(f"smollab: error: {e}")
        return 2
    print("wrote " + ", ".join(str(v) for v in paths.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
