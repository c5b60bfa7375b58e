"""The chess FEN rewards on hand-made positions: each special move, corrupted FENs, and the
distance against a hand-written Levenshtein."""

from __future__ import annotations

import sys

import pytest

chess = pytest.importorskip("chess", reason="the chess extra (in dev) installs python-chess")
pytest.importorskip("rapidfuzz", reason="the chess extra (in dev) installs rapidfuzz")

from smollab.errors import UserError  # noqa: E402
from smollab.rewards import RewardError, compute_rewards, validate_specs  # noqa: E402
from smollab.rewards.chess_fen import (  # noqa: E402
    answer,
    fen_distance,
    fen_distance_serial,
    fen_exact,
    fen_valid,
    true_fen,
)

START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
# (prompt FEN, move, the FEN after it written by hand)
CASES = {
    "pawn push": (START, "e2e4", "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1"),
    "pawn push san": (START, "e4", "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1"),
    "knight": (START, "Nf3", "rnbqkbnr/pppppppp/8/8/8/5N2/PPPPPPPP/RNBQKB1R b KQkq - 1 1"),
    "castling": (
        "r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1",
        "e1g1",
        "r3k2r/8/8/8/8/8/8/R4RK1 b kq - 1 1",
    ),
    "castling long san": (
        "r3k2r/8/8/8/8/8/8/R3K2R b KQkq - 3 7",
        "O-O-O",
        "2kr3r/8/8/8/8/8/8/R3K2R w KQ - 4 8",
    ),
    "en passant": (
        "rnbqkbnr/ppp1p1pp/8/3pPp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3",
        "e5f6",
        "rnbqkbnr/ppp1p1pp/5P2/3p4/8/8/PPPP1PPP/RNBQKBNR b KQkq - 0 3",
    ),
    "promotion": ("8/P7/8/8/8/8/8/k6K w - - 0 50", "a7a8q", "Q7/8/8/8/8/8/8/k6K b - - 0 50"),
    "underpromotion san": (
        "8/P7/8/8/8/8/8/k6K w - - 5 50",
        "a8=N",
        "N7/8/8/8/8/8/8/k6K b - - 0 50",
    ),
}


def prompt(fen: str, move: str) -> str:
    return f"FEN: {fen} Move: {move} Next FEN:"


