"""What a sweep spec may name of its command: the config keys it may set or sweep (not those the
sweep sets itself) and the metrics the command logs, each refused in one line with a
did-you-mean.

Split from `spec_load`, which validates the rest of the spec: these answers come from the
command's schema and its loop's source, not from the spec.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from smollab.errors import UserError

# The metrics.csv columns each command logs: a fallback; `metric_names` reads the loops' own
# COLUMNS from their source, since importing a loop pulls in torch.
METRIC_COLUMNS: dict[str, list[str]] = {
    "pretrain": [
        "step",
        "tokens",
        "wall_s",
        "train_s",
        "lr",
        "train_loss",
        "val_loss",
        "grad_norm",
        "tokens_per_s",
        "mfu",
        "peak_mem_mb",
    ],
    "grpo": [
        "step",
        "wall_s",
        "lr",
        "loss",
        "reward_mean",
        "reward_std",
        "kl",
        "entropy",
        "completion_len",
        "truncated_frac",
        "clip_frac",
        "grad_norm",
        "unique_fraction",
        "jaccard",
        "eval_reward_mean",
        "eval_unique_fraction",
        "gen_s",
        "reward_s",
        "ref_s",
        "train_s",
        "step_s",
        "peak_mem_mb",
    ],
    "sft": [
        "step",
        "epoch",
        "tokens",
        "wall_s",
        "train_s",
        "lr",
        "train_loss",
        "val_loss",
        "grad_norm",
        "tokens_per_s",
        "mfu",
        "peak_mem_mb",
    ],
    "rft": [
        "step",
        "accuracy",
        "eval_reward_mean",
        "generated",
        "kept",
        "kept_fraction",
        "prompts_with_kept",
        "gen_s",
        "completions_per_s",
        "sft_steps",
        "sft_train_loss",
        "wall_s",
    ],  # one row per round: step is the round
}
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


_LOOPS = {
    "pretrain": "smollab.train.pretrain",
    "grpo": "smollab.train.grpo.run_state",
    "sft": "smollab.train.sft",
    "rft": "smollab.train.rft",
}


def metric_names(command: str) -> list[str] | None:
    """The loop's own COLUMNS, read from its source (importing it would pull in torch);
    the list above when the source cannot be read."""
    import ast
    import importlib.util

    module = _LOOPS.get(command)
    if module is None:
        return METRIC_COLUMNS.get(command)
    try:
        origin = importlib.util.find_spec(module).origin
        tree = ast.parse(Path(origin).read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "COLUMNS" for t in node.targets
            ):
                return list(ast.literal_eval(node.value))
    except (AttributeError, OSError, SyntaxError, ValueError):
        pass
    return METRIC_COLUMNS.get(command)


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
