"""Chess legal-move reward (the chess legal-move task): the model reads "FEN: <fen> Move:" and writes a move.

`chess_legal_move` scores the completion's first whitespace-separated token: 1.0 when it is a
legal move in the prompt's position, written in UCI ("e2e4", "e7e8q", castling "e1g1") or, when
the token is not UCI-shaped, in SAN ("Nf3", "O-O"); else `own_piece` (default 0.25) when it parses
as UCI and its from-square holds a piece of the side to move, a partial credit that ranks "moves
the right piece wrongly" above noise within a GRPO group; else 0.0 (empty, garbage, the null move
"0000", an empty square or the opponent's piece). Legality is python-chess's `board.legal_moves`.

With the task as data (move_prompts.jsonl: `fen` and `legal_moves` columns) the position and
the legal moves come from the row instead of the prompt and python-chess's move generation.

The FEN-transition base model (configs/pretrain/chess-fen-1.25m.yaml) already writes a move after
"FEN: <fen> Move:"; `python -m smollab.data.chess_fen --move-prompts N` writes such prompts. The
board is parsed once per distinct prompt and each (prompt, token) classified once (lru_cache),
since a GRPO group repeats its prompt and often its answers.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

from smollab.errors import UserError
from smollab.rewards.chess_fen import require, valid_board
from smollab.rewards.conversation import plain_text

MOVE_PROMPT_RE = re.compile(r"^\s*FEN:\s*(?P<fen>\S.*?)\s+Move:\s*$")
_PROBE_PROMPT = "FEN: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 Move:"
LEGAL, OWN_PIECE, OTHER = 2, 1, 0


def fen_of(prompt: str) -> str:
    """The FEN of a "FEN: <fen> Move:" prompt; UserError naming the prompt otherwise."""
    m = MOVE_PROMPT_RE.match(prompt)
    if not m:
        raise UserError(
            f"chess_legal_move: prompt {prompt[:80]!r} is not 'FEN: <fen> Move:' and no `fen` "
            "column gives the position (python -m smollab.data.chess_fen --move-prompts N)"
        )
    return m["fen"]


@functools.lru_cache(maxsize=65536)
def board_of(fen: str) -> Any:
    """The position of `fen` (a shared python-chess Board: read it, never push); UserError
    naming it when it is not a valid position."""
    return valid_board(require("chess_legal_move"), fen, "chess_legal_move")


@functools.lru_cache(maxsize=262144)
def classify(fen: str, token: str, legal: frozenset[str] | None = None) -> int:
    """LEGAL, OWN_PIECE or OTHER for one answer token in the position `fen`; `legal`: the legal
    moves in UCI as the data lists them (else python-chess's move generation)."""
    chess = require("chess_legal_move")
    board = board_of(fen)
    try:
        move = chess.Move.from_uci(token)
    except ValueError:  # not UCI-shaped: SAN, else nothing
        try:
            move = board.parse_san(token)
        except ValueError:
            return OTHER
        return LEGAL if move and move in board.legal_moves else OTHER  # "--" parses as null
    if not move:  # "0000", the null move: no from-square
        return OTHER
    if move.uci() in legal if legal is not None else move in board.legal_moves:
        return LEGAL
    piece = board.piece_at(move.from_square)
    return OWN_PIECE if piece is not None and piece.color == board.turn else OTHER


@plain_text
def chess_legal_move(
    completions: list[str],
    prompts: list[str] | None = None,
    fen: list[str] | None = None,
    legal_moves: list[list[str]] | None = None,
    *,
    own_piece: float = 0.25,
    **kwargs: Any,
) -> list[float]:
    """1.0 for a legal move, `own_piece` for a UCI move of a piece of the side to move, else 0.
    The position is the `fen` column (else read from the prompt), the legal UCI moves the
    `legal_moves` column (else python-chess's)."""
    require("chess_legal_move")
    if (
        isinstance(own_piece, bool)
        or not isinstance(own_piece, int | float)
        or not math.isfinite(own_piece)
        or not 0 <= own_piece <= 1
    ):
        raise UserError(
            f"chess_legal_move: own_piece must be a number in [0, 1], got {own_piece!r}"
        )
    if fen is None and (prompts is None or len(prompts) != len(completions)):
        raise UserError(
            f"chess_legal_move: needs one prompt per completion (got "
            f"{'none' if prompts is None else len(prompts)} for {len(completions)})"
        )
    fens = fen if fen is not None else [fen_of(p) for p in prompts]
    legal = (
        [None] * len(completions) if legal_moves is None else [frozenset(m) for m in legal_moves]
    )
    score = {LEGAL: 1.0, OWN_PIECE: float(own_piece), OTHER: 0.0}
    out = []
    for c, f, ok in zip(completions, fens, legal, strict=True):
        board_of(f)  # refuses a bad position even when the completion is empty
        words = c.split()
        out.append(score[classify(f, words[0], ok)] if words else 0.0)
    return out


# validate_specs' dry call: a move prompt, since a story prompt is refused.
chess_legal_move.probe = {
    "prompts": [_PROBE_PROMPT],
    "completions": ["e2e4"],  # type: ignore[attr-defined]
    "completion_ids": [[1, 2, 3]],
}
