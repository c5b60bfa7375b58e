"""The chess legal-move reward on hand-made positions, checked against python-chess itself."""

from __future__ import annotations

import json
import sys

import pytest

chess = pytest.importorskip("chess", reason="the chess extra (in dev) installs python-chess")
pytest.importorskip("rapidfuzz", reason="the chess extra (in dev) installs rapidfuzz")

from smollab.config.load import load_config  # noqa: E402
from smollab.data.chess_fen import write_all  # noqa: E402
from smollab.errors import UserError  # noqa: E402
from smollab.rewards import RewardError, compute_rewards, validate_specs  # noqa: E402
from smollab.rewards.chess_moves import chess_legal_move  # noqa: E402

START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
CASTLE = "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1"
PROMOTE = "8/4P3/8/8/8/8/8/k6K w - - 0 50"
BLACK = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1"
# (FEN, completion, expected reward with the default own_piece 0.25)
CASES = {
    "legal pawn push": (START, "e2e4", 1.0),
    "legal knight, text after": (START, " g1f3 Next FEN: x", 1.0),
    "own pawn, illegal": (START, "e2e5", 0.25),
    "own rook, blocked": (START, "a1a3", 0.25),
    "empty from-square": (START, "e4e5", 0.0),
    "opponent's piece": (START, "e7e5", 0.0),
    "black to move: own": (BLACK, "e7e5", 1.0),
    "black to move: white's": (BLACK, "d2d4", 0.0),
    "garbage": (START, "hello", 0.0),
    "half a move": (START, "e2e", 0.0),
    "empty": (START, "   ", 0.0),
    "null move": (START, "0000", 0.0),
    "castling short": (CASTLE, "e1g1", 1.0),
    "castling long": (CASTLE, "e1c1", 1.0),
    "king two squares up": (CASTLE, "e1e3", 0.25),
    "promotion": (PROMOTE, "e7e8q", 1.0),
    "underpromotion": (PROMOTE, "e7e8n", 1.0),
    "promotion piece missing": (PROMOTE, "e7e8", 0.25),
    "san": (START, "Nf3", 1.0),
    "san castling": (CASTLE, "O-O-O", 1.0),
    "san illegal": (START, "Nf6", 0.0),
    "san null": (START, "--", 0.0),
}


def prompt(fen: str) -> str:
    return f"FEN: {fen} Move:"


def python_chess_says(fen: str, completion: str) -> float:
    """The same verdict written out directly with python-chess: the cross-check."""
    board, words = chess.Board(fen), completion.split()
    if not words:
        return 0.0
    try:
        move = chess.Move.from_uci(words[0])
    except ValueError:
        try:
            return 1.0 if board.is_legal(board.parse_san(words[0])) else 0.0
        except ValueError:
            return 0.0
    if board.is_legal(move):
        return 1.0
    piece = board.piece_at(move.from_square) if move else None
    return 0.25 if piece is not None and piece.color == board.turn else 0.0


@pytest.mark.parametrize("name", CASES)
def test_hand_made_cases_agree_with_python_chess(name):
    fen, completion, want = CASES[name]
    assert chess_legal_move([completion], [prompt(fen)]) == [want]
    assert python_chess_says(fen, completion) == want


def test_own_piece_sets_the_partial_credit_and_each_prompt_is_its_own():
    p, b = prompt(START), prompt(BLACK)
    texts = ["e2e4", "e2e5", "e7e5", "e7e5", "e2e4"]
    assert chess_legal_move(texts, [p, p, p, b, b], own_piece=0.5) == [1.0, 0.5, 0.0, 1.0, 0.0]
    assert chess_legal_move(texts, [p] * 5, own_piece=0) == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_registered_and_own_piece_validated_by_the_registry():
    r = validate_specs([{"name": "chess_legal_move", "params": {"own_piece": 0.1}}])
    out = compute_rewards(r, [prompt(START)] * 2, ["e2e4", "e2e5"])
    assert out == {"chess_legal_move": [1.0, 0.1]}
    for bad in (1.5, -0.1, "high", True, float("nan")):
        with pytest.raises(UserError, match="own_piece must be a number in"):
            validate_specs([{"name": "chess_legal_move", "params": {"own_piece": bad}}])
    with pytest.raises(UserError, match="unknown param 'own'"):
        validate_specs([{"name": "chess_legal_move", "params": {"own": 0.1}}])


@pytest.mark.parametrize(
    "bad, match",
    [
        ("Once upon a time", "is not 'FEN: <fen> Move:'"),
        (prompt(START) + " e2e4 Next FEN:", "is not 'FEN: <fen> Move:'"),  # a FEN-transition prompt
        (prompt("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP w KQkq - 0 1"), "is not a valid position"),
        (prompt(START.lower()), "data.tokenizer=bpe"),
    ],
)
def test_a_prompt_that_is_not_a_move_prompt_is_one_line(bad, match):
    with pytest.raises(UserError, match=match) as e:
        chess_legal_move([""], [bad])
    assert "\n" not in str(e.value) and "chess_legal_move" in str(e.value)
    with pytest.raises(UserError, match="needs one prompt per completion"):
        chess_legal_move(["e2e4", "e2e4"], [prompt(START)])
    r = validate_specs([{"name": "chess_legal_move"}])
    with pytest.raises(RewardError, match="is not 'FEN"):
        compute_rewards(r, ["Once upon a time"], ["e2e4"])


def test_a_missing_python_chess_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "chess", None)  # import now raises ImportError
    with pytest.raises(UserError) as e:
        validate_specs([{"name": "chess_legal_move"}])
    msg = str(e.value)
    assert "\n" not in msg and "pip install 'smollab[chess]'" in msg and "chess_legal_move" in msg


def test_the_recipe_reads_what_the_data_command_writes(tmp_path):
    cfg = load_config("grpo", "chess-legal-move")
    assert [r.key for r in validate_specs(cfg.reward)] == ["chess_legal_move"]
    assert cfg.failure.action == "flag" and cfg.model.path == "runs/chess-fen-1.25m"
    written = write_all(tmp_path / "data" / "chess", prompts=0, corpus=0, move_prompts=5)
    table = written["move_prompts_table"]
    assert table.relative_to(tmp_path).as_posix() == cfg.grpo.prompts_file
    lines = written["move_prompts"].read_text().splitlines()
    assert chess_legal_move(["xx"] * 5, lines) == [0.0] * 5  # every line is a prompt it reads
    rows = [json.loads(x) for x in table.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == lines
    for r in rows:  # the columns: each legal move scores 1 from them, as from the prompt
        n = len(r["legal_moves"])
        got = chess_legal_move(r["legal_moves"], [r["prompt"]] * n)
        assert (
            got
            == chess_legal_move(
                r["legal_moves"], ["?"] * n, fen=[r["fen"]] * n, legal_moves=[r["legal_moves"]] * n
            )
            == [1.0] * n
        )
