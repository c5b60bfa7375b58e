"""The offline word-problem generator: deterministic by seed, a held-out split no training file
touches, answers the checker recomputes from the prompt, files the loaders read."""

from __future__ import annotations

import itertools
import json

import pytest

from smollab.data.corpus import load_files
from smollab.data.word_problems import (
    TEMPLATES,
    answer_of,
    is_heldout,
    main,
    parse,
    stream,
    write_all,
)
from smollab.errors import UserError
from smollab.rewards.word_problems import word_problem_correct


def test_same_seed_same_problems_other_seed_others():
    a = list(itertools.islice(stream(3, heldout=False), 50))
    assert a == list(itertools.islice(stream(3, heldout=False), 50))
    assert a != list(itertools.islice(stream(4, heldout=False), 50))
    assert {p.template for p in a} == set(TEMPLATES)


def test_the_split_is_a_fixed_tenth_of_the_combinations_and_streams_keep_to_theirs():
    keys = [
        (t, n, a, b)
        for t in TEMPLATES
        for n in ("lily", "tom", "mia")
        for a in range(1, 21)
        for b in range(1, 21)
    ]
    share = sum(is_heldout(*k) for k in keys) / len(keys)
    assert 0.07 < share < 0.13
    assert is_heldout("add", "lily", 3, 4) == is_heldout("add", "lily", 3, 4)
    for heldout in (False, True):
        for p in itertools.islice(stream(0, heldout=heldout), 300):
            assert is_heldout(p.template, p.name, p.a, p.b) is heldout


def test_every_generated_prompt_parses_back_to_its_numbers():
    for p in itertools.islice(stream(1, heldout=False, max_number=30, max_factor=12), 2000):
        q = parse(p.prompt)
        assert q is not None and (q.template, q.name, q.a, q.b) == (p.template, p.name, p.a, p.b)
        assert q.value == {"add": p.a + p.b, "take": p.a - p.b, "groups": p.a * p.b}[p.template]
        assert q.value >= 1


def test_write_all_files_read_back_and_no_training_file_holds_a_heldout_problem(tmp_path):
    paths = write_all(
        tmp_path / "wp", prompts=60, heldout=40, corpus=500, stories=20, sft=50, seed=2
    )
    prompts = paths["prompts"].read_text().splitlines()
    heldout = paths["heldout"].read_text().splitlines()
    assert len(prompts) == len(set(prompts)) == 60 and len(heldout) == len(set(heldout)) == 40
    records = [json.loads(x) for x in paths["sft"].read_text().splitlines()]
    assert len(records) == 50 and set(records[0]) == {"prompt", "completion"}
    docs = load_files([str(paths["corpus"])], "text")  # data.source=files: a line a document
    assert len(docs) == 520
    problems = [d for d in docs if "answer:" in d]
    assert len(problems) == 500  # the stories never say "answer:"
    worked = [(d.partition("answer:")[0] + "answer:", d.partition("answer:")[2]) for d in problems]
    train = prompts + [p for p, _ in worked] + [r["prompt"] for r in records]
    for text in train:
        p = parse(text)
        assert not is_heldout(p.template, p.name, p.a, p.b)
    for text in heldout:
        p = parse(text)
        assert is_heldout(p.template, p.name, p.a, p.b)
    assert not set(heldout) & set(train)
    # the corpus's worked answers and sft's completions are what the checker accepts
    assert word_problem_correct([c for _, c in worked], [p for p, _ in worked]) == [1.0] * 500
    assert (
        word_problem_correct([r["completion"] for r in records], [r["prompt"] for r in records])
        == [1.0] * 50
    )
    assert all(" = " in r["completion"] for r in records)


def test_counts_change_only_their_own_file_and_the_answer_form(tmp_path):
    a = write_all(tmp_path / "a", prompts=10, heldout=5, corpus=30, stories=3, sft=8, seed=1)
    b = write_all(
        tmp_path / "b",
        prompts=10,
        heldout=9,
        corpus=30,
        stories=3,
        sft=8,
        seed=1,
        sft_form="answer",
    )
    assert a["prompts"].read_text() == b["prompts"].read_text()
    assert a["corpus"].read_text() == b["corpus"].read_text()
    assert b["heldout"].read_text().startswith(a["heldout"].read_text())
    bare = [json.loads(x) for x in b["sft"].read_text().splitlines()]
    assert all(r["completion"].strip().isdigit() for r in bare)
    assert (
        word_problem_correct([r["completion"] for r in bare], [r["prompt"] for r in bare])
        == [1.0] * 8
    )


def test_the_module_command_and_bad_values(tmp_path, capsys):
    assert (
        main(
            [
                "--out",
                str(tmp_path),
                "--prompts",
                "3",
                "--heldout",
                "0",
                "--corpus",
                "0",
                "--stories",
                "0",
                "--sft",
                "0",
            ]
        )
        == 0
    )
    assert "prompts.txt" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.jsonl", "prompts.txt"]
    rows = [json.loads(x) for x in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    texts = (tmp_path / "prompts.txt").read_text().splitlines()
    assert [r["prompt"] for r in rows] == texts  # the same prompts, with their answers
    assert [r["answer"] for r in rows] == [answer_of(t) for t in texts]
    assert main(["--out", str(tmp_path), "--corpus", "-1"]) == 2
    assert capsys.readouterr().out.startswith("smollab: error: counts must be >= 0")
    with pytest.raises(UserError, match="--max-number and --max-factor must be >= 2"):
        next(stream(0, heldout=False, max_number=1))
