"""The offline chess FEN generator: deterministic by seed, answers the rewards recompute from the
prompt alone, and files that grpo.prompts_file and data.source=files read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

chess = pytest.importorskip("chess", reason="the chess extra (in dev) installs python-chess")
pytest.importorskip("rapidfuzz", reason="the chess extra (in dev) installs rapidfuzz")

from smollab.data.chess_fen import (  # noqa: E402
    examples,
    main,
    move_prompts_from,
    position,
    stream,
    write_all,
)
from smollab.data.corpus import load_files  # noqa: E402
from smollab.errors import UserError  # noqa: E402
from smollab.rewards.chess_fen import PROMPT_RE, fen_exact, fen_valid, true_fen  # noqa: E402
from smollab.rewards.chess_moves import MOVE_PROMPT_RE, chess_legal_move  # noqa: E402


def test_same_seed_same_examples_other_seed_others():
    a, b = examples(40, seed=3), examples(40, seed=3)
    assert a == b
    assert examples(40, seed=4) != a
    assert examples(10, seed=3) == a[:10]  # a prefix: n does not reshuffle the stream


@pytest.mark.parametrize("notation", ["uci", "san"])
def test_answers_are_what_the_rewards_recompute_from_the_prompt(notation):
    rows = examples(200, seed=0, notation=notation)
    prompts, answers = [r["prompt"] for r in rows], [r["answer"] for r in rows]
    assert all(PROMPT_RE.match(p) for p in prompts)
    assert [true_fen(p) for p in prompts] == answers
    assert fen_exact(answers, prompts) == [1.0] * len(rows)
    assert fen_valid(answers) == [1.0] * len(rows)
    moves = [PROMPT_RE.match(p)["move"] for p in prompts]
    if notation == "uci":
        assert all(chess.Move.from_uci(m) for m in moves)
    else:
        assert any(m[0] in "NBRQK" for m in moves)
    # the positions are varied: not all from the opening, both sides to move
    assert len({p.split(" Move:")[0] for p in prompts}) > 150
    assert {r["answer"].split()[1] for r in rows} == {"w", "b"}


def test_long_random_games_reach_the_special_moves():
    rows = examples(300, seed=1)
    moves = [PROMPT_RE.match(r["prompt"])["move"] for r in rows]
    assert any(len(m) == 5 for m in moves)  # a promotion
    assert any(r["answer"].split()[3] != "-" for r in rows)  # a two-step pawn move


def test_write_all_files_read_back_and_corpus_avoids_the_prompts(tmp_path):
    paths = write_all(tmp_path / "chess", prompts=20, corpus=300, seed=7)
    prompts = paths["prompts"].read_text().splitlines()
    pairs = [json.loads(line) for line in paths["pairs"].read_text().splitlines()]
    assert [p["prompt"] for p in pairs] == prompts and len(prompts) == 20
    assert pairs == examples(20, seed=7)
    docs = load_files([str(paths["corpus"])], "text")  # data.source=files: a line a document
    assert 250 <= len(docs) <= 300
    for doc in docs:
        p, _, ans = doc.partition(" Next FEN: ")
        assert true_fen(p + " Next FEN:") == ans
        assert p + " Next FEN:" not in prompts


def test_the_module_command_and_bad_values(tmp_path, capsys):
    assert (
        main(["--out", str(tmp_path), "--prompts", "3", "--corpus", "5", "--notation", "san"]) == 0
    )
    assert "corpus.txt" in capsys.readouterr().out
    assert len((tmp_path / "prompts.txt").read_text().splitlines()) == 3
    assert main(["--out", str(tmp_path), "--corpus", "-1"]) == 2
    assert capsys.readouterr().out.startswith(
        "smollab: error: --prompts, --corpus and --move-prompts must be >= 0, one of them > 0"
    )
    with pytest.raises(UserError, match="notation 'lan'"):
        examples(1, notation="lan")
    with pytest.raises(UserError, match="max_plies must be >= 0"):
        examples(1, max_plies=-1)


def test_move_prompts_come_after_the_other_files_and_change_none(tmp_path):
    plain = write_all(tmp_path / "plain", prompts=10, corpus=100, seed=5)
    both = write_all(tmp_path / "both", prompts=10, corpus=100, seed=5, move_prompts=60)
    for name in ("prompts", "pairs", "corpus"):
        assert plain[name].read_text() == both[name].read_text()
    lines = both["move_prompts"].read_text().splitlines()
    fens = [MOVE_PROMPT_RE.match(p)["fen"] for p in lines]
    assert len(lines) == 60 and len({position(f) for f in fens}) == 60  # distinct positions
    later = examples(10 + 100 + 100, seed=5)[110:]  # the same stream, after prompts and corpus
    assert lines[:5] == [r["prompt"].partition(" Move: ")[0] + " Move:" for r in later[:5]]
    # every prompt is a position the reward reads: its own legal moves score 1
    legal = [next(iter(chess.Board(f).legal_moves)).uci() for f in fens]
    assert chess_legal_move(legal, lines) == [1.0] * 60
    assert (
        main(
            ["--out", str(tmp_path / "m"), "--prompts", "0", "--corpus", "0", "--move-prompts", "4"]
        )
        == 0
    )
    names = sorted(p.name for p in (tmp_path / "m").iterdir())
    assert names == ["move_prompts.jsonl", "move_prompts.txt"]


def test_the_tables_hold_the_columns_the_rewards_read(tmp_path):
    """prompts.jsonl: fen, move, next_fen (the FEN rewards' truth, as recomputed from the prompt);
    move_prompts.jsonl: fen and every legal move in UCI."""
    from smollab.rewards.chess_fen import fen_exact, true_fen

    w = write_all(tmp_path, prompts=8, corpus=0, seed=2, move_prompts=8)
    rows = [json.loads(x) for x in w["prompts_table"].read_text().splitlines()]
    assert [r["prompt"] for r in rows] == w["prompts"].read_text().splitlines()
    for r in rows:
        assert r["prompt"] == f"FEN: {r['fen']} Move: {r['move']} Next FEN:"
        assert r["next_fen"] == true_fen(r["prompt"])
    truth = [r["next_fen"] for r in rows]
    assert fen_exact(truth, ["?"] * 8, next_fen=truth) == [1.0] * 8
    moves = [json.loads(x) for x in w["move_prompts_table"].read_text().splitlines()]
    for r in moves:
        board = chess.Board(r["fen"])
        assert r["legal_moves"] == sorted(m.uci() for m in board.legal_moves)


def test_exclude_makes_a_held_out_set_that_no_training_file_shows(tmp_path, capsys):
    train = write_all(tmp_path / "train", prompts=20, corpus=400, seed=0, move_prompts=100)
    files = [str(train[k]) for k in ("corpus", "prompts", "move_prompts")]
    held = write_all(
        tmp_path / "held", prompts=0, corpus=0, seed=1, move_prompts=80, exclude=files
    )["move_prompts"]
    seen = set()
    for line in train["corpus"].read_text().splitlines():  # both FENs of a transition
        before, _, after = line.removeprefix("FEN: ").partition(" Move: ")
        seen |= {position(before), position(after.partition(" Next FEN: ")[2])}
    for f in files[1:]:
        seen |= {
            position(line.removeprefix("FEN: ").split(" Move:")[0])
            for line in Path(f).read_text().splitlines()
        }
    got = [position(MOVE_PROMPT_RE.match(p)["fen"]) for p in held.read_text().splitlines()]
    assert len(got) == 80 and not set(got) & seen
    unfiltered = write_all(tmp_path / "raw", prompts=0, corpus=0, seed=1, move_prompts=80)
    raw = [
        position(MOVE_PROMPT_RE.match(p)["fen"])
        for p in unfiltered["move_prompts"].read_text().splitlines()
    ]
    assert set(raw) & seen  # without --exclude the opening positions come back
    with pytest.raises(UserError, match="--exclude .*nope.txt: cannot read it"):
        write_all(
            tmp_path / "x", prompts=0, corpus=0, move_prompts=5, exclude=[tmp_path / "nope.txt"]
        )
    (tmp_path / "story.txt").write_text("Once upon a time\n")
    with pytest.raises(UserError, match="story.txt: no 'FEN: <fen>' in it"):
        write_all(
            tmp_path / "x", prompts=0, corpus=0, move_prompts=5, exclude=[tmp_path / "story.txt"]
        )
    with pytest.raises(UserError, match="give --move-prompts N as well"):
        write_all(tmp_path / "x", prompts=5, corpus=0, exclude=files)
    with pytest.raises(UserError, match="only 0 new positions in 3 random games"):
        move_prompts_from(stream(0, max_plies=0), 5, {position(chess.STARTING_FEN)}, max_draws=3)
