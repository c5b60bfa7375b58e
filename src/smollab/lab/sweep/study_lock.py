"""A lock on one sweep study shared by several parents through an RDB `storage:` URL (two
machines, one PostgreSQL study), held while a parent asks the study for a trial and while it
creates the retry of a trial that failed under an earlier parent of its dir.

Optuna's storage makes each write atomic, but "count the trials, then ask for one" is two steps,
and GridSampler picks its point from the trials it reads (its own comment: in distributed
optimization several workers may pick the same grid point). Two parents asking at once could
then run one point twice or overrun the grid. The sweep dir's flock covers one machine only, so
this lock lives where the study does: a PostgreSQL session-level advisory lock, MySQL's
GET_LOCK, and for SQLite (one machine by nature) a flock beside the database file. Each hold
opens its own connection and closes it after, so no idle connection goes stale in a long sweep,
and a parent that dies while holding it loses the lock with its connection. The default journal
file needs none: it lives in the sweep dir, whose lock admits one parent.
"""

from __future__ import annotations

import hashlib
from typing import IO, Any

from smollab.errors import UserError

WAIT_S = 60  # a peer holds the lock for milliseconds; a minute means it is wedged


class StudyLock:
    """`with lock:` around the steps that must not interleave between parents (re-entrant)."""

    def __init__(self, storage: str | None, study_name: str):
        self.storage = storage
        self.name = study_name
        self._depth = 0
        self._engine: Any = None
        self._conn: Any = None  # a SQLAlchemy connection while the lock is held
        self._file: IO[str] | None = None
        self._key = int.from_bytes(
            hashlib.sha1(study_name.encode()).digest()[:8], "big", signed=True
        )

    def _backend(self) -> str | None:
        if not self.storage:
            return None
        from sqlalchemy.engine.url import make_url

        return make_url(self.storage).get_backend_name()

    def _connection(self) -> Any:
        import sqlalchemy

        from smollab.lab.sweep.study import storage_engine, storage_error

        if self._engine is None:
            self._engine = storage_engine(self.storage)
        try:
            conn = self._engine.connect()
        except sqlalchemy.exc.SQLAlchemyError as e:
            raise storage_error(self.storage, e) from None
        self._conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        return self._conn

    def _acquire(self) -> None:
        from sqlalchemy import text

        backend, key = self._backend(), self._key
        if backend == "postgresql":
            conn = self._connection()
            conn.execute(text(f"SET lock_timeout = '{WAIT_S}s'"))
            try:
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            except Exception as e:
                if "lock timeout" not in str(e):
                    raise
                raise self._wedged() from None
        elif backend == "mysql":
            got = (
                self._connection()
                .execute(text("SELECT GET_LOCK(:n, :t)"), {"n": f"smollab-{key:x}", "t": WAIT_S})
                .scalar()
            )
            if got != 1:
                raise self._wedged()
        elif backend == "sqlite":
            import fcntl

            from sqlalchemy.engine.url import make_url

            self._file = open(f"{make_url(self.storage).database}.smollab-lock", "a+")
            fcntl.flock(self._file, fcntl.LOCK_EX)

    def _release(self, unlock: bool = True) -> None:
        """Unlock, then end the session. Ending it alone would release the lock too (a dead
        parent's is released that way), but the server does so a moment after the client has
        gone, while an explicit unlock is done when it returns."""
        from sqlalchemy import text

        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                if unlock and self._backend() == "postgresql":
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
                elif unlock:
                    conn.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": f"smollab-{self._key:x}"})
            finally:
                conn.close()
        if self._file is not None:
            self._file.close()  # closing drops the flock
            self._file = None

    def _wedged(self) -> UserError:
        return UserError(
            f"sweep key storage: waited {WAIT_S} s for the lock on study "
            f"{self.name!r}, which another sweep parent holds; is one stuck?"
        )

    def __enter__(self) -> StudyLock:
        if self._depth == 0:
            try:
                self._acquire()
            except BaseException:
                self._release(unlock=False)  # the connection or file it may have opened
                raise
        self._depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._release()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
