"""Tables through the `datasets` library: a .jsonl, .csv or .parquet file, a directory written by
`datasets.save_to_disk`, or `load_dataset` on a hub id or a local data directory, with a config
name and a split. Every failure is one line naming the config key and what it was given.

The library is imported here only, when a table is read, and its progress bars are off: a run's
log is for the run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from smollab.errors import UserError

TABLE_SUFFIXES = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def _datasets() -> Any:
    try:
        import datasets
    except ImportError:
        raise UserError(
            "reading a dataset needs the datasets package: pip install datasets"
        ) from None
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def read_table(path: str | Path, key: str) -> Any:
    """A .jsonl (or .json), .csv or .parquet file as a `datasets.Dataset`; `key` names the config
    key in errors. An empty file is an empty dataset (the caller refuses it)."""
    p = Path(path)
    kind = TABLE_SUFFIXES.get(p.suffix.lower())
    if kind is None:
        raise UserError(
            f"{key}: {p} is not a .jsonl, .csv or .parquet file (a .txt file holds one prompt a line)"
        )
    if not p.is_file():
        raise UserError(f"{key}: no such file {p}")
    ds = _datasets()
    if p.stat().st_size == 0:
        return ds.Dataset.from_dict({})
    try:
        reader = {"json": ds.Dataset.from_json, "csv": ds.Dataset.from_csv}
        return reader.get(kind, ds.Dataset.from_parquet)(str(p))
    except Exception as e:  # the library raises many kinds: each is one line here
        raise UserError(f"{key} {p}: cannot read it as {kind} ({_first_line(e)})") from None


def is_saved_dataset(path: str | Path) -> bool:
    """Whether `path` is a directory written by `Dataset.save_to_disk` or `DatasetDict`'s."""
    p = Path(path)
    return (p / "dataset_dict.json").is_file() or (p / "state.json").is_file()


def read_split(hf_dataset: str, hf_name: str | None, split: str, key: str) -> Any:
    """One split of a dataset: a `save_to_disk` directory (`load_from_disk`; a single saved
    `Dataset` is the split it was saved as, `train` when it names none), else `datasets.load_dataset` (a hub id, a local data
    directory or a script), with the configuration `hf_name`."""
    ds = _datasets()
    where = f"{key} {hf_dataset}"
    if is_saved_dataset(hf_dataset):
        if hf_name is not None:
            raise UserError(
                f"{where} is a saved dataset directory: it has no configurations "
                f"(data.hf_name={hf_name})"
            )
        try:
            saved = ds.load_from_disk(hf_dataset)
        except Exception as e:
            raise UserError(f"{where}: cannot load it ({_first_line(e)})") from None
        if isinstance(saved, ds.DatasetDict):
            if split not in saved:
                raise UserError(f"{where} has no split {split!r} (its splits: {', '.join(saved)})")
            return saved[split]
        own = str(saved.split or "train")  # one saved split: it answers to its own name only
        if split != own:
            raise UserError(f"{where} holds one split, {own}: it has no split {split!r}")
        return saved
    try:
        return ds.load_dataset(hf_dataset, hf_name, split=split)
    except Exception as e:
        raise UserError(f"{where} split {split}: {_first_line(e)}") from None
