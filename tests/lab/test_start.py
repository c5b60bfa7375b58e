"""The one decision warm or cold (`smollab.lab.start`) that sweeps, probes, bench and the doctor
share: what each value resolves to and why, the refusals, and a server that ends with its block."""

from __future__ import annotations

import sys

import pytest

from smollab.errors import UserError
from smollab.lab import start, zygote


def test_choose_says_why(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    assert start.choose("auto") == (True, "start: auto on Linux")
    assert start.choose("warm") == (True, "start: warm")
    assert start.choose("cold") == (False, "start: cold")
    assert start.choose("auto", "executor ray starts its own processes") == (
        False,
        "executor ray starts its own processes",
    )
    monkeypatch.setattr(sys, "platform", "darwin")
    assert start.choose("auto") == (
        False,
        "start: auto on darwin: fork after torch's imports is unsafe",
    )


def test_check_refuses_warm_where_it_cannot_be_honoured(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    start.check("warm", "probe key start")
    with pytest.raises(UserError, match=r"^--start: warm is not available here \(no fork\)"):
        start.check("warm", "--start", "no fork")
    start.check("auto", "--start", "no fork")  # auto: cold there, said in the log
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(UserError, match=r"^probe key start: warm needs Linux \(darwin"):
        start.check("warm", "probe key start")
    start.check("cold", "probe key start")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm starts: Linux")
def test_the_server_ends_with_its_block_also_on_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(zygote, "WARM_MODULES", ())  # the server itself, not its imports
    said: list[str] = []
    with (
        pytest.raises(RuntimeError, match="boom"),
        start.server("auto", tmp_path / "warm.log", said.append, what="run") as z,
    ):
        assert z is not None and z.died() is None
        raise RuntimeError("boom")
    assert z.proc.returncode is not None and z.gone == f"(pid {z.pid}) was closed"
    (line,) = said
    assert line.startswith(
        f"run start: warm (start: auto on Linux): runs fork from a server (pid {z.pid})"
    )
    said.clear()
    with start.server("cold", tmp_path / "warm.log", said.append, what="variant") as z:
        assert z is None
    assert said == ["variant start: cold (start: cold): each variant a fresh interpreter"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm starts: Linux")
def test_a_server_that_cannot_import_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(zygote, "WARM_MODULES", ("smollab_no_such_module",))
    with (
        pytest.raises(UserError, match=r"^check start: warm: the warm start server failed: "),
        start.server("warm", tmp_path / "warm.log", print, what="check"),
    ):
        pass
