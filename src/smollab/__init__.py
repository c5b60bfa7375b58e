"""smollab: fast, systematic experiments on small language models.

The Python API (`smollab.api`) is reachable from here without importing it, or torch, up front:
`smollab.pretrain(...)`, `smollab.sft(...)`, `smollab.rft(...)`, `smollab.grpo(...)`,
`smollab.sweep(...)` and the rest resolve on first use. `demo` and `report` are also names of subpackages, so those two are `smollab.api.demo` and
`smollab.api.report`.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# the API's functions served here; `demo` and `report` would clash with smollab.demo/.report
_API = (
    "bench",
    "data_prepare",
    "doctor",
    "grpo",
    "lanes",
    "load_config",
    "pretrain",
    "probe",
    "recipes",
    "rft",
    "sample",
    "sft",
    "sweep",
)


def __getattr__(name: str) -> Any:
    if name in _API:
        from smollab import api

        return getattr(api, name)
    if name == "api":
        import smollab.api

        return smollab.api
    raise AttributeError(f"module 'smollab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_API, "api"])
