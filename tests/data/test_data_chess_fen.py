"""The offline chess FEN generator: deterministic by seed, answers the rewards recompute from the
prompt alone, and files that grpo.prompts_file and data.source=files read."""

from __future__ import annotations

import json

import pytest

chess = pytest.importorskip("chess", reason="the chess extra (in dev) installs python-chess")
pytest.importorskip("rapidfuzz", reason="the chess extra (in dev) installs rapidfuzz")

from smollab.data.chess_fen import examples, main, write_all  # noqa: E402
from smollab.data.corpus import load_files  # noqa: E402
from smollab.errors import UserError  # noqa: E402
from smollab.rewards.chess_fen import PROMPT_RE, fen_exact, fen_valid, true_fen  # noqa: E402


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
        "smollab: error: --prompts must be >= 1 and --corpus >= 0"
    )
    with pytest.raises(UserError, match="notation 'lan'"):
        examples(1, notation="lan")
    with pytest.raises(UserError, match="max_plies must be >= 0"):
        examples(1, max_plies=-1)
