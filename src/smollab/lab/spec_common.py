"""What the sweep and probe specs (and bench's options) share: a strict section, the `start` key,
numbers as users mean them, nested keys flattened to dotted ones, and a value written back as a
child's `key=value` override."""

from __future__ import annotations

import math
import re
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

START_HELP = (
    "how each child process starts: warm (forked from a server that imported torch, "
    "transformers, peft and smollab once), cold (a fresh interpreter); auto: warm on Linux, "
    "cold elsewhere (fork after Apple's frameworks load is unsafe) and under a sweep's "
    "executor lanes or ray (see the sweep's log for why)"
)
StartValue = Literal["auto", "warm", "cold"]
# The sweep's and the probe's `start` key, and bench's --start (its choices and help); what it
# resolves to is decided in `smollab.lab.start`.
Start = Annotated[StartValue, Field(description=START_HELP)]


def _takes(ann: Any, types: tuple[type, ...]) -> bool:
    """Whether a field's annotation admits a value of one of `types` (Any admits all)."""
    if ann is Any or (isinstance(ann, type) and issubclass(ann, types)):
        return True
    if typing.get_origin(ann) is typing.Literal:
        return any(isinstance(a, types) for a in typing.get_args(ann))
    return any(_takes(a, types) for a in typing.get_args(ann))


class SpecSection(BaseModel):
    """Base of the sweep and probe specs' sections: unknown keys are errors, and no float key
    takes NaN or infinity (a timeout or limit that can be off is null)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """pydantic reads `true` as 1 where a number is due; in a spec that is a mistake."""
        ann = cls.model_fields[info.field_name].annotation
        items = value if isinstance(value, list) else [value]
        if (
            any(isinstance(v, bool) for v in items)
            and _takes(ann, (int, float))
            and not _takes(ann, (bool,))
        ):
            raise ValueError(
                f"expected {'numbers' if isinstance(value, list) else 'a number'}"
                f", not true or false"
            )
        return value


# pydantic names the member of a union, a validator or a model in an error's location
_NOT_A_KEY = re.compile(
    r"^(int|float|str|bool|none|literal\[.*|list\[.*|dict\[.*|function-.*|[A-Z]\w*)$"
)


def error_line(err: ValidationError, what: str) -> str:
    """The first error of a validation as one line: `<what> key <dotted.key>: <message>`."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"] if not _NOT_A_KEY.match(str(p)))
    msg = e["msg"].removeprefix("Value error, ")
    got = e.get("input")
    shown = (
        ""
        if isinstance(got, dict) or got is None or "not true or false" in msg
        else f" (got {got!r})"
    )
    return f"{what} key {loc}: {msg}{shown}" if loc else f"{what}: {msg}{shown}"


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
