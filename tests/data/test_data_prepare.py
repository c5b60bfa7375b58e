"""`prepare`: writes every file, reuses a directory prepared with the same config."""

from __future__ import annotations

import json

import numpy as np
import pytest

from smollab.config import DataConfig
from smollab.data.prepare import load_meta, prepare
from smollab.data.tokenizer import load_tokenizer
from smollab.data.tokens import open_tokens
from smollab.errors import UserError


def _cfg(d, **kw):
    return DataConfig(dir=str(d), num_stories=300, vocab_size=256, **kw)


def test_prepare_writes_all_and_reuses(tmp_path):
    d = tmp_path / "data"
    logs = []
    meta = prepare(_cfg(d), log=logs.append)
    for name in (
        "train.jsonl",
        "test.jsonl",
        "tokenizer/tokenizer.json",
        "train.bin",
        "val.bin",
        "meta.json",
    ):
        assert (d / name).is_file(), name
    assert meta == load_meta(d) == json.loads((d / "meta.json").read_text())
    assert meta["stories"] == {"train": 285, "test": 15}
    assert meta["config"] == _cfg(d).model_dump() and meta["dtype"] == "uint16"
    assert meta["tokenizer"] == "wordpiece" and meta["source"] == "offline"
    tok = load_tokenizer(d / "tokenizer")
    assert meta["vocab_size"] == len(tok) <= 256 and meta["eos_id"] == tok.eos_token_id
    train_tokens = open_tokens(d / "train.bin")
    assert meta["tokens"] == {"train": len(train_tokens), "val": len(open_tokens(d / "val.bin"))}
    assert int((np.asarray(train_tokens) == tok.eos_token_id).sum()) == 285
    test_lines = [json.loads(line) for line in (d / "test.jsonl").read_text().splitlines()]
    assert len(test_lines) == 15 and set(test_lines[0]) == {"text"}
    assert not [p for p in d.rglob("*.tmp")]

    logs.clear()
    mtime = (d / "train.bin").stat().st_mtime_ns
    assert prepare(_cfg(d), log=logs.append) == meta
    assert "reusing" in logs[0] and (d / "train.bin").stat().st_mtime_ns == mtime

    other = prepare(_cfg(d, seed=1), log=logs.append)  # a changed config rebuilds
    assert other["config"]["seed"] == 1 and (d / "train.bin").stat().st_mtime_ns != mtime


def test_failure_leaves_no_meta(tmp_path, monkeypatch):
    d = tmp_path / "data"
    prepare(_cfg(d), log=lambda _: None)

    import smollab.data.tokens as tokens_mod

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(tokens_mod, "write_tokens", boom)
    with pytest.raises(RuntimeError):
        prepare(_cfg(d, seed=2), log=lambda _: None)
    assert not (d / "meta.json").exists()
    with pytest.raises(UserError, match="is not prepared"):
        load_meta(d)


def test_files_source_tracks_file_changes(tmp_path):
    src = tmp_path / "s.txt"
    src.write_text("\n".join(f"story number {i} is here." for i in range(40)))
    cfg = DataConfig(dir=str(tmp_path / "d"), source="files", files=[str(src)], vocab_size=128)
    first = prepare(cfg, log=lambda _: None)
    src.write_text("\n".join(f"another tale {i}." for i in range(60)))
    second = prepare(cfg, log=lambda _: None)
    assert first["stories"]["train"] + first["stories"]["test"] == 40
    assert second["stories"]["train"] + second["stories"]["test"] == 60


def test_load_meta_unprepared(tmp_path):
    with pytest.raises(UserError, match=r"data dir .*nothing is not prepared: run `smollab data"):
        load_meta(tmp_path / "nothing")


def test_bad_input_stops_before_touching_the_dir(tmp_path):
    d = tmp_path / "data"
    prepare(_cfg(d), log=lambda _: None)
    bad = DataConfig(dir=str(d), source="files", files=[str(tmp_path / "gone.jsonl")])
    with pytest.raises(UserError, match="gone.jsonl not found"):
        prepare(bad, log=lambda _: None)
    assert load_meta(d)["source"] == "offline"  # the previous preparation is intact
