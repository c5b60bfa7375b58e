"""One sweep per sweep dir: an exclusive `flock` on `<dir>/.sweep.lock`, which holds the pid.

The kernel releases the lock when the holder dies, however it dies, so a killed sweep never
leaves a stale lock behind; a second `smollab sweep` on the same dir stops at once with one line
naming the dir and the holder's pid. Readers (`smollab report`) test the lock with a shared one
for an instant to tell a live sweep from a dead one, so taking the lock retries for half a second.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import IO

from smollab.errors import UserError
from smollab.rundir.runs import SWEEP_LOCK


class SweepLock:
    def __init__(self, sweep_dir: Path):
        self.dir = Path(sweep_dir)
        self._file: IO[str] | None = None

    def acquire(self, tries: int = 5) -> None:
        import fcntl

        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            f = open(self.dir / SWEEP_LOCK, "a+")
        except OSError as e:
            raise UserError(f"sweep dir {self.dir}: cannot create it ({e.strerror})") from None
        for i in range(tries):
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if i < tries - 1:
                    time.sleep(0.1)
        else:
            f.seek(0)
            owner = f.read().strip() or "?"
            f.close()
            raise UserError(
                f"sweep dir {self.dir} is in use by another sweep (pid {owner}); "
                f"wait for it or stop it first"
            )
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f

    def release(self) -> None:
        if self._file:
            self._file.close()
            self._file = None
