"""Lab fixtures: the fake lanes worker (tests/lab/fake_lanes_worker.py) in place of the real one."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FAKE_WORKER = Path(__file__).parent / "fake_lanes_worker.py"


@pytest.fixture
def fake_lanes(monkeypatch):
    """Make the lab start the fake lanes worker instead of `python -m smollab lanes`."""
    from smollab.lab import children

    monkeypatch.setattr(
        children, "lanes_argv", lambda args: [sys.executable, str(FAKE_WORKER), *args]
    )
    return FAKE_WORKER
