"""Token files: atomic uint16 writes, memmap reads, random and fixed evaluation windows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smollab.data.stories import generate_stories
from smollab.data.tokenizer import train_tokenizer
from smollab.data.tokens import eval_batches, get_batch, open_tokens, write_tokens
from smollab.errors import UserError


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return train_tokenizer(
        generate_stories(300, seed=2), "wordpiece", 256, tmp_path_factory.mktemp("tok") / "tok"
    )


def test_write_and_read(tok, tmp_path):
    texts = ["a cat sat.", "the dog ran home!", "mia was glad."]
    n = write_tokens(texts, tok, tmp_path / "t.bin")
    arr = open_tokens(tmp_path / "t.bin")
    assert isinstance(arr, np.memmap) and arr.dtype == np.uint16 and len(arr) == n
    assert not arr.flags.writeable
    expected = []
    for t in texts:
        expected += tok(t)["input_ids"] + [tok.eos_token_id]
    assert arr.tolist() == expected
    assert [p.name for p in tmp_path.iterdir()] == ["t.bin"]  # no temp file left


def test_write_many_in_chunks(tok, tmp_path, monkeypatch):
    import smollab.data.tokens as tokens_mod

    monkeypatch.setattr(tokens_mod, "CHUNK", 7)
    texts = generate_stories(30, seed=5)
    n = write_tokens(texts, tok, tmp_path / "t.bin")
    arr = open_tokens(tmp_path / "t.bin")
    assert n == len(arr) and int((arr == tok.eos_token_id).sum()) == 30
    first = arr[: list(arr).index(tok.eos_token_id)].tolist()
    assert first == tok(texts[0])["input_ids"]


def test_get_batch_shapes_and_determinism():
    tokens = np.arange(1000, dtype=np.uint16)
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    x, y = get_batch(tokens, 4, 16, g)
    assert x.shape == y.shape == (4, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    x2, _ = get_batch(tokens, 4, 16, g)
    assert not torch.equal(x, x2)
    g.set_state(state)  # resume restores the exact data position
    assert torch.equal(get_batch(tokens, 4, 16, g)[0], x)
    assert torch.equal(get_batch(tokens, 4, 16, g)[0], x2)


def test_get_batch_covers_the_end():
    tokens = np.arange(20, dtype=np.uint16)
    g = torch.Generator().manual_seed(1)
    _, y = get_batch(tokens, 200, 19, g)
    assert int(y.max()) == 19  # the only window uses the last token
    with pytest.raises(UserError, match="seq_len=20"):
        get_batch(tokens, 1, 20, g)


def test_eval_batches_fixed():
    tokens = np.arange(5000, dtype=np.uint16)
    a = eval_batches(tokens, 4, 32, 640)
    b = eval_batches(tokens, 4, 32, 640)
    assert len(a) == 5 and sum(x.numel() for x, _ in a) == 640
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert torch.equal(ya[:, :-1], xa[:, 1:])
    starts = torch.cat([x[:, 0] for x, _ in a])
    assert int(starts[0]) == 0 and int(starts[-1]) > 4000  # spread over the file
    assert bool((starts.diff() >= 32).all())  # no overlap
    # a short file caps the windows instead of repeating them
    short = eval_batches(np.arange(100, dtype=np.uint16), 8, 32, 10_000)
    assert sum(x.shape[0] for x, _ in short) == 3


def test_open_missing(tmp_path):
    with pytest.raises(UserError, match="missing.bin"):
        open_tokens(tmp_path / "missing.bin")
