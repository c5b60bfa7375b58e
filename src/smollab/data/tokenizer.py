"""Tokenizer training (the `tokenizers` library) and loading, saved as HF tokenizer directories.

- `wordpiece` (SimpleStories style): lower-casing normalizer, whitespace + punctuation
  pre-tokenizer, WordPiece with specials `[UNK]` and `[EOS]`, WordPiece decoder (readable text).
- `bpe` (CS336 style): byte-level BPE with the GPT-2 split regex and the special
  `<|endoftext|>`; no unknown token is needed.

There is no separate padding token: the EOS token doubles as pad (`pad_token == eos_token`), so
the vocabulary holds only real text plus the specials. Padded positions must be masked by the
attention mask / loss mask, never told apart by id.
"""

from __future__ import annotations

import os
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from smollab.data.tokens import tmp_path
from smollab.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SPECIALS = {
    # kind: (eos, unk, default vocab size)
    "wordpiece": ("[EOS]", "[UNK]", 4096),
    "bpe": ("<|endoftext|>", None, 10_000),
}


def build_tokenizer(texts: list[str], kind: str, vocab_size: int | None = None):
    """Train a raw `tokenizers.Tokenizer` on `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if kind not in SPECIALS:
        raise UserError(f"data.tokenizer={kind!r}: expected one of {', '.join(SPECIALS)}")
    eos, unk, default = SPECIALS[kind]
    vocab_size = vocab_size or default
    if vocab_size > 65535:
        raise UserError(f"data.vocab_size={vocab_size}: token files are uint16, at most 65535")
    if kind == "wordpiece":
        tok = _train_wordpiece(texts, vocab_size, unk, eos)
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[eos],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


_WORD = re.compile(r"\w+|[^\w\s]")  # the wordpiece pre-tokenizer, for counting words
_PUA = 0xE000  # Unicode private use area: U+E000..U+F8FF
_PUA_SIZE = 6400


def _train_wordpiece(texts: list[str], vocab_size: int, unk: str, eos: str):
    """WordPiece vocabulary, trained deterministically.

    `tokenizers`' WordPieceTrainer gives a slightly different vocabulary on every run (its `##`
    tokens get ids in hash-map order, and those ids break ties between merges: upstream issue
    huggingface/tokenizers#1794). Its BPE trainer is deterministic, and WordPiece training is
    that BPE with a continuation prefix. So: write every non-initial character of a word as its
    own private-use character, train BPE on the counted words, and map the vocabulary back
    ("c" + "at" continuations -> "cat"; continuation-only tokens -> "##at").
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    counts = Counter()
    for text in texts:
        counts.update(_WORD.findall(text.lower()))
    words = sorted(counts)
    chars = sorted({c for w in words for c in w})
    cont = {c: chr(_PUA + i) for i, c in enumerate(chars)}
    clash = any(_PUA <= ord(c) < _PUA + _PUA_SIZE for c in chars)
    if len(chars) > _PUA_SIZE or clash:  # exotic corpora: the library trainer, non-deterministic
        return _train_wordpiece_library(texts, vocab_size, unk, eos)
    table = str.maketrans(cont)
    back = {v: k for k, v in cont.items()}

    def repeated_words():
        for w in words:
            coded = w[0] + w[1:].translate(table) + " "
            n = counts[w]
            while n > 0:
                yield coded * min(n, 4096)
                n -= 4096

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[unk, eos], show_progress=False
    )
    bpe.train_from_iterator(repeated_words(), trainer=trainer)
    vocab = {}
    for piece, i in bpe.get_vocab().items():
        if piece in (unk, eos):
            vocab[piece] = i
        elif piece[0] in back:
            vocab["##" + "".join(back[c] for c in piece)] = i
        else:
            vocab[piece[0] + "".join(back.get(c, c) for c in piece[1:])] = i
    tok = Tokenizer(models.WordPiece(vocab, unk_token=unk, continuing_subword_prefix="##"))
    _wordpiece_pipeline(tok, normalizers, pre_tokenizers, decoders)
    tok.add_special_tokens([unk, eos])
    return tok


def _wordpiece_pipeline(tok, normalizers, pre_tokenizers, decoders) -> None:
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()]
    )
    tok.decoder = decoders.WordPiece(prefix="##")


def _train_wordpiece_library(texts: list[str], vocab_size: int, unk: str, eos: str):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token=unk, continuing_subword_prefix="##"))
    _wordpiece_pipeline(tok, normalizers, pre_tokenizers, decoders)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        special_tokens=[unk, eos],
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def wrap(tok, kind: str) -> PreTrainedTokenizerFast:
    """A raw `tokenizers.Tokenizer` as a transformers fast tokenizer with eos = pad."""
    from transformers import PreTrainedTokenizerFast

    eos, unk, _ = SPECIALS[kind]
    kwargs = {"unk_token": unk} if unk else {}
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=eos, **kwargs)


def train_tokenizer(
    texts: list[str], kind: str, vocab_size: int | None, out_dir: Path
) -> PreTrainedTokenizerFast:
    """Train, save as an HF tokenizer directory at `out_dir` (atomically), and return it.

    `vocab_size=None` takes the kind's default (wordpiece 4096, bpe 10000)."""
    hf = wrap(build_tokenizer(texts, kind, vocab_size), kind)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(out_dir)
    tmp.mkdir()
    try:
        hf.save_pretrained(str(tmp))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return hf


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer saved by `train_tokenizer` (or any local HF tokenizer directory)."""
    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        raise UserError(f"tokenizer directory {path} not found (no tokenizer.json there)")
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(path))
