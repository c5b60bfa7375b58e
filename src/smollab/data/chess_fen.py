"""Chess FEN transitions, generated offline (issue 19): "FEN: <fen> Move: <move> Next FEN:" and
the FEN after the move.

Positions come from random legal games: each example plays a uniformly random number of plies
(0..max_plies, stopping early at a finished game) of uniformly random legal moves from the
initial position, then one more random legal move is the example's move. One `random.Random(seed)`
drives everything, so a seed always gives the same examples. FENs follow the FEN specification's
en passant rule (`en_passant="fen"`), as the rewards (smollab.rewards.chess_fen) do: they
recompute the answer from the prompt alone, so a prompts file needs no answers beside it.

    python -m smollab.data.chess_fen --out data/chess --prompts 256 --corpus 50000

writes `prompts.txt` (one GRPO prompt a line, for grpo.prompts_file), `pairs.jsonl`
({"prompt", "answer"} per line, for SFT or evaluation) and `corpus.txt` (one whole transition a
line, for `smollab pretrain` with data.source=files; no corpus line shares a prompt with
prompts.txt, so GRPO is scored on positions pretraining never showed).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from smollab.atomic_files import atomic_write_text
from smollab.errors import UserError

NOTATIONS = ("uci", "san")


def _chess() -> Any:
    try:
        import chess
    except ImportError:
        raise UserError("chess data needs python-chess: pip install 'smollab[chess]'") from None
    return chess


def prompt_of(fen: str, move: str) -> str:
    return f"FEN: {fen} Move: {move} Next FEN:"


def examples(n: int, seed: int = 0, max_plies: int = 80, notation: str = "uci"
             ) -> list[dict[str, str]]:  # fmt: skip
    """`n` examples {"prompt", "answer"} from random legal games (see the module docstring)."""
    chess = _chess()
    if notation not in NOTATIONS:
        raise UserError(f"notation {notation!r}: expected one of {', '.join(NOTATIONS)}")
    if n < 0 or max_plies < 0:
        raise UserError(f"n and max_plies must be >= 0, got {n} and {max_plies}")
    rng = random.Random(seed)
    out = []
    while len(out) < n:
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
        out.append({"prompt": prompt_of(fen, text), "answer": board.fen(en_passant="fen")})
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


def write_corpus(path: str | Path, rows: Sequence[dict[str, str]]) -> Path:
    """One transition a line ("FEN: ... Move: ... Next FEN: ..."): with no blank line in the
    file, data.source=files reads each line as one document."""
    p = Path(path)
    atomic_write_text(p, "".join(f"{r['prompt']} {r['answer']}\n" for r in rows))
    return p


def write_all(out: str | Path, prompts: int, corpus: int, seed: int = 0, max_plies: int = 80,
              notation: str = "uci") -> dict[str, Path]:  # fmt: skip
    """prompts.txt and pairs.jsonl (`prompts` examples) and corpus.txt (`corpus` examples from
    the same stream, any whose prompt is in prompts.txt dropped) under `out`."""
    if prompts < 1 or corpus < 0:
        raise UserError(f"--prompts must be >= 1 and --corpus >= 0, got {prompts} and {corpus}")
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    rows = examples(prompts + corpus, seed, max_plies, notation)
    held, rest = rows[:prompts], rows[prompts:]
    seen = {r["prompt"] for r in held}
    train = [r for r in rest if r["prompt"] not in seen]
    return {
        "prompts": write_prompts(d / "prompts.txt", held),
        "pairs": write_pairs(d / "pairs.jsonl", held),
        "corpus": write_corpus(d / "corpus.txt", train),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m smollab.data.chess_fen", description=__doc__
                                .split("\n\n")[0])  # fmt: skip
    p.add_argument("--out", default="data/chess", help="directory for the three files")
    p.add_argument("--prompts", type=int, default=256, help="GRPO prompts (and pairs.jsonl rows)")
    p.add_argument("--corpus", type=int, default=50_000, help="pretraining transitions")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-plies", type=int, default=80, help="longest random game before the move")
    p.add_argument("--notation", choices=NOTATIONS, default="uci")
    a = p.parse_args(argv)
    try:
        paths = write_all(a.out, a.prompts, a.corpus, a.seed, a.max_plies, a.notation)
    except UserError as e:
        print(f"smollab: error: {e}")
        return 2
    print("wrote " + ", ".join(str(v) for v in paths.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
