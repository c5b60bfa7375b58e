"""Loading a command's config: YAML recipe < dotted overrides < Python values, validated by the
command's schema (`registry.SCHEMAS`). Every failure is a `UserError` with one line that names
the key, file or value, raised before any work starts; a key another command reads gets the
reason this one does not (`not_read.not_read`).
"""

from __future__ import annotations

import contextlib
import difflib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from smollab.config.not_read import SFT_DATA_KEYS, not_read
from smollab.config.recipes import resolve_recipe
from smollab.config.registry import SCHEMAS
from smollab.config.sections import Section
from smollab.errors import UserError


def guess_command(
    recipe: dict[str, Any] | str | Path | None, overrides: list[str] | tuple[str, ...] = ()
) -> str:
    """The training command a recipe (a YAML file or its mapping) and overrides are for: RFT if
    they have an `rft` section, GRPO if a `grpo` or `reward` section, SFT if an `sft` section or
    a data key of SFT's records, otherwise pretraining."""
    tree = read_yaml(resolve_recipe(recipe)) if isinstance(recipe, str | Path) else recipe or {}
    if "rft" in tree or any(o.startswith("rft.") for o in overrides):
        return "rft"
    if (
        "grpo" in tree
        or "reward" in tree
        or any(o.startswith(("grpo.", "reward")) for o in overrides)
    ):
        return "grpo"
    data = tree.get("data") if isinstance(tree.get("data"), dict) else {}
    sft_keys = ("sft.", *(f"data.{k}=" for k in SFT_DATA_KEYS))
    if (
        "sft" in tree
        or set(data) & set(SFT_DATA_KEYS)
        or any(o.startswith(sft_keys) for o in overrides)
    ):
        return "sft"
    return "pretrain"


def read_yaml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A YAML mapping from `path`; every problem is one UserError naming `what` and the file."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{what} not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"{what} {p}{where}: invalid YAML ({getattr(e, 'problem', e)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{what} {p}: expected a mapping, got {type(data).__name__}")
    return data


def parse_override(item: str) -> tuple[str, Any]:
    """`optim.lr=3e-4` -> ("optim.lr", 0.0003); values are parsed as YAML scalars or lists."""
    key, sep, raw = item.partition("=")
    if not sep or not key or " " in key:
        raise UserError(f"override {item!r}: expected key=value, e.g. optim.lr=3e-4")
    try:
        value = yaml.safe_load(raw) if raw != "" else None
    except yaml.YAMLError:
        value = raw
    # YAML reads 3e-4 as a string (no dot); numbers are what users mean.
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value) if any(c in value for c in ".eE") else int(value)
    return key.strip(), value


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise UserError(f"override {key}: {'.'.join(parts[: i + 1])} is not a section")
        node = child
    node[parts[-1]] = value


def _known_keys(schema: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in schema.model_fields.items():
        dotted = f"{prefix}{name}"
        keys.append(dotted)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_known_keys(ann, dotted + "."))
    return keys


def _check_keys(
    schema: type[BaseModel],
    tree: dict[str, Any],
    root: type[BaseModel],
    command: str | None,
    prefix: str = "",
) -> None:
    """Before pydantic sees them: a key another command reads is refused with the reason this
    one does not (`not_read.NOT_READ`); any other unknown key gets a did-you-mean over the
    full dotted keys."""
    known = set(schema.model_fields)
    for name, value in tree.items():
        dotted = f"{prefix}{name}"
        if name not in known:
            while isinstance(value, dict) and value:  # name the leaf the user wrote
                name, value = next(iter(value.items()))
                dotted = f"{dotted}.{name}"
            if command and (why := not_read(command, dotted)):
                raise UserError(f"config key {dotted}: {command} does not read it ({why})")
            candidates = _known_keys(root)
            close = difflib.get_close_matches(dotted, candidates, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UserError(f"unknown config key {dotted}{hint}")
        ann = schema.model_fields[name].annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel) and isinstance(value, dict):
            _check_keys(ann, value, root, command, dotted + ".")


def format_validation_error(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-after"))
    msg = e["msg"].removeprefix("Value error, ")
    got = e.get("input")
    shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
    return f"config key {loc or '(root)'}: {msg}{shown}" if loc else f"config: {msg}"


def validate(schema: type[Section], tree: dict[str, Any]) -> Section:
    command = next((c for c, s in SCHEMAS.items() if s is schema), None)
    _check_keys(schema, tree, schema, command)
    try:
        return schema.model_validate(tree)
    except ValidationError as err:
        raise UserError(format_validation_error(err)) from None


def load_config(
    command: str,
    path: str | Path | Section | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    values: dict[str, Any] | None = None,
) -> Section:
    """Resolve defaults < YAML at `path` < dotted `overrides` < `values` into the command's schema.

    `path` is a file, a shipped recipe's name (`recipes.resolve_recipe`) or a config
    object of this command (the Python API's `smollab.pretrain(cfg)`); `overrides` are `key=value`
    strings as on the command line, `values` Python values by dotted key (a mapping value stands
    for its dotted leaves, so `{"optim": {"lr": 1}}` changes optim.lr alone)."""
    schema = SCHEMAS[command]
    if isinstance(path, Section):
        if not isinstance(path, schema):
            raise UserError(
                f"{command}: got a {type(path).__name__}, expected a {schema.__name__} "
                f"(or a recipe name or path)"
            )
        tree = to_dict(path)
    else:
        tree = read_yaml(resolve_recipe(path, command)) if path else {}
    for item in overrides:
        key, value = parse_override(item)
        set_dotted(tree, key, value)
    for key, value in flatten(values or {}).items():
        set_dotted(tree, key, value)
    return validate(schema, tree)


def to_dict(cfg: BaseModel) -> dict[str, Any]:
    return json.loads(cfg.model_dump_json())


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 1}} -> {"optim.lr": 1}: the form sweeps and reports use."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out
