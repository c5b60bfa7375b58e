"""SFT's records: prompt/completion (or text) dicts from a local .jsonl file or an HF dataset,
and the held-out split (a file, a split of the dataset, or a fraction carved by seed).

A record is a prompt/completion pair when it has both fields (`data.prompt_field`,
`data.completion_field`), otherwise a text (`data.text_field`); anything else stops the run with
one line naming the file (or dataset) and the record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smollab.config.sft import SFTDataConfig
from smollab.data.dataset_files import read_split
from smollab.data.prompt_rows import held_out_rows
from smollab.errors import UserError


@dataclass(frozen=True)
class Record:
    """One training example: `prompt` is None for a plain text (loss on every token)."""

    prompt: str | None
    completion: str


@dataclass
class Records:
    train: list[Record]
    eval: list[Record]
    source: str  # where they came from, for the log and summary
    held_out: str  # how the eval records were chosen


def load_records(d: SFTDataConfig) -> Records:
    """Training and held-out records of the data section (one source: a file or a dataset)."""
    if d.train_file:
        train = read_jsonl(d.train_file, d, "data.train_file")
        if d.eval_file:
            return Records(
                train,
                read_jsonl(d.eval_file, d, "data.eval_file"),
                d.train_file,
                f"data.eval_file {d.eval_file}",
            )
        kept, held = carve(train, d.eval_fraction, d.seed)
        return Records(kept, held, d.train_file, _carved(d, len(held)))
    if d.hf_dataset:
        train = _hub_split(d, d.split)
        if d.eval_split:
            return Records(
                train, _hub_split(d, d.eval_split), d.hf_dataset, f"split {d.eval_split}"
            )
        kept, held = carve(train, d.eval_fraction, d.seed)
        return Records(kept, held, f"{d.hf_dataset}:{d.split}", _carved(d, len(held)))
    raise UserError("data.train_file or data.hf_dataset: sft needs records to train on")


def _carved(d: SFTDataConfig, n: int) -> str:
    return f"{n} records carved out (data.eval_fraction={d.eval_fraction:g}, data.seed={d.seed})"


def carve(records: list[Record], fraction: float, seed: int) -> tuple[list[Record], list[Record]]:
    """(kept, held out): a seeded choice of ceil(fraction x n) records (at least one, and at least
    one kept), each part in its original order. The same seed always holds out the same ones."""
    n = len(records)
    if n < 2:
        raise UserError(f"{n} record(s): too few to hold any out (give data.eval_file or more)")
    held = held_out_rows(n, fraction, seed)
    return (
        [r for i, r in enumerate(records) if i not in held],
        [r for i, r in enumerate(records) if i in held],
    )


def read_jsonl(path: str, d: SFTDataConfig, key: str) -> list[Record]:
    """Every line of a .jsonl file as a Record; one UserError naming the file and line."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{key}: no such file {p}")
    out = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{key} {p} line {n}: not JSON ({e.msg})") from None
            out.append(to_record(row, d, f"{key} {p} line {n}"))
    if not out:
        raise UserError(f"{key} {p}: no records")
    return out


def to_record(row: Any, d: SFTDataConfig, where: str) -> Record:
    """A prompt/completion pair when both fields are there, else a text."""
    if not isinstance(row, dict):
        raise UserError(f"{where}: expected an object, got {type(row).__name__}")
    p, c, t = row.get(d.prompt_field), row.get(d.completion_field), row.get(d.text_field)
    if p is not None and c is not None:
        if not isinstance(p, str) or not isinstance(c, str):
            raise UserError(f"{where}: {d.prompt_field} and {d.completion_field} must be strings")
        return Record(p, c)
    if t is not None:
        if not isinstance(t, str):
            raise UserError(f"{where}: {d.text_field} must be a string")
        return Record(None, t)
    raise UserError(
        f"{where}: needs {d.prompt_field!r} and {d.completion_field!r}, or "
        f"{d.text_field!r} (data.prompt_field, completion_field, text_field); it has "
        f"{', '.join(map(repr, list(row)[:5])) or 'no fields'}"
    )


def _hub_split(d: SFTDataConfig, split: str) -> list[Record]:
    """One split through `dataset_files.read_split` (a hub id, a local data directory, a
    `save_to_disk` directory)."""
    ds = read_split(d.hf_dataset, d.hf_name, split, "data.hf_dataset")
    where = f"data.hf_dataset {d.hf_dataset} split {split}"
    out = [to_record(row, d, f"{where} record {i}") for i, row in enumerate(ds)]
    if not out:
        raise UserError(f"{where}: no records")
    return out
