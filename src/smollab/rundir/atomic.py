"""Writes that matter, done so that a crash or a full disk never leaves half a file: temp file,
fsync, rename, fsync of the directory; a full disk becomes one ENOSPC naming the file meant.
Its own module beside the run directory's names (`runs`) because the lab writes its sweep files,
and the device its measured peaks, the same way.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smollab.errors import UserError


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def atomic_write(path: Path, write: Callable[[Any], Any], newline: str | None = None) -> None:
    """Write `path` through `write(file)` under a temporary name, fsync it, rename it into place
    and fsync the directory: a reader or a crash sees the old file or the new one, never half.
    The temporary file goes away whatever happens; a full disk is an ENOSPC naming `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with writing(path):
            with open(tmp, "w", newline=newline) as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def fsync_dir(path: Path) -> None:
    """Make a rename inside `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def is_disk_full(e: BaseException) -> bool:
    """ENOSPC, also when a library (safetensors, torch.save) wraps it in its own error type."""
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return True
    text = str(e)
    return "No space left on device" in text or "StorageFull" in text


@contextlib.contextmanager
def writing(path: Path):
    """Re-raise a full disk met inside as OSError(ENOSPC) naming `path`, the file the run meant to
    write (the OS names a temporary file, or none at all for a failed flush)."""
    try:
        yield
    except Exception as e:
        if is_disk_full(e):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from e
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"file not found: {path}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: invalid JSON ({e.msg} at line {e.lineno})") from None


def one_line(e: BaseException | str, limit: int = 300) -> str:
    """An exception (or text) as one line of at most `limit` characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())
