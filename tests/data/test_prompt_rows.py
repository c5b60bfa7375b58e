"""Prompts as data: every source (.txt, .jsonl, .csv, .parquet, save_to_disk, a data directory
through `load_dataset`) gives the same rows; the held-out set; each refusal is one line."""

from __future__ import annotations

import json

import pytest

from smollab.config.load import load_config
from smollab.data.prompt_rows import PromptRows, file_rows, held_out, held_out_rows, load_rows
from smollab.errors import UserError

ROWS = [
    {"prompt": "once upon a time", "solution": "7", "level": 1},
    {"prompt": "one day", "solution": "3", "level": 2},
    {"prompt": "the cat sat", "solution": "12", "level": 1},
]


def _write(tmp_path, kind: str):
    """The same three rows as a file (or directory) of `kind`."""
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    if kind == "jsonl":
        p = tmp_path / "t.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif kind == "csv":
        p = tmp_path / "t.csv"
        ds.to_csv(str(p))
    elif kind == "parquet":
        p = tmp_path / "t.parquet"
        ds.to_parquet(str(p))
    elif kind == "saved":
        p = tmp_path / "saved"
        ds.save_to_disk(str(p))
    elif kind == "saved-dict":
        p = tmp_path / "saved-dict"
        datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(p))
    else:  # a data directory datasets.load_dataset reads
        p = tmp_path / "dir"
        p.mkdir()
        (p / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
        (p / "test.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    return p


def _data(*overrides):
    return load_config("grpo", None, list(overrides)).data


@pytest.mark.parametrize("kind", ["jsonl", "csv", "parquet", "saved", "saved-dict", "dir"])
def test_every_source_gives_the_same_rows(tmp_path, kind):
    p = _write(tmp_path, kind)
    if kind in ("jsonl", "csv", "parquet"):
        rows = load_rows(str(p), "grpo.prompts_file", _data())
    else:
        rows = load_rows(None, "grpo.prompts_file", _data(f"data.hf_dataset={p}"))
    assert rows.prompts == [r["prompt"] for r in ROWS]
    solutions = [str(s) for s in rows.columns["solution"]]  # csv reads numbers as numbers
    assert solutions == [r["solution"] for r in ROWS] and rows.columns["level"] == [1, 2, 1]
    assert not rows.conversational and str(p) in rows.source


def test_text_files_have_no_columns_and_tables_keep_chat_messages(tmp_path):
    (tmp_path / "p.txt").write_text("once upon a time\n\n one day \n")
    rows = file_rows(tmp_path / "p.txt", "grpo.prompts_file")
    assert rows.prompts == ["once upon a time", "one day"] and rows.columns == {}
    chat = [
        {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": q}]}
        | {"answer": a, "completion": "dropped, as TRL drops it"}
        for q, a in (("two plus two", 4), ("three plus one", 4))
    ]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    rows = file_rows(tmp_path / "c.jsonl", "grpo.prompts_file")
    assert rows.conversational and rows.prompts[1][1] == {
        "role": "user",
        "content": "three plus one",
    }
    assert rows.columns == {"answer": [4, 4]}  # prompt, completion, completion_ids not passed


def test_select_repeats_rows_with_their_columns():
    rows = PromptRows(["a", "b", "c"], {"x": [1, 2, 3]}, "src")
    picked = rows.select([2, 2, 0])
    assert picked.prompts == ["c", "c", "a"] and picked.columns == {"x": [3, 3, 1]}


def test_held_out_from_a_file_a_split_or_a_seeded_carve(tmp_path):
    p = _write(tmp_path, "dir")
    d = _data(f"data.hf_dataset={p}", "data.eval_split=test")
    train, held, how = held_out(load_rows(None, "k", d), None, "grpo.eval_prompts_file", d)
    assert len(train) == 3 and held.prompts == ["once upon a time"] and how == "split test"
    big = PromptRows([f"p{i}" for i in range(20)], {"i": list(range(20))}, "src")
    d = _data("grpo.prompts_file=x.jsonl", "data.eval_fraction=0.2", "data.seed=4")
    train, held, how = held_out(big, None, "grpo.eval_prompts_file", d)
    assert len(held) == 4 and len(train) == 16 and "data.seed=4" in how
    assert set(held.prompts) | set(train.prompts) == set(big.prompts)
    assert held.columns["i"] == sorted(held_out_rows(20, 0.2, 4))  # rows keep their columns
    assert held_out(big, None, "k", d)[1].prompts == held.prompts  # the same seed, the same rows
    d = _data("grpo.prompts_file=x.jsonl")
    assert held_out(big, None, "k", d)[1] is None  # nothing asked for


def test_the_sft_carve_is_the_same_choice():
    """SFT's held-out records and the prompts' carve are one rule (data.eval_fraction, data.seed)."""
    from smollab.data.sft_records import Record, carve

    records = [Record(None, f"t{i}") for i in range(30)]
    _, held = carve(records, 0.1, 7)
    assert [int(r.completion[1:]) for r in held] == sorted(held_out_rows(30, 0.1, 7))


@pytest.mark.parametrize(
    "content, match",
    [
        ('{"question": "x"}\n', r"no 'prompt' column \(its columns: question"),
        ("", r"the dataset is empty"),
        ('{"prompt": ""}\n', r"row 0: prompt is empty"),
        ('{"prompt": 3}\n', r"row 0: prompt must be text or a list of chat messages, got int"),
        ('{"prompt": []}\n', r"got an empty list"),
        ('{"prompt": [{"role": "bot", "content": "x"}]}\n', r"message 0 has role 'bot'"),
        ('{"prompt": [{"role": "user"}]}\n', r"message 0 is not a \{'role', 'content'\}"),
        ('{"prompt": [{"role": "user", "content": 3}]}\n', r"message 0: content must be text"),
        (
            '{"prompt": "a"}\n{"prompt": [{"role": "user", "content": "b"}]}\n',
            r"row 1: prompt is chat messages, and row 0's is not",
        ),
        ('{"prompt": "a", "completions": 1}\n', r"column 'completions' has the name of an arg"),
        ('{"prompt": "a"\n', r"cannot read it as json"),
    ],
)
def test_bad_tables_are_one_line_naming_the_file_and_row(tmp_path, content, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(UserError, match=match) as e:
        file_rows(p, "grpo.prompts_file")
    assert "\n" not in str(e.value) and "bad.jsonl" in str(e.value)


def test_sources_that_are_not_there_are_one_line(tmp_path):
    for name, match in (("gone.jsonl", "no such file"), ("notes.md", "not a .jsonl, .csv")):
        with pytest.raises(UserError, match=match):
            file_rows(tmp_path / name, "grpo.prompts_file")
    saved = _write(tmp_path, "saved")
    for split in ("test", "validation"):
        with pytest.raises(UserError, match=f"holds one split, train: it has no split '{split}'"):
            load_rows(None, "k", _data(f"data.hf_dataset={saved}", f"data.split={split}"))
    with pytest.raises(UserError, match=r"has no split 'dev' \(its splits: train, test\)"):
        load_rows(
            None, "k", _data(f"data.hf_dataset={_write(tmp_path, 'saved-dict')}", "data.split=dev")
        )
    with pytest.raises(UserError, match=r"data.hf_dataset .*dir split dev: Unknown split"):
        load_rows(None, "k", _data(f"data.hf_dataset={_write(tmp_path, 'dir')}", "data.split=dev"))