def levenshtein(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


@pytest.mark.parametrize("name", CASES)
def test_true_fen_and_exact_match_on_special_moves(name):
    fen, move, after = CASES[name]
    p = prompt(fen, move)
    assert true_fen(p) == after
    board = chess.Board(fen)  # the hand value agrees with python-chess itself
    try:
        board.push_uci(move)
    except ValueError:
        board.push_san(move)
    assert board.fen(en_passant="fen") == after
    got = [f" {after}\n", f"{after} extra", after.replace(" 0 ", " 9 "), ""]
    assert fen_exact(got, [p] * 4) == [1.0, 0.0, 0.0 if " 0 " in after else 1.0, 0.0]
    assert fen_valid(got) == [1.0, 0.0, 1.0, 0.0]
    assert fen_distance([after], [p]) == [1.0]


def test_fen_exact_without_clocks_compares_four_fields():
    fen, move, after = CASES["castling"]
    p = prompt(fen, move)
    four = " ".join(after.split()[:4])
    wrong_clock = four + " 0 9"
    wrong_castle = after.replace(" kq ", " KQkq ")
    assert fen_exact([four, wrong_clock, wrong_castle], [p] * 3) == [0.0, 0.0, 0.0]
    assert fen_exact([four, wrong_clock, wrong_castle, four + " x"], [p] * 4, clocks=False) == [
        1.0,
        1.0,
        0.0,
        0.0,
    ]


CORRUPT = {
    "seven ranks": "rnbqkbnr/pppppppp/8/8/4P3/PPPP1PPP/RNBQKBNR b KQkq e3 0 1",
    "nine files": "rnbqkbnr/ppppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
    "two white kings": "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBKKBNR b KQkq - 0 1",
    "pawn on last rank": "Pnbqkbnr/pppppppp/8/8/8/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
    "side not to move in check": "4k3/8/8/8/8/8/8/4RK2 w - - 0 1",
    "bad ep square": "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e4 0 1",
    "bad letter": "rnbqkbnr/pppppppp/8/8/4X3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
    "case folded": "rnbqkbnr/pppppppp/8/8/4p3/8/pppp1ppp/rnbqkbnr b kqkq e3 0 1",
    "no clocks": "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3",
    "prose": "the knight moves to f3",
}


def test_fen_valid_refuses_corrupted_fens_that_python_chess_refuses():
    assert fen_valid(list(CORRUPT.values())) == [0.0] * len(CORRUPT)
    for text in list(CORRUPT.values())[:-2]:  # the same verdict as python-chess's own check
        try:
            ok = chess.Board(text).is_valid()
        except ValueError:
            ok = False
        assert not ok, text
    valid = [after for _, _, after in CASES.values()]
    assert fen_valid(valid) == [1.0] * len(valid)


def test_fen_distance_is_one_minus_normalized_levenshtein():
    fen, move, after = CASES["en passant"]
    p = prompt(fen, move)
    texts = [after, *CORRUPT.values(), "", after[:-1] + "7", after + after]
    want = [1 - levenshtein(answer(t), after) / max(len(answer(t)), len(after)) for t in texts]
    got = fen_distance(texts, [p] * len(texts))
    assert got == pytest.approx(want, abs=1e-12)
    assert got[-2] == pytest.approx(1 - 1 / len(after)) and got[-3] == 0.0
    assert fen_distance_serial(texts, [p] * len(texts)) == pytest.approx(want, abs=1e-12)


def test_each_completion_is_scored_against_its_own_prompt():
    p1, p2 = (prompt(f, m) for f, m, _ in (CASES["castling"], CASES["promotion"]))
    a1, a2 = CASES["castling"][2], CASES["promotion"][2]
    assert fen_exact([a1, a2, a2, a1], [p1, p2, p1, p2]) == [1.0, 1.0, 0.0, 0.0]
    d = fen_distance([a1, a2, a2, a1], [p1, p2, p1, p2])
    assert d[:2] == [1.0, 1.0] and max(d[2:]) < 0.8


@pytest.mark.parametrize(
    "bad, match",
    [
        ("Once upon a time", "is not 'FEN: <fen> Move: <move> Next FEN:'"),
        (
            prompt("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP w KQkq - 0 1", "e2e4"),
            "is not a valid position",
        ),
        (prompt(START.lower(), "e2e4"), "data.tokenizer=bpe"),
        (prompt(START, "e2e5"), "move 'e2e5' is not legal"),
    ],
)
def test_a_prompt_that_is_not_a_chess_prompt_is_one_line(bad, match):
    with pytest.raises(UserError, match=match) as e:
        fen_exact(["x"], [bad])
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="needs one prompt per completion"):
        fen_distance(["x", "y"], [prompt(START, "e2e4")])
    r = validate_specs([{"name": "fen_distance"}])
    with pytest.raises(RewardError, match="is not 'FEN"):
        compute_rewards(r, ["Once upon a time"], ["x"])


def test_registered_and_validated_with_a_chess_probe():
    r = validate_specs(
        [
            {"name": "fen_valid"},
            {"name": "fen_exact", "params": {"clocks": False}},
            {"name": "fen_distance", "weight": 0.5},
        ]
    )
    fen, move, after = CASES["knight"]
    out = compute_rewards(r, [prompt(fen, move)], [after])
    assert out == {"fen_valid": [1.0], "fen_exact": [1.0], "fen_distance": [1.0]}
    with pytest.raises(UserError, match="clocks must be true or false"):
        validate_specs([{"name": "fen_exact", "params": {"clocks": "no"}}])
    with pytest.raises(UserError, match="unknown param 'clock'"):
        validate_specs([{"name": "fen_exact", "params": {"clock": False}}])


@pytest.mark.parametrize("missing", ["chess", "rapidfuzz"])
def test_a_missing_package_names_the_extra(missing, monkeypatch):
    monkeypatch.setitem(sys.modules, missing, None)  # import now raises ImportError
    with pytest.raises(UserError) as e:
        validate_specs([{"name": "fen_valid"}])
    msg = str(e.value)
    assert "\n" not in msg and "pip install 'smollab[chess]'" in msg and missing in msg
