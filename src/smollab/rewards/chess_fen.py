"""Chess FEN-transition rewards (the chess FEN task): the model reads "FEN: <fen> Move: <move> Next FEN:"
and completes the FEN after the move.

The true answer is the data's `next_fen` column (prompts.jsonl of smollab.data.chess_fen), or,
for text prompts, recomputed from the prompt with python-chess (cached per distinct prompt). The completion's answer is its first non-empty line,
whitespace collapsed. FENs follow the FEN specification's en passant rule (python-chess's
`en_passant="fen"`): the square is written after every two-step pawn move, capturable or not, so
the answer depends on the move alone and not on a legality search.

- `fen_valid`: 1 when the answer has the six FEN fields and python-chess parses it into a valid
  position (`Board.is_valid()`: kings, pawns, checks, castling rights and en passant agree).
- `fen_exact`: 1 when the answer equals the true FEN, all six fields; `clocks=False` compares only
  the first four (placement, side to move, castling, en passant) of an answer of four or six
  fields, ignoring the two move counters.
- `fen_distance`: 1 - normalized Levenshtein distance (rapidfuzz: distance / longer length) to
  the true FEN, in [0, 1], computed pairwise in one C call (`process.cpdist`).

python-chess and rapidfuzz are the `chess` extra, imported only when a chess reward runs.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from smollab.errors import UserError
from smollab.rewards.conversation import plain_text

EXTRA_HINT = "pip install 'smollab[chess]'"
PROMPT_RE = re.compile(r"^\s*FEN:\s*(?P<fen>\S.*?)\s+Move:\s*(?P<move>\S+)\s+Next FEN:\s*$")
_PROBE_PROMPT = "FEN: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 Move: e2e4 Next FEN:"


def require(reward: str) -> Any:
    """The `chess` module, or one line naming the extra that installs it and rapidfuzz."""
    try:
        import chess
        import rapidfuzz  # noqa: F401
    except ImportError as e:
        raise UserError(
            f"{reward} needs python-chess and rapidfuzz ({e.name or e} is missing): {EXTRA_HINT}"
        ) from None
    return chess


def valid_board(chess: Any, fen: str, reward: str) -> Any:
    """A prompt's position as a python-chess Board; UserError naming `reward` and the FEN when it
    is not a valid position."""
    try:
        board = chess.Board(fen)
        ok = board.is_valid()
    except ValueError:
        ok = False
    if not ok:  # WordPiece lower-cases, and a FEN's case tells white from black
        raise UserError(
            f"{reward}: prompt FEN {fen!r} is not a valid position (a model whose "
            "tokenizer folds case needs data.tokenizer=bpe)"
        )
    return board


@functools.lru_cache(maxsize=65536)
def true_fen(prompt: str) -> str:
    """The FEN after the prompt's move (UCI or SAN) from the prompt's FEN; UserError naming the
    prompt when it is not a legal chess prompt."""
    chess = require("chess rewards")
    m = PROMPT_RE.match(prompt)
    if not m:
        raise UserError(
            f"chess rewards: prompt {prompt[:80]!r} is not 'FEN: <fen> Move: <move> "
            "Next FEN:' (grpo.prompts_file: see smollab.data.chess_fen)"
        )
    board = valid_board(chess, m["fen"], "chess rewards")
    move = _parse_move(chess, board, m["move"])
    if move is None:
        raise UserError(f"chess rewards: move {m['move']!r} is not legal in {m['fen']!r}")
    board.push(move)
    return board.fen(en_passant="fen")


def _parse_move(chess: Any, board: Any, text: str) -> Any:
    try:
        move = chess.Move.from_uci(text)
        if move in board.legal_moves:
            return move
    except ValueError:
        pass
    try:
        return board.parse_san(text)
    except ValueError:
        return None


def answer(completion: str) -> str:
    """The completion's first non-empty line, whitespace collapsed to single spaces."""
    for line in completion.splitlines():
        if line.strip():
            return " ".join(line.split())
    return ""


def _truths(prompts: list[str] | None, n: int, reward: str) -> list[str]:
    if prompts is None or len(prompts) != n:
        raise UserError(
            f"{reward}: needs one prompt per completion (got "
            f"{'none' if prompts is None else len(prompts)} for {n})"
        )
    return [true_fen(p) for p in prompts]  # lru_cache: one python-chess push per distinct prompt


@functools.lru_cache(maxsize=65536)
def _is_valid(chess: Any, text: str) -> bool:
    if len(text.split(" ")) != 6:
        return False
    try:
        return chess.Board(text).is_valid()
    except ValueError:
        return False


@plain_text
def fen_valid(
    completions: list[str], prompts: list[str] | None = None, **kwargs: Any
) -> list[float]:
    """1.0 when the answer is a six-field FEN of a valid position, else 0.0 (prompts unused)."""
    chess = require("fen_valid")
    return [1.0 if _is_valid(chess, answer(c)) else 0.0 for c in completions]


@plain_text
def fen_exact(
    completions: list[str],
    prompts: list[str] | None = None,
    next_fen: list[str] | None = None,
    *,
    clocks: bool = True,
    **kwargs: Any,
) -> list[float]:
    """1.0 when the answer equals the true next FEN (all six fields, or four without `clocks`):
    the `next_fen` column, else computed from the prompt."""
    require("fen_exact")
    if not isinstance(clocks, bool):
        raise UserError(f"fen_exact: clocks must be true or false, got {clocks!r}")
    truths = next_fen or _truths(prompts, len(completions), "fen_exact")
    return [
        1.0 if _same(answer(c), t, clocks) else 0.0
        for c, t in zip(completions, truths, strict=True)
    ]


def _same(text: str, truth: str, clocks: bool) -> bool:
    if clocks:
        return text == truth
    fields = text.split(" ")
    return len(fields) in (4, 6) and fields[:4] == truth.split(" ")[:4]


@plain_text
def fen_distance(
    completions: list[str],
    prompts: list[str] | None = None,
    next_fen: list[str] | None = None,
    **kwargs: Any,
) -> list[float]:
    """1 - normalized Levenshtein distance between the answer and the true next FEN (the
    `next_fen` column, else computed from the prompt)."""
    require("fen_distance")
    import numpy as np
    from rapidfuzz import process
    from rapidfuzz.distance import Levenshtein

    truths = next_fen or _truths(prompts, len(completions), "fen_distance")
    if not completions:
        return []
    sims = process.cpdist(
        [answer(c) for c in completions],
        truths,
        dtype=np.float64,
        scorer=Levenshtein.normalized_similarity,
    )
    return [float(x) for x in sims]


def fen_distance_serial(
    completions: list[str], prompts: list[str] | None = None, **kwargs: Any
) -> list[float]:
    """fen_distance one pair at a time with no cache: the baseline benchmarks/chess_rewards.py
    measures the batched version against (not registered)."""
    require("fen_distance")
    from rapidfuzz.distance import Levenshtein

    truths = [true_fen.__wrapped__(p) for p in prompts or []]
    return [
        Levenshtein.normalized_similarity(answer(c), t)
        for c, t in zip(completions, truths, strict=True)
    ]


# validate_specs' dry call: a chess prompt, since a story prompt is refused.
_PROBE = {
    "prompts": [_PROBE_PROMPT],
    "completions": ["8/8/8/8 w - - 0 1"],
    "completion_ids": [[1, 2, 3]],
}
for _fn in (fen_valid, fen_exact, fen_distance):
    _fn.probe = _PROBE  # type: ignore[attr-defined]
