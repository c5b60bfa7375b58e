"""What a sweep spec may name of its command: the config keys it may set or sweep (not those the
sweep sets itself) and the metrics the command logs, each refused in one line with a
did-you-mean.

Split from `spec_load`, which validates the rest of the spec: these answers come from the
command's schema and the run directory's contract (`rundir.columns`), not from the spec.
"""

from __future__ import annotations

import difflib

from smollab.errors import UserError
from smollab.rundir.columns import BY_COMMAND

# Keys the sweep sets itself for every trial.
RESERVED = {
    "run.dir": "each trial gets its own run dir under <dir>/trials/",
    "run.seed": "list seeds under `seeds:`",
    "run.resume": "trials always resume (run.resume=auto)",
}


def schema_of(command: str):
    from smollab.config.registry import SCHEMAS

    commands = sorted(c for c in SCHEMAS if c != "data")
    if command not in commands:
        close = difflib.get_close_matches(command, commands, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UserError(
            f"sweep key command: unknown command {command!r}{hint}; one of {', '.join(commands)}"
        )
    return SCHEMAS[command]


def config_leaf_keys(command: str) -> list[str]:
    """Every dotted key of the command's config that holds a value (not a section)."""
    from smollab.config import Section

    def walk(schema, prefix=""):
        out = []
        for name, field in schema.model_fields.items():
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, Section):
                out += walk(ann, f"{prefix}{name}.")
            else:
                out.append(prefix + name)
        return out

    return walk(schema_of(command))


def check_config_key(command: str, key: str, where: str) -> None:
    leaves = config_leaf_keys(command)
    if key in RESERVED:
        raise UserError(f"{where}{key}: set by the sweep ({RESERVED[key]})")
    if key not in leaves:
        close = difflib.get_close_matches(key, leaves, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UserError(f"{where}{key}: unknown {command} config key{hint}")


def metric_names(command: str) -> list[str] | None:
    """The columns the command's metrics.csv holds (the run directory's contract)."""
    return BY_COMMAND.get(command)


def check_metric(command: str, name: str, where: str) -> None:
    names = metric_names(command)
    if names is None or name in names or (command == "grpo" and name.startswith("reward/")):
        return
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise UserError(
        f"sweep key {where}: {command} logs no metric {name!r}{hint}; "
        f"one of {', '.join(n for n in names if n != 'step')}"
    )
