"""Corpus loaders: the offline generator, two HF hub datasets, or the user's own files.

`load_corpus(cfg)` returns `(train, test)` lists of story texts. Splits are deterministic:

- offline: `generate_stories(num_stories, seed)`, then `split(texts, test_fraction, seed)`.
- simplestories / tinystories: the dataset's own train and test (TinyStories: validation) splits.
  `max_stories` caps the total: the test split gets `ceil(max_stories * test_fraction)` stories,
  train the rest. `datasets` is imported only here (it is slow to import).
- files: `.txt` files hold stories separated by one or more blank lines; a `.txt` file with no
  blank line at all holds one story per line; whitespace inside a story collapses to single
  spaces. `.jsonl` files hold one JSON object per line with
  the text under `text_key` (blank lines are skipped). All files are pooled, then split.
"""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

from smollab.config import DataConfig
from smollab.errors import UserError

HUB = {
    # source: (dataset id, text column, train split, test split)
    "simplestories": ("SimpleStories/SimpleStories", "story", "train", "test"),
    "tinystories": ("roneneldan/TinyStories", "text", "train", "validation"),
}


def split(texts: list[str], test_fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """Shuffle by seed and hold out `ceil(n * test_fraction)` texts (at least one each side)."""
    if len(texts) < 2:
        raise UserError(f"the corpus has {len(texts)} stories; at least 2 are needed to split it")
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    n_test = min(len(texts) - 1, max(1, math.ceil(len(texts) * test_fraction)))
    test_idx = set(order[:n_test])
    train = [t for i, t in enumerate(texts) if i not in test_idx]
    test = [texts[i] for i in sorted(test_idx)]
    return train, test


def load_corpus(cfg: DataConfig) -> tuple[list[str], list[str]]:
    """(train, test) texts for `cfg.source`."""
    if cfg.source == "offline":
        from smollab.data.stories import generate_stories

        return split(generate_stories(cfg.num_stories, cfg.seed), cfg.test_fraction, cfg.seed)
    if cfg.source == "files":
        return split(load_files(cfg.files, cfg.text_key), cfg.test_fraction, cfg.seed)
    return load_hub(cfg)


def load_hub(cfg: DataConfig) -> tuple[list[str], list[str]]:
    name, column, train_split, test_split = HUB[cfg.source]
    try:
        from datasets import load_dataset
    except ImportError:
        raise UserError(
            f"data.source={cfg.source} needs the `datasets` package (pip install datasets)"
        ) from None
    n_train = n_test = None
    if cfg.max_stories is not None:
        n_test = max(1, math.ceil(cfg.max_stories * cfg.test_fraction))
        n_train = max(1, cfg.max_stories - n_test)
    out = []
    for split_name, cap in ((train_split, n_train), (test_split, n_test)):
        spec = split_name if cap is None else f"{split_name}[:{cap}]"
        try:
            ds = load_dataset(name, split=spec)
        except Exception as e:  # network, auth, missing dataset: all the same to the user
            msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            raise UserError(
                f"could not load dataset {name} ({type(e).__name__}: {msg}); "
                f"without network use data.source=offline"
            ) from None
        if column not in ds.column_names:
            raise UserError(
                f"dataset {name} split {split_name} has no column {column!r} "
                f"(columns: {', '.join(ds.column_names)})"
            )
        texts = [t for t in ds[column] if isinstance(t, str) and t.strip()]
        out.append(texts[:cap] if cap is not None else texts)
    if not out[0] or not out[1]:
        raise UserError(f"dataset {name} gave an empty train or test split")
    return out[0], out[1]


def load_files(paths: list[str], text_key: str) -> list[str]:
    """Stories from .txt and .jsonl files, in order (see the module docstring for the rules)."""
    if not paths:
        raise UserError("data.source=files needs data.files (a list of .txt or .jsonl paths)")
    texts: list[str] = []
    for raw in paths:
        path = Path(raw).expanduser()
        suffix = path.suffix.lower()
        if suffix not in (".txt", ".jsonl"):
            raise UserError(f"data.files: {path} must end in .txt or .jsonl")
        if not path.is_file():
            raise UserError(f"data.files: {path} not found")
        try:
            content = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise UserError(f"data.files: {path} is not UTF-8 text ({e.reason})") from None
        got = _read_txt(content) if suffix == ".txt" else _read_jsonl(content, path, text_key)
        if not got:
            raise UserError(f"data.files: {path} holds no stories")
        texts.extend(got)
    return texts


def _read_txt(content: str) -> list[str]:
    content = content.replace("\r\n", "\n").strip()
    if re.search(r"\n[ \t]*\n", content):
        parts = re.split(r"\n[ \t]*\n+", content)
    else:
        parts = content.split("\n")
    return [" ".join(p.split()) for p in parts if p.strip()]


def _read_jsonl(content: str, path: Path, key: str) -> list[str]:
    texts = []
    for n, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"data.files: {path} line {n}: invalid JSON ({e.msg})") from None
        if not isinstance(record, dict) or key not in record:
            raise UserError(
                f"data.files: {path} line {n}: no key {key!r} (set data.text_key to the text field)"
            )
        value = record[key]
        if not isinstance(value, str):
            raise UserError(
                f"data.files: {path} line {n}: {key!r} is {type(value).__name__}, expected a string"
            )
        if value.strip():
            texts.append(value.strip())
    return texts
