"""A throwaway PostgreSQL server for the sweep's RDB-storage tests: its own data dir in a temporary
directory, a free localhost port, fsync off, stopped and removed afterwards.

It uses Debian's server binaries (/usr/lib/postgresql/<version>/bin; `.ci/run` installs the
`postgresql` package when they are missing). initdb refuses to run as root, so under root every
server command runs as the `postgres` user, who then owns the data dir.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest


def server_bin_dir() -> Path | None:
    """The newest installed server's bin dir, or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One running server; `url(db)` for SQLAlchemy (psycopg2), `create_database()` per test."""

    def __init__(self, bin_dir: Path):
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="smollab-pg-"))  # /tmp: reachable by `postgres`
        self.data = self.root / "data"
        self.port = free_port()
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *argv: str) -> None:
        cmd = [str(self.bin / argv[0]), *argv[1:]]
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}{r.stderr}{tail}"
            )

    def start(self) -> PostgresServer:
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            "--no-instructions",
        )
        opts = (
            f"-c port={self.port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={self.root} -c fsync=off "
            f"-c synchronous_commit=off -c full_page_writes=off"
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-o",
            opts,
            "-w",
            "-t",
            "60",
            "start",
        )
        return self

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, db: str = "postgres") -> str:
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{db}"

    def create_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg2

        name = f"t_{uuid.uuid4().hex[:12]}"
        conn = psycopg2.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", connect_timeout=10
        )
        conn.autocommit = True  # CREATE DATABASE cannot run in a transaction
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()
        return self.url(name)


def start_or_skip() -> PostgresServer:
    bin_dir = server_bin_dir()
    if bin_dir is None:
        pytest.skip(
            "no PostgreSQL server binaries (/usr/lib/postgresql/*/bin/initdb); "
            "install Debian's postgresql package (.ci/run does)"
        )
    server = PostgresServer(bin_dir)
    try:
        return server.start()
    except BaseException:
        server.stop()
        raise
