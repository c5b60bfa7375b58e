"""How the lab's children start, warm or cold, decided in one place for sweeps, probes, bench
and the doctor.

Warm: forked from a server that imported torch, transformers, peft and smollab's loops once
(`smollab.lab.zygote`), so a child skips seconds of imports before its first step. Cold: a fresh
interpreter. `start: auto` (the spec key `Start` in `smollab.lab.spec_common`) is warm on Linux
and cold elsewhere: on macOS a fork without exec after Apple's frameworks load is unsafe. A
caller whose children are not `smollab` processes of its own (Ray's workers, a lanes worker per
slot) passes why as `refused`, which makes `auto` cold and `warm` an error.

`choose` is the decision, `check` refuses an impossible `warm` as a spec or command line is read,
and `open_server` / `server` start the server and log the choice in one line:
`<what> start: warm (<why>): ...` or `<what> start: cold (<why>): ...`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from smollab.errors import UserError
from smollab.lab.zygote import Zygote, ZygoteError

UNSAFE_HERE = "fork after torch's imports is unsafe"


def choose(start: str, refused: str | None = None) -> tuple[bool, str]:
    """(warm, why) for the key's value; `refused`: why this caller's children cannot fork."""
    if start == "cold":
        return False, "start: cold"
    if refused:
        return False, refused
    if not sys.platform.startswith("linux"):  # `warm` was refused there as the spec loaded
        return False, f"start: auto on {sys.platform}: {UNSAFE_HERE}"
    return True, "start: warm" if start == "warm" else "start: auto on Linux"


def check(start: str, key: str, refused: str | None = None) -> None:
    """Refuse `warm` where it cannot be honoured; `key` names it (`sweep key start`, `--start`)."""
    if start != "warm":
        return
    if refused:
        raise UserError(f"{key}: warm is not available here ({refused}); use cold or auto")
    if not sys.platform.startswith("linux"):
        raise UserError(
            f"{key}: warm needs Linux ({sys.platform}: a fork without exec after torch's imports "
            "is unsafe here); use cold or auto"
        )


def open_server(
    start: str,
    log: Path,
    say: Callable[[str], None],
    what: str = "trial",
    env: dict[str, str] | None = None,
    refused: str | None = None,
) -> Zygote | None:
    """The ready warm start server (its output in `log`) when `start` resolves to warm, else
    None; says which and why. The caller closes it (`Zygote.close`)."""
    warm, why = choose(start, refused)
    if not warm:
        say(f"{what} start: cold ({why}): each {what} a fresh interpreter")
        return None
    zygote = Zygote(env=env, log=log)
    try:
        took = zygote.ready()
    except ZygoteError as e:
        zygote.close()
        raise UserError(f"{what} start: warm: {e} (see {log}); or start cold") from None
    say(
        f"{what} start: warm ({why}): {what}s fork from a server (pid {zygote.pid}) that "
        f"imported torch, transformers, peft and smollab's loops once, in {took:.1f} s"
    )
    return zygote


@contextlib.contextmanager
def server(
    start: str,
    log: Path,
    say: Callable[[str], None],
    what: str = "trial",
    env: dict[str, str] | None = None,
) -> Iterator[Zygote | None]:
    """`open_server` for one command's life: the server ends with the block, on an error or
    Ctrl-C too (children still running are the caller's to stop first)."""
    zygote = open_server(start, log, say, what, env)
    try:
        yield zygote
    finally:
        if zygote is not None:
            zygote.close()
