"""Corpus loaders: offline, mocked hub datasets (never the network), and files."""

from __future__ import annotations

import json
import sys
import types

import pytest

from smollab.config import DataConfig
from smollab.data.corpus import load_corpus, split
from smollab.errors import UserError


def test_offline_split_deterministic():
    cfg = DataConfig(num_stories=200, test_fraction=0.1, seed=7)
    train, test = load_corpus(cfg)
    assert len(train) == 180 and len(test) == 20
    assert load_corpus(cfg) == (train, test)
    assert not set(train) & set(test)


def test_split_rules():
    train, test = split([str(i) for i in range(10)], 0.05, 0)
    assert len(test) == 1 and len(train) == 9
    with pytest.raises(UserError, match="at least 2"):
        split(["only one"], 0.1, 0)


class FakeDataset:
    def __init__(self, column, n):
        self.column_names = [column, "other"]
        self.rows = {column: [f"story {i}" for i in range(n)], "other": [0] * n}

    def __getitem__(self, key):
        return self.rows[key]


@pytest.fixture
def fake_hub(monkeypatch):
    calls = []

    def load_dataset(name, split):
        calls.append((name, split))
        column = "story" if name.startswith("SimpleStories") else "text"
        base, _, cap = split.partition("[:")
        n = int(cap.rstrip("]")) if cap else (50 if base == "train" else 5)
        return FakeDataset(column, n)

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)
    return calls


def test_simplestories_mocked(fake_hub):
    train, test = load_corpus(DataConfig(source="simplestories"))
    assert (len(train), len(test)) == (50, 5)
    assert fake_hub == [
        ("SimpleStories/SimpleStories", "train"),
        ("SimpleStories/SimpleStories", "test"),
    ]


def test_tinystories_mocked_with_cap(fake_hub):
    train, test = load_corpus(DataConfig(source="tinystories", max_stories=40, test_fraction=0.1))
    assert (len(train), len(test)) == (36, 4)
    assert fake_hub == [
        ("roneneldan/TinyStories", "train[:36]"),
        ("roneneldan/TinyStories", "validation[:4]"),
    ]


def test_hub_failure_is_user_error(monkeypatch):
    def load_dataset(name, split):
        raise ConnectionError("Couldn't reach the hub\nmore lines")

    module = types.ModuleType("datasets")
    module.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)
    with pytest.raises(UserError, match=r"SimpleStories/SimpleStories.*data.source=offline"):
        load_corpus(DataConfig(source="simplestories"))


def test_hub_missing_column(monkeypatch):
    module = types.ModuleType("datasets")
    module.load_dataset = lambda name, split: FakeDataset("body", 3)
    monkeypatch.setitem(sys.modules, "datasets", module)
    with pytest.raises(UserError, match="no column 'text'"):
        load_corpus(DataConfig(source="tinystories"))


def test_files_txt_and_jsonl(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("first story\nstill first.\n\n\nsecond story.\n  \nthird.\n")
    lines = tmp_path / "lines.txt"
    lines.write_text("one.\ntwo.\nthree.\n")
    js = tmp_path / "s.jsonl"
    js.write_text("\n".join(json.dumps({"body": f"j{i}", "n": i}) for i in range(4)) + "\n\n")
    cfg = DataConfig(
        source="files", files=[str(blank), str(lines), str(js)], text_key="body", test_fraction=0.2
    )
    train, test = load_corpus(cfg)
    everything = sorted(train + test)
    assert everything == sorted(
        [
            "first story still first.",
            "second story.",
            "third.",
            "one.",
            "two.",
            "three.",
            "j0",
            "j1",
            "j2",
            "j3",
        ]
    )
    assert len(test) == 2 and load_corpus(cfg) == (train, test)


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("bad.jsonl", '{"story": "ok"}\n{"story": broken\n', r"bad.jsonl line 2: invalid JSON"),
        (
            "nokey.jsonl",
            '{"story": "ok"}\n\n{"text": "x"}\n',
            r"nokey.jsonl line 3: no key 'story'",
        ),
        ("num.jsonl", '{"story": 5}\n', r"num.jsonl line 1: 'story' is int"),
        ("list.jsonl", "[1, 2]\n", r"list.jsonl line 1: no key"),
        ("stories.csv", "a,b\n", r"stories.csv must end in .txt or .jsonl"),
        ("empty.txt", "\n\n", r"empty.txt holds no stories"),
    ],
)
def test_files_bad_input(tmp_path, name, content, match):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(UserError, match=match):
        load_corpus(DataConfig(source="files", files=[str(path)]))


def test_files_missing(tmp_path):
    with pytest.raises(UserError, match="nope.txt not found"):
        load_corpus(DataConfig(source="files", files=[str(tmp_path / "nope.txt")]))
    with pytest.raises(UserError, match="needs data.files"):
        load_corpus(DataConfig(source="files"))
