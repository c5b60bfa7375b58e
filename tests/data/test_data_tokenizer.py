"""Tokenizer training and loading: WordPiece (SimpleStories style) and byte-level BPE (CS336)."""

from __future__ import annotations

import pytest

from smollab.data.stories import generate_stories
from smollab.data.tokenizer import load_tokenizer, train_tokenizer
from smollab.errors import UserError


@pytest.fixture(scope="module")
def texts():
    return generate_stories(300, seed=1)


def test_wordpiece_round_trip_and_specials(texts, tmp_path):
    tok = train_tokenizer(texts, "wordpiece", 512, tmp_path / "tok")
    assert len(tok) <= 512
    assert tok.eos_token == "[EOS]" and tok.unk_token == "[UNK]"
    assert tok.pad_token == tok.eos_token and tok.pad_token_id == tok.eos_token_id
    assert tok.convert_ids_to_tokens([0, 1]) == ["[UNK]", "[EOS]"]
    text = "once upon a time, there was a little fox named pip."
    ids = tok(text)["input_ids"]
    assert tok.eos_token_id not in ids  # no specials added by plain encoding
    assert tok.decode(ids) == text
    assert tok.decode(tok("Once Upon A Time")["input_ids"]) == "once upon a time"  # lower-cased
    assert "the" in tok.get_vocab() and "was" in tok.get_vocab()

    again = load_tokenizer(tmp_path / "tok")
    assert again(text)["input_ids"] == ids
    assert again.eos_token_id == tok.eos_token_id and again.pad_token == "[EOS]"


def test_bpe_round_trip(texts, tmp_path):
    tok = train_tokenizer(texts, "bpe", 400, tmp_path / "bpe")
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == tok.eos_token
    assert len(tok) <= 400
    text = 'She said, "Hello!" Zebras & ünïcode too.'
    assert tok.decode(tok(text)["input_ids"]) == text  # byte-level: lossless, case kept
    assert load_tokenizer(tmp_path / "bpe")(text)["input_ids"] == tok(text)["input_ids"]


def test_retrain_replaces_directory(texts, tmp_path):
    train_tokenizer(texts, "wordpiece", 300, tmp_path / "tok")
    tok = train_tokenizer(texts, "wordpiece", 256, tmp_path / "tok")
    assert len(load_tokenizer(tmp_path / "tok")) == len(tok) <= 256
    assert [p.name for p in tmp_path.iterdir()] == ["tok"]  # no temp dirs left


def test_bad_inputs(texts, tmp_path):
    with pytest.raises(UserError, match="nowhere"):
        load_tokenizer(tmp_path / "nowhere")
    with pytest.raises(UserError, match="sentencepiece"):
        train_tokenizer(texts, "sentencepiece", 256, tmp_path / "x")


def test_wordpiece_training_is_deterministic(texts, tmp_path):
    # the library's WordPieceTrainer is not (huggingface/tokenizers#1794); ours must be
    a = train_tokenizer(texts, "wordpiece", 400, tmp_path / "a")
    b = train_tokenizer(texts, "wordpiece", 400, tmp_path / "b")
    assert a.get_vocab() == b.get_vocab()
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (
        tmp_path / "b" / "tokenizer.json"
    ).read_text()


def test_wordpiece_exotic_characters_fall_back(texts, tmp_path):
    odd = [t + " \ue001x\ue002" for t in texts[:50]]  # private-use characters in the corpus
    tok = train_tokenizer(odd, "wordpiece", 300, tmp_path / "odd")
    assert tok.decode(tok("the fox")["input_ids"]) == "the fox"
