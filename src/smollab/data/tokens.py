"""Token files: one flat uint16 array per split (documents joined by EOS), read by memmap.

`get_batch` draws random windows with a `torch.Generator`, so a resumed run restores the exact
data position by saving and restoring `generator.get_state()`. `eval_batches` returns the same
evenly spaced windows every call, so validation losses are comparable across steps and runs.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from smollab.errors import UserError

if TYPE_CHECKING:  # torch is imported where batches are made: `data prepare` never needs it
    import torch

DTYPE = np.uint16
CHUNK = 8192  # documents encoded per batch


def tmp_path(path: Path) -> Path:
    """A unique hidden sibling of `path` for write-then-`os.replace` (created with the umask)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def _encode(backend, texts: list[str]) -> list:
    fast = getattr(backend, "encode_batch_fast", None)  # no offsets: faster
    if fast is not None:
        return fast(texts, add_special_tokens=False)
    return backend.encode_batch(texts, add_special_tokens=False)


def write_tokens(texts: list[str], tokenizer, path: Path) -> int:
    """Encode `texts`, append EOS after each, write uint16 to `path` atomically; return the count."""
    if len(tokenizer) > np.iinfo(DTYPE).max + 1:
        raise UserError(f"tokenizer has {len(tokenizer)} tokens; uint16 token files hold 65536")
    eos = tokenizer.eos_token_id
    if eos is None:
        raise UserError("the tokenizer has no eos_token; token files need one between documents")
    backend = tokenizer.backend_tokenizer
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(path)
    total = 0
    try:
        with open(tmp, "xb") as f:
            for start in range(0, len(texts), CHUNK):
                encs = _encode(backend, texts[start : start + CHUNK])
                lens = [len(e.ids) + 1 for e in encs]
                arr = np.empty(sum(lens), dtype=DTYPE)
                ends = np.cumsum(lens)
                arr[ends - 1] = eos
                pos = 0
                for e, n in zip(encs, lens, strict=True):
                    arr[pos : pos + n - 1] = e.ids
                    pos += n
                arr.tofile(f)
                total += len(arr)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return total


def open_tokens(path: str | Path) -> np.memmap:
    """The token file as a read-only uint16 memmap."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"token file {path} not found (run `smollab data prepare`)")
    if path.stat().st_size == 0:
        raise UserError(f"token file {path} is empty")
    return np.memmap(path, dtype=DTYPE, mode="r")


def _check_len(tokens: np.ndarray, seq_len: int) -> None:
    if len(tokens) < seq_len + 1:
        raise UserError(
            f"train.seq_len={seq_len} needs at least {seq_len + 1} tokens; the token file has "
            f"{len(tokens)}"
        )


def _windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int):
    import torch

    idx = starts[:, None] + np.arange(seq_len + 1)
    buf = torch.from_numpy(tokens[idx].astype(np.int64))
    return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()


def get_batch(
    tokens: np.ndarray, batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows: x [B, T] and y = x shifted by one, both int64 on the CPU, where the token
    file is (`generator` is a CPU one; `device.runtime.to_device` copies the batch over)."""
    import torch

    _check_len(tokens, seq_len)
    high = len(tokens) - seq_len  # start in [0, high): the window's last target is in range
    starts = torch.randint(0, high, (batch_size,), generator=generator, device="cpu").numpy()
    return _windows(tokens, starts, seq_len)


def eval_batches(
    tokens: np.ndarray, batch_size: int, seq_len: int, max_tokens: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed windows evenly spaced over the file, at most `max_tokens` input tokens in all.

    Windows do not overlap while the file is long enough; the last batch may be smaller."""
    _check_len(tokens, seq_len)
    last = len(tokens) - seq_len - 1
    n = max(1, min(max_tokens // seq_len, last // seq_len + 1))
    starts = np.linspace(0, last, n).round().astype(np.int64)
    return [_windows(tokens, starts[i : i + batch_size], seq_len) for i in range(0, n, batch_size)]
