"""Loading a sweep spec: a YAML file plus `key=value` overrides, validated into `SweepSpec`.

Like the training configs, every mistake stops before any work with one line naming the key:
an unknown key (with a did-you-mean), a bad sampler, an empty space, a distribution under the
grid sampler, a metric the command never logs, or a swept value the command's schema rejects.

`space`, `overrides` and `enqueue` points are keyed by dotted config keys (`optim.lr`); nested
YAML mappings are flattened, except a mapping with `low`/`high`, which is a distribution.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from smollab.config.load import read_yaml
from smollab.config.recipes import resolve_recipe
from smollab.errors import UserError
from smollab.lab.spec_common import coerce, error_line, flatten
from smollab.lab.sweep.command_names import check_config_key, check_metric, schema_of
from smollab.lab.sweep.spec import Distribution, SweepSpec, resolve_config

DIST_KEYS = {"low", "high", "log", "type", "step"}


def _is_dist(value: Any) -> bool:
    return isinstance(value, dict) and bool(set(value) & {"low", "high"})


def _normalize(tree: dict[str, Any]) -> dict[str, Any]:
    tree = copy.deepcopy(tree)
    if isinstance(tree.get("space"), dict):
        tree["space"] = coerce(flatten(tree["space"], stop=_is_dist))
    if isinstance(tree.get("overrides"), dict):
        tree["overrides"] = coerce(flatten(tree["overrides"]))
    if isinstance(tree.get("enqueue"), list):
        tree["enqueue"] = [
            coerce(flatten(p)) if isinstance(p, dict) else p for p in tree["enqueue"]
        ]
    pbt = tree.get("pbt")
    if isinstance(pbt, dict) and isinstance(pbt.get("perturb"), dict):
        tree["pbt"] = {**pbt, "perturb": coerce(flatten(pbt["perturb"]))}
    if isinstance(tree.get("seeds"), int):
        tree["seeds"] = [tree["seeds"]]
    if isinstance(tree.get("metric"), str):
        tree["metric"] = {"name": tree["metric"]}
    if isinstance(tree.get("pruner"), str):
        tree["pruner"] = {"type": tree["pruner"]}
    return tree


def apply_overrides(tree: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """`dir=x concurrency=4 space.optim.lr=[1e-3,1e-2] overrides.train.max_steps=50`."""
    from smollab.config.load import parse_override, set_dotted

    for item in overrides:
        key, value = parse_override(item)
        value = coerce(value)
        head, _, rest = key.partition(".")
        if head in ("space", "overrides") and rest:
            section = tree.setdefault(head, {})
            if not isinstance(section, dict):
                raise UserError(f"override {key}: {head} is not a mapping")
            section[rest] = value
        else:
            set_dotted(tree, key, value)
    return tree


def _spec_keys(schema: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in schema.model_fields.items():
        keys.append(prefix + name)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):  # a section (metric, pruner)
            keys += _spec_keys(ann, f"{prefix}{name}.")
    return keys


def _check_spec_keys(tree: dict[str, Any]) -> None:
    known = _spec_keys(SweepSpec)
    for key, value in tree.items():
        if key not in SweepSpec.model_fields:
            _unknown("sweep key", key, known)
        ann = SweepSpec.model_fields[key].annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel) and isinstance(value, dict):
            for sub in value:
                if sub not in ann.model_fields:
                    _unknown("sweep key", f"{key}.{sub}", known)


def _unknown(what: str, key: str, candidates: list[str]) -> None:
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise UserError(f"unknown {what} {key}{hint}")


def _format(err: ValidationError) -> str:
    return error_line(err, "sweep")


def _check_types(tree: dict[str, Any]) -> None:
    """The mistakes pydantic would report badly, or that would crash the checks before it."""
    for key, example in (("overrides", "train.max_steps: 50"), ("space", "optim.lr: [1e-3, 1e-2]")):
        value = tree.get(key)
        if value is not None and not isinstance(value, dict):
            raise UserError(
                f"sweep key {key}: expected a mapping of config keys ({example}), "
                f"got {type(value).__name__} {value!r}"[:300]
            )
    for i, point in enumerate(tree["enqueue"] if isinstance(tree.get("enqueue"), list) else []):
        if not isinstance(point, dict):
            raise UserError(
                f"sweep key enqueue.{i}: expected a mapping of space keys to values, got {point!r}"
            )
    conc = tree.get("concurrency", 1)
    if conc != "auto" and (isinstance(conc, bool) or not isinstance(conc, int) or conc < 1):
        raise UserError(
            f"sweep key concurrency: at least 1 (trials at once, a whole number) "
            f"or auto, got {conc!r}"
        )
    for key, what in (
        ("lanes", "trials at once, as lanes of one worker"),
        ("lane_workers", "lanes worker processes"),
    ):
        v = tree.get(key)
        if v not in (None, "auto") and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise UserError(
                f"sweep key {key}: at least 1 ({what}, a whole number) or auto, got {v!r}"
            )
    metric = tree.get("metric")
    if isinstance(metric, dict) and isinstance(metric.get("at_step"), bool):
        raise UserError(
            f"sweep key metric.at_step: expected a step number, got {metric['at_step']}"
        )
    if isinstance(tree.get("storage"), str):
        check_storage(tree["storage"])
    d = tree.get("dir")
    if isinstance(d, str) and Path(d).exists() and not Path(d).is_dir():
        raise UserError(f"sweep key dir: {d} exists and is not a directory")


def check_storage(url: str) -> None:
    """An RDB URL that Optuna (SQLAlchemy) can open, checked before anything is created."""
    from sqlalchemy.engine.url import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    from smollab.lab.sweep.study import driver_url

    try:
        parsed = make_url(driver_url(url))
    except ArgumentError:
        raise UserError(
            f"sweep key storage: {url!r} is not a database URL "
            f"(e.g. sqlite:///sweeps.db or postgresql://user@host/db)"
        ) from None
    try:
        dialect = parsed.get_dialect()
    except NoSuchModuleError:
        raise UserError(
            f"sweep key storage: unknown database scheme {parsed.drivername!r} in "
            f"{url!r}; use sqlite, postgresql or mysql (or leave storage out for a "
            f"journal file in the sweep dir)"
        ) from None
    try:
        dialect.import_dbapi()
    except ImportError as e:
        fixes = {
            "postgresql": "pip install 'smollab[postgres]' (psycopg2, for postgresql:// URLs)",
            "mysql": "pip install pymysql and use mysql+pymysql://",
        }
        fix = fixes.get(parsed.get_backend_name(), "install it")
        raise UserError(
            f"sweep key storage: the {parsed.drivername} driver is not installed ({e}); {fix}"
        ) from None
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if not db or db == ":memory:":
            raise UserError(
                f"sweep key storage: {url!r} is an in-memory database, which keeps "
                f"nothing; give a file, e.g. sqlite:///sweeps.db"
            )
        if not db.startswith("file:") and not Path(db).parent.is_dir():
            raise UserError(f"sweep key storage: directory not found for {db} ({url})")


def load_spec(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> SweepSpec:
    tree = _normalize(read_yaml(resolve_recipe(path, "sweep"), "sweep spec")) if path else {}
    tree = _normalize(apply_overrides(tree, overrides))
    spec = validate_spec(tree)
    if spec.dir is None:
        stem = Path(path).stem if path else "sweep"
        spec.dir = str(Path("sweeps") / stem)
    return spec


def validate_spec(tree: dict[str, Any]) -> SweepSpec:
    _check_spec_keys(tree)
    _check_types(tree)
    command = tree.get("command")
    if command is None:
        raise UserError("sweep key command: missing (pretrain, grpo, ...)")
    schema_of(str(command))  # raises on an unknown command
    space = tree.get("space")
    if not space:
        raise UserError(
            "sweep key space: empty; give at least one key, e.g. optim.lr: [1e-3, 1e-2]"
        )
    if not isinstance(space, dict):
        raise UserError(
            f"sweep key space: expected a mapping of config keys, got {type(space).__name__}"
        )
    sampler = tree.get("sampler", "grid")
    for key, value in space.items():
        check_config_key(command, key, "sweep key space.")
        if isinstance(value, dict):
            if sampler == "grid":
                raise UserError(
                    f"sweep key space.{key}: sampler grid needs a list of values, "
                    f"got a distribution (use sampler: random, qmc or tpe)"
                )
            for sub in value:
                if sub not in DIST_KEYS:
                    _unknown(
                        "sweep key", f"space.{key}.{sub}", [f"space.{key}.{d}" for d in DIST_KEYS]
                    )
            try:
                Distribution.model_validate(value)
            except ValidationError as err:
                e = err.errors()[0]
                sub = ".".join(str(p) for p in e["loc"])
                raise UserError(
                    f"sweep key space.{key}{'.' + sub if sub else ''}: "
                    f"{e['msg'].removeprefix('Value error, ')}"
                ) from None
        elif isinstance(value, list):
            if not value:
                raise UserError(f"sweep key space.{key}: empty list of values")
            if len({repr(v) for v in value}) != len(value):
                raise UserError(f"sweep key space.{key}: repeated values {value}")
            for v in value:
                if not (v is None or isinstance(v, str | int | float | bool)):
                    raise UserError(f"sweep key space.{key}: values must be scalars, got {v!r}")
        else:
            raise UserError(
                f"sweep key space.{key}: expected a list of values or "
                f"{{low, high, log}}, got {value!r}"
            )
    for key in tree.get("overrides") or {}:
        check_config_key(command, key, "sweep key overrides.")
        if key in space:
            raise UserError(f"sweep key overrides.{key}: also swept in space; keep one")
    try:
        spec = SweepSpec.model_validate(tree)
    except ValidationError as err:
        raise UserError(_format(err)) from None

    if spec.sampler == "pbt" and spec.executor == "ray":  # before the executor's own checks
        raise UserError(
            "sweep key executor: sampler pbt runs with executor local or lanes, not ray (a "
            "member continues in a fork of its parent's run directory, hard-linked on the "
            "sweep's disk, which Ray's nodes need not share)"
        )
    _check_executor(spec)
    check_metric(spec.command, spec.metric.name, "metric.name")
    if spec.pruner.metric:
        check_metric(spec.command, spec.pruner.metric, "pruner.metric")
    if spec.pruner.type == "wilcoxon":
        _check_wilcoxon(spec)
    if len(set(spec.seeds)) != len(spec.seeds):
        raise UserError(f"sweep key seeds: repeated seeds {spec.seeds}")
    for key in ("tpe", "qmc"):
        if getattr(spec, key) is not None and spec.sampler != key:
            raise UserError(
                f"sweep key {key}: set only with sampler: {key} (the sampler is {spec.sampler})"
            )
    if spec.sampler == "grid":
        if spec.n_trials is not None:
            raise UserError(
                f"sweep key n_trials: the grid sampler runs every point "
                f"({len(spec.grid_points())} here); n_trials is for random, qmc and tpe"
            )
        if spec.enqueue:
            raise UserError(
                "sweep key enqueue: the grid sampler runs every point already; "
                "enqueue is for random, qmc and tpe"
            )
    elif spec.n_trials is None and spec.sampler != "pbt":
        raise UserError(
            f"sweep key n_trials: sampler {spec.sampler} needs n_trials "
            f"(configurations to run, each once per seed)"
        )
    for i, point in enumerate(spec.enqueue):
        for key, value in point.items():
            if key not in spec.space:
                raise UserError(
                    f"sweep key enqueue.{i}.{key}: not a key of space ({', '.join(spec.space)})"
                )
            dist = spec.space[key]
            if (
                isinstance(dist, Distribution)
                and isinstance(value, int | float)
                and not dist.low <= value <= dist.high
            ):
                raise UserError(
                    f"sweep key enqueue.{i}.{key}: {value} outside [{dist.low:g}, {dist.high:g}]"
                )
            if isinstance(dist, list) and value not in dist:
                raise UserError(f"sweep key enqueue.{i}.{key}: {value!r} is not one of {dist}")
    if spec.base and not resolve_recipe(spec.base, spec.command).is_file():
        raise UserError(f"sweep key base: file not found: {spec.base}")
    if spec.routing_baseline:
        _check_routing_baseline(spec)
    if spec.sampler == "pbt" or spec.pbt is not None:
        _check_pbt(spec)
    else:
        _check_points(spec)
    if spec.executor == "lanes":
        from smollab.lab.sweep.lanes_executor import check_lanes

        check_lanes(spec)
    return spec


def _check_executor(spec: SweepSpec) -> None:
    """`ray:` only under `executor: ray`, which needs the package (found, not imported)."""
    import importlib.util

    from smollab.lab.start import check

    check(spec.start, "sweep key start", spec.warm_refused())
    for key in ("lanes", "lane_workers"):
        if spec.executor != "lanes" and getattr(spec, key) is not None:
            raise UserError(
                f"sweep key {key}: set only with executor: lanes (the executor is {spec.executor})"
            )
    if spec.executor != "ray":
        if spec.ray is not None:
            raise UserError(
                f"sweep key ray: set only with executor: ray (the executor is {spec.executor})"
            )
        if spec.executor == "lanes":
            from smollab.lab.sweep.lanes_executor import check_spec

            check_spec(spec)
        return
    if importlib.util.find_spec("ray") is None:
        raise UserError("sweep key executor: ray needs the ray package: pip install 'smollab[ray]'")
    if spec.mps:
        raise UserError("sweep key mps: not with executor: ray (start MPS on each node yourself)")
    if spec.threads is not None:
        raise UserError(
            "sweep key threads: not with executor: ray (a trial's threads are its "
            "ray.cpu, rounded up)"
        )


def _check_wilcoxon(spec: SweepSpec) -> None:
    """The Wilcoxon pruner pairs each held-out prompt's reward with the best trial's: only GRPO
    trials write them (eval_prompts.jsonl), at the same evaluations and prompts in every trial,
    and a better trial is one with a higher objective, as a higher reward is better."""
    if spec.command != "grpo":
        raise UserError(
            f"sweep key pruner.type: wilcoxon needs each held-out prompt's reward, which only "
            f"grpo trials write; a {spec.command} trial logs a curve (use median, asha or "
            f"threshold, with patience or smooth)"
        )
    for key in ("train.eval_interval", "grpo.eval_prompts"):
        if key in spec.space:
            raise UserError(
                f"sweep key space.{key}: not with pruner wilcoxon, which pairs the same "
                f"evaluations and prompts across trials"
            )
    if resolve_config(spec, {}, spec.seeds[0]).train.eval_interval == 0:
        raise UserError(
            "sweep key pruner.type: wilcoxon needs held-out evaluations "
            "(train.eval_interval > 0), whose per-prompt rewards it pairs"
        )
    if spec.metric.goal != "max":
        raise UserError(
            f"sweep key pruner.type: wilcoxon ranks prompt rewards (higher is better) against "
            f"the best trial; the objective {spec.metric.name} has goal min"
        )


def _check_points(spec: SweepSpec) -> None:
    """Every trial's config must validate: check the grid, or each distribution's ends."""
    if spec.sampler == "grid":
        points = spec.grid_points()
    else:
        points = []
        for key, dist in spec.space.items():
            ends = [dist.low, dist.high] if isinstance(dist, Distribution) else dist
            if isinstance(dist, Distribution) and dist.type == "int":
                ends = [int(e) for e in ends]
            points += [{key: v} for v in ends]
        points += list(spec.enqueue) or [{}]
    for point in points:
        try:
            resolve_config(spec, point, spec.seeds[0])
        except UserError as e:
            shown = ", ".join(f"{k}={v}" for k, v in point.items())
            raise UserError(f"sweep trial {{{shown}}}: {e}") from None


def _check_pbt(spec: SweepSpec) -> None:
    """`sampler: pbt` and its section go together; what a member cannot honour is refused: keys
    pbt sets itself, AdamW settings a checkpoint restores, keys that are not numbers, and the
    executors, pruners and samplers' keys it has no use for."""
    from smollab.lab.sweep.pbt import (
        OPTIMIZER_STATE_KEYS,
        SHAPE_KEYS,
        base_value,
        fixed_overrides,
        initial_points,
    )
    from smollab.lab.sweep.study import prunes

    if spec.sampler != "pbt":
        raise UserError(
            f"sweep key pbt: set only with sampler: pbt (the sampler is {spec.sampler})"
        )
    if spec.pbt is None:
        raise UserError(
            "sweep key pbt: sampler pbt needs it (population, interval, budget, perturb)"
        )
    refusals = {
        "command": spec.command not in ("pretrain", "grpo")
        and f"sampler pbt trains pretrain and grpo members, not {spec.command}",
        "n_trials": spec.n_trials is not None
        and "sampler pbt runs pbt.population members; n_trials is for random, qmc and tpe",
        "enqueue": bool(spec.enqueue)
        and "sampler pbt starts from the space; enqueue is for random, qmc and tpe",
        "pruner": prunes(spec.pruner)
        and "sampler pbt replaces its bottom members itself; use pruner: none",
        "measure": spec.measure is not None
        and "sampler pbt's members are lineages of values, not configurations to rerun from "
        "scratch; measure is for grid, random, qmc and tpe",
        "seeds": len(spec.seeds) > 1
        and f"sampler pbt runs one seed (its members are the replicates), got {spec.seeds}",
        "routing_baseline": spec.routing_baseline and "not with sampler pbt",
    }
    for key, why in refusals.items():
        if why:
            raise UserError(f"sweep key {key}: {why}")
    for key in fixed_overrides(spec):
        for section in ("space", "overrides"):
            if key in getattr(spec, section):
                raise UserError(
                    f"sweep key {section}.{key}: sampler pbt sets it (pbt.budget, pbt.interval)"
                )
    for key in spec.pbt.perturb:
        check_config_key(spec.command, key, "sweep key pbt.perturb.")
        if key in OPTIMIZER_STATE_KEYS:
            raise UserError(
                f"sweep key pbt.perturb.{key}: the checkpoint's AdamW state restores it, so a "
                "perturbed value would not apply"
            )
        if key in SHAPE_KEYS:
            raise UserError(
                f"sweep key pbt.perturb.{key}: it shapes the checkpoint's weights, so a member "
                "could not continue from its parent's with another value"
            )
    points = initial_points(spec)
    for point in points:
        try:
            config = resolve_config(spec, {**point, **fixed_overrides(spec)}, spec.seeds[0])
        except UserError as e:
            shown = ", ".join(f"{k}={v}" for k, v in point.items())
            raise UserError(f"sweep trial {{{shown}}}: {e}") from None
        dump = config.model_dump()
        for key in spec.pbt.perturb:
            value = base_value(dump, key)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise UserError(
                    f"sweep key pbt.perturb.{key}: not a number ({value!r}); pbt multiplies "
                    "numeric keys only"
                )
        if dump.get("train", {}).get("max_tokens") is not None:
            raise UserError(
                "sweep key overrides.train.max_tokens: sampler pbt budgets in steps (pbt.budget)"
            )


def _check_routing_baseline(spec: SweepSpec) -> None:
    """`routing_baseline: true` must have routed trials to match (a grid's are known now)."""
    if spec.command != "grpo":
        raise UserError(
            f"sweep key routing_baseline: routing is a grpo feature, not {spec.command}"
        )
    if spec.sampler != "grid":
        return
    from smollab.lab.sweep.baseline import Baselines

    found = Baselines(spec)
    if not any(found.is_routed(p) for p in spec.grid_points()):
        raise UserError(
            "sweep key routing_baseline: no trial is routed (none has "
            "grpo.routing.enabled true and grpo.routing.mode other than none)"
        )
