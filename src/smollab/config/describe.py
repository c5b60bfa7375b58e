"""A schema's keys as `smollab COMMAND --help` lists them: each dotted key with its type, its
constraints, its default and its description, read from the schema itself (the one source), as
litgpt's and TRL's command lines list theirs.

Works for any pydantic model: the command schemas (`registry.SCHEMAS`) and the lab's sweep and
probe specs. A section is walked into (`optim.lr`); a list of sections (`reward`) lists the
list itself, then its items' keys as `reward[].name`.
"""

from __future__ import annotations

import json
import shutil
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types as at
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined


@dataclass(frozen=True)
class Key:
    """One dotted key of a schema."""

    key: str
    type: str  # e.g. "float > 0", "auto|cpu|cuda|mps", "str|null"
    default: str  # as written in YAML; "required" when the key has none
    description: str


def _section(ann: Any) -> type[BaseModel] | None:
    """The model a field holds (`Section`, or `Section | None`), else None."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        models = [
            a for a in typing.get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        return models[0] if len(models) == 1 and len(typing.get_args(ann)) <= 2 else None
    return None


def _list_item_section(ann: Any) -> type[BaseModel] | None:
    """The model of a list of sections (`list[RewardSpec]`), else None."""
    if typing.get_origin(ann) is list:
        (item,) = typing.get_args(ann)
        if isinstance(item, type) and issubclass(item, BaseModel):
            return item
    return None


def type_name(ann: Any) -> str:
    """A YAML user's name for a field's type: `int`, `str|null`, `auto|cpu|cuda|mps`, `list[str]`."""
    if ann is type(None):
        return "null"
    if ann is Any:
        return "any"
    origin = typing.get_origin(ann)
    if origin is Literal:
        return "|".join(str(a) for a in typing.get_args(ann))
    if origin in (typing.Union, types.UnionType):
        return "|".join(type_name(a) for a in typing.get_args(ann))
    if origin is list:
        return f"list[{type_name(typing.get_args(ann)[0])}]"
    if origin is dict:
        return "mapping"
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "section"
    return getattr(ann, "__name__", str(ann))


_BOUNDS = ((at.Gt, "gt", ">"), (at.Ge, "ge", ">="), (at.Lt, "lt", "<"), (at.Le, "le", "<="))


def _constraints(field: FieldInfo) -> str:
    """`> 0`, `>= 0, < 1`, `length >= 1`: the bounds pydantic checks."""
    out = []
    for meta in field.metadata:
        for kind, attr, sign in _BOUNDS:
            if isinstance(meta, kind):
                out.append(f"{sign} {_value(getattr(meta, attr))}")
        if isinstance(meta, at.MinLen) and meta.min_length:
            out.append(f"length >= {meta.min_length}")
    return ", ".join(out)


def _value(v: Any) -> str:
    """A value as written in YAML: null, true, 1e-05, [q, k], {name: happy_binary}."""
    if isinstance(v, BaseModel):
        v = v.model_dump(exclude_defaults=True)
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(v)


def _default(field: FieldInfo) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    return _value(field.get_default(call_default_factory=True))


def schema_keys(schema: type[BaseModel], prefix: str = "") -> list[Key]:
    """Every key a user can set, in the schema's order, sections walked into."""
    out: list[Key] = []
    for name, field in schema.model_fields.items():
        dotted, ann = f"{prefix}{name}", field.annotation
        if (sub := _section(ann)) is not None:
            out.extend(schema_keys(sub, f"{dotted}."))
            continue
        kind = type_name(ann)
        if (item := _list_item_section(ann)) is not None:
            kind = "list of sections"
        if bounds := _constraints(field):
            kind = f"{kind} {bounds}" if bounds[0] in "<>" else f"{kind}, {bounds}"
        out.append(Key(dotted, kind, _default(field), field.description or ""))
        if item is not None:
            out.extend(schema_keys(item, f"{dotted}[]."))
    return out


def keys_help(schema: type[BaseModel], title: str, width: int | None = None) -> str:
    """The help section listing `schema`'s keys: `key  description (type; default X)`, wrapped
    to the terminal like argparse's own help."""
    width = width or min(max(shutil.get_terminal_size((100, 24)).columns - 2, 60), 118)
    keys = schema_keys(schema)
    column = min(max(len(k.key) for k in keys) + 4, 34)
    lines = [title]
    for k in keys:
        text = f"{k.description} ({k.type}; default {k.default})".lstrip()
        if k.default == "required":
            text = f"{k.description} ({k.type}; required)".lstrip()
        wrapped = textwrap.wrap(text, width - column) or [""]
        head = f"  {k.key}"
        if len(head) + 2 <= column:
            lines.append(head.ljust(column) + wrapped[0])
            wrapped = wrapped[1:]
        else:
            lines.append(head)
        lines.extend(" " * column + w for w in wrapped)
    return "\n".join(lines) + "\n"
