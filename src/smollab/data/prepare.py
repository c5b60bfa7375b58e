"""`smollab data prepare`: corpus -> text splits -> tokenizer -> token files -> meta.json.

Writes into `data.dir`:

    train.jsonl, test.jsonl   one {"text": ...} per line (GRPO takes prompts from test)
    tokenizer/                HF tokenizer directory
    train.bin, val.bin        uint16 tokens, documents joined by EOS (val = the test split)
    meta.json                 written last: its presence means the directory is complete

A second call with the same config (every DataConfig field but `dir`, and for `source=files`
the same file sizes and modification times) reuses the directory and returns its meta.
Every file is written atomically, meta.json is removed before any rewrite, and concurrent
`prepare` calls on one directory (a sweep's trials) serialize on a lock file.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from smollab.config import DataConfig
from smollab.data.tokenizer import SPECIALS
from smollab.data.tokens import tmp_path
from smollab.errors import UserError

META = "meta.json"
FILES = ("train.jsonl", "test.jsonl", "tokenizer/tokenizer.json", "train.bin", "val.bin")


def _atomic_write(path: Path, write: Callable[[Any], None]) -> None:
    tmp = tmp_path(path)
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_jsonl(path: Path, texts: list[str]) -> None:
    _atomic_write(path, lambda f: f.writelines(json.dumps({"text": t}) + "\n" for t in texts))


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # Windows: no lock, still atomic files
        yield
        return
    with open(directory / ".prepare.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _fingerprint(cfg: DataConfig) -> list | None:
    if cfg.source != "files":
        return None
    out = []
    for p in cfg.files:
        try:
            st = Path(p).expanduser().stat()
            out.append([p, st.st_size, st.st_mtime_ns])
        except OSError:
            out.append([p, None, None])
    return out


def _key(config: dict) -> dict:
    """The fields that decide the content: not `dir`, and vocab_size None means its default."""
    out = {k: v for k, v in config.items() if k != "dir"}
    if out.get("vocab_size") is None:
        out["vocab_size"] = (
            SPECIALS[out["tokenizer"]][2] if out.get("tokenizer") in SPECIALS else None
        )
    return out


def load_meta(directory: str | Path) -> dict:
    """The meta.json of a prepared data directory; UserError if it was not prepared."""
    d = Path(directory)
    path = d / META
    if not path.is_file():
        raise UserError(f"data dir {d} is not prepared: run `smollab data prepare data.dir={d}`")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(
            f"data dir {d}: unreadable {META} ({e}); run `smollab data prepare`"
        ) from None


def _reusable(d: Path, cfg: DataConfig) -> dict | None:
    try:
        meta = load_meta(d)
    except UserError:
        return None
    same = _key(meta.get("config", {})) == _key(cfg.model_dump())
    same = same and meta.get("files_fingerprint") == _fingerprint(cfg)
    if same and all((d / f).exists() for f in FILES):
        return meta
    return None


def prepare(cfg: DataConfig, log: Callable[[str], None] = print) -> dict:
    """Build (or reuse) the data directory `cfg.dir`; return its meta."""
    d = Path(cfg.dir).expanduser()
    created = not d.exists()
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"data.dir={cfg.dir}: cannot create it ({e.strerror})") from None
    try:
        with _locked(d):
            meta = _reusable(d, cfg)
            if meta is not None:
                log(f"data: reusing {d} (prepared with the same config)")
                return meta
            return _build(d, cfg, log)
    except UserError:  # bad input (a data file): leave no directory behind that we made
        if created:
            shutil.rmtree(d, ignore_errors=True)
        raise


def ensure_prepared(
    cfg: DataConfig, exact: bool = True, log: Callable[[str], None] = print
) -> dict:
    """The meta of a data directory ready for use, prepared here only if it has to be.

    `exact`: the directory must hold what `cfg` describes (pretraining, whose tokens are the
    data); otherwise (GRPO and the other fine-tuning loops, which read prompts and the tokenizer)
    any prepared directory at `cfg.dir` is used as it is, and one is prepared only if none is.
    """
    if not exact and (Path(cfg.dir).expanduser() / META).exists():
        meta = load_meta(Path(cfg.dir).expanduser())
        was = meta.get("config", {})
        for key in cfg.changed(*(k for k in type(cfg).model_fields if k != "dir")):
            if key in was and was[key] != getattr(cfg, key):  # set, yet the directory differs
                raise UserError(
                    f"data.{key}={getattr(cfg, key)}: data.dir {cfg.dir} was prepared "
                    f"with {was[key]} and is used as it is; give another data.dir"
                )
        return meta
    return prepare(cfg, log=log)


def _build(d: Path, cfg: DataConfig, log: Callable[[str], None]) -> dict:
    from smollab.data.corpus import load_corpus
    from smollab.data.tokenizer import train_tokenizer
    from smollab.data.tokens import write_tokens

    t0 = time.perf_counter()
    log(f"data: loading corpus (source={cfg.source})")
    train, test = load_corpus(cfg)  # bad input stops here, before anything is touched
    (d / META).unlink(missing_ok=True)
    t1 = time.perf_counter()
    log(f"data: {len(train)} train and {len(test)} test stories ({t1 - t0:.1f}s)")
    _write_jsonl(d / "train.jsonl", train)
    _write_jsonl(d / "test.jsonl", test)
    tok = train_tokenizer(train, cfg.tokenizer, cfg.vocab_size, d / "tokenizer")
    t2 = time.perf_counter()
    log(f"data: trained {cfg.tokenizer} tokenizer, {len(tok)} entries ({t2 - t1:.1f}s)")
    n_train = write_tokens(train, tok, d / "train.bin")
    n_val = write_tokens(test, tok, d / "val.bin")
    t3 = time.perf_counter()
    log(f"data: {n_train} train and {n_val} val tokens ({t3 - t2:.1f}s)")
    meta = {
        "source": cfg.source,
        "stories": {"train": len(train), "test": len(test)},
        "tokens": {"train": n_train, "val": n_val},
        "vocab_size": len(tok),
        "tokenizer": cfg.tokenizer,
        "eos_id": tok.eos_token_id,
        "eos_token": tok.eos_token,
        "pad_id": tok.pad_token_id,
        "dtype": "uint16",
        "files": {
            "train_text": "train.jsonl",
            "test_text": "test.jsonl",
            "tokenizer": "tokenizer",
            "train_tokens": "train.bin",
            "val_tokens": "val.bin",
        },
        "config": cfg.model_dump(),
        "files_fingerprint": _fingerprint(cfg),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    _atomic_write(d / META, lambda f: json.dump(meta, f, indent=2))
    log(f"data: prepared {d} in {meta['seconds']:.1f}s")
    return meta
