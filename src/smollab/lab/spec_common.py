"""What the sweep and probe specs share: a strict section, numbers as users mean them, nested keys
flattened to dotted ones, and a value written back as a child's `key=value` override."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict


class SpecSection(BaseModel):
    model_config = ConfigDict(extra="forbid")


_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def coerce(value: Any) -> Any:
    """YAML reads `1e-4` (no dot) as a string; in a spec a number is what users mean."""
    if isinstance(value, str) and _NUMBER.match(value.strip()):
        v = float(value)
        return int(v) if v.is_integer() and not any(c in value for c in ".eE") else v
    if isinstance(value, list):
        return [coerce(v) for v in value]
    if isinstance(value, dict):
        return {k: coerce(v) for k, v in value.items()}
    return value


def flatten(tree: Any, prefix: str = "", stop: Callable[[Any], bool] = lambda v: False) -> Any:
    """Nested mappings as dotted keys (`{optim: {lr: 1}}` -> `{optim.lr: 1}`); a mapping for which
    `stop` is true stays a value (a distribution's `low`/`high`)."""
    out: dict[str, Any] = {}
    if not isinstance(tree, dict):
        return tree
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v and not stop(v):
            out.update(flatten(v, key + ".", stop))
        else:
            out[key] = v
    return out


def override_value(v: Any) -> str:
    """A value as the child's `key=value` parser reads it back exactly."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isfinite(v):
            return repr(v)
        return {math.inf: ".inf", -math.inf: "-.inf"}.get(v, ".nan")
    if isinstance(v, list | dict):
        return yaml.safe_dump(v, default_flow_style=True).strip()
    return str(v)
