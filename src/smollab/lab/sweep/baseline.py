"""`routing_baseline: true`: the matched non-routed baseline of every routed GRPO trial (gradient routing).

A trial is routed when its config has `grpo.routing.enabled` true and `grpo.routing.mode` other
than none. Its baseline is the same config with `mode: none` (the same two adapters, no masks),
so it differs from the routed trial only in the routing itself. Routed trials that differ only in
routing-only keys (`ROUTING_ONLY`: what the masks do, which a none run never reads; not
`ablated_frac`, which a none run reads) share one baseline, run once per seed: a routing_frac x
mode grid of 6 routed trials needs 1 baseline.

A baseline is not a point of the study's space, so it is not an Optuna trial: samplers and
pruners never see it. Its run directory, `trials/b<hash>-<params>-s<seed>`, is its identity (the
hash is of what defines it), and its state is its run's own summary.json, so a rerun of the sweep
finds finished baselines and continues open ones, as it does trials.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smollab.lab.sweep.spec import SweepSpec, base_tree

ROUTING = "grpo.routing."
# What routes the gradients: meaningless under mode none, so reset there and not part of the key.
# ablated_frac is not one: a none run trains its ablated steps with the forget adapter off too,
# so the baseline keeps the routed trial's value; nor are eligibility and reward_cap, which
# change the rewards a none run trains on.
ROUTING_ONLY = tuple(
    ROUTING + k
    for k in ("mode", "routing_frac", "label_noise_frac", "retain_advantage", "gate_flags")
)
_MISSING = object()


def _get(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def schema_default(command: str, dotted: str) -> Any:
    """The default of a config key in the command's schema; _MISSING when there is no such key
    (or it has no default)."""
    from pydantic import BaseModel

    from smollab.config.registry import SCHEMAS

    schema: Any = SCHEMAS.get(command)
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        fields = getattr(schema, "model_fields", {})
        if part not in fields:
            return _MISSING
        f = fields[part]
        if i == len(parts) - 1:
            return _MISSING if f.is_required() else f.get_default(call_default_factory=True)
        schema = f.annotation
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            return _MISSING
    return _MISSING


@dataclass
class Baseline:
    """One baseline run: the trial params it is launched with, then `extra` (mode none and the
    routing-only keys at their defaults), and the routed trials it serves (run dir names)."""

    name: str
    params: dict[str, Any]
    extra: dict[str, Any]
    seed: int
    of: list[str] = field(default_factory=list)


class Baselines:
    """The baselines of a sweep's routed trials, found from their points (nothing is stored)."""

    def __init__(self, spec: SweepSpec):
        self.spec = spec
        self.enabled = spec.routing_baseline
        self.by_name: dict[str, Baseline] = {}
        self._base = base_tree(spec) if self.enabled else {}

    def _value(self, tree: dict[str, Any], key: str, fallback: Any) -> Any:
        v = _get(tree, key)
        if v is _MISSING:
            v = schema_default(self.spec.command, key)
        return fallback if v is _MISSING else v

    def is_routed(self, params: dict[str, Any]) -> bool:
        from smollab.config.load import set_dotted

        tree = copy.deepcopy(self._base)
        for k, v in params.items():
            set_dotted(tree, k, v)
        enabled = self._value(tree, ROUTING + "enabled", False)
        return bool(enabled) and self._value(tree, ROUTING + "mode", "classic") != "none"

    def extra(self) -> dict[str, Any]:
        """Overrides after the trial's own: mode none, and each routing-only key the schema knows
        back at its default (a none run must not carry, say, a routed trial's routing_frac)."""
        out: dict[str, Any] = {ROUTING + "mode": "none"}
        for key in ROUTING_ONLY[1:]:
            default = schema_default(self.spec.command, key)
            if default is not _MISSING:
                out[key] = default
        return out

    def add(self, routed: str, params: dict[str, Any], seed: int) -> Baseline | None:
        """The baseline of the routed trial `routed` (run dir name) at `params`, `seed`; None
        when baselines are off or the trial is not routed."""
        if not self.enabled or not self.is_routed(params):
            return None
        from smollab.lab.sweep.trials import trial_name

        kept = {k: v for k, v in params.items() if k not in ROUTING_ONLY}
        extra = self.extra()
        ident = json.dumps([kept, extra, seed], sort_keys=True, default=str)
        digest = hashlib.sha1(ident.encode()).hexdigest()[:6]
        name = "b" + digest + trial_name(0, kept, seed)[3:]
        b = self.by_name.setdefault(name, Baseline(name, kept, extra, seed))
        if routed not in b.of:
            b.of.append(routed)
        return b

    def rows(
        self, trials_dir: Path, runs: dict[str, BaselineTrial], live: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """A results.csv row per baseline with a run dir: `role` baseline, `baseline_of` the
        trial ids of its routed trials."""
        return [
            {
                **side_row(self.spec, trials_dir, b, runs, live, "baseline"),
                "baseline_of": " ".join(r[:3] for r in b.of),
            }
            for _, b in sorted(self.by_name.items())
            if (trials_dir / b.name).exists()
        ]


def side_row(
    spec: SweepSpec,
    trials_dir: Path,
    b: Baseline,
    runs: dict[str, BaselineTrial],
    live: Mapping[str, Any],
    role: str,
) -> dict[str, Any]:
    """The results.csv row of a run that is not an Optuna trial (a baseline, a measured run).
    Its status is the record of this sweep process (`runs`; `live` the running ones' progress),
    else its run's own summary."""
    from smollab.lab.sweep.trials import TRIALS, metric_value, read_summary
    from smollab.rundir.runs import FINISHED, RunView

    name, run_dir = b.name, trials_dir / b.name
    attrs = runs[name].user_attrs if name in runs else {}
    summary = read_summary(run_dir)
    now = live.get(name)
    status = "running" if now is not None else attrs.get("status") or summary.get("status")
    if now is None and status not in FINISHED and status != "failed":
        status = "interrupted" if status else None
    value = attrs.get("metric")
    if value is None and status == "completed":
        value = metric_value(RunView(run_dir).metrics(), spec)
    steps = now.steps if now is not None else attrs.get("steps", summary.get("steps"))
    wall = now.wall_s if now is not None else attrs.get("wall_s")
    params = {k: b.params.get(k, b.extra.get(k)) for k in spec.space}
    reason = attrs.get("reason") or summary.get("evidence")
    return {
        "trial": name.split("-")[0],
        **params,
        "seed": b.seed,
        "status": status or "queued",
        spec.metric.label: value,
        "steps": steps,
        "wall_s": None if wall is None else round(wall, 1),
        "reason": reason if status not in ("running", "completed") else None,
        "run_dir": f"{TRIALS}/{name}",
        "role": role,
    }


class BaselineTrial:
    """Stands in for an Optuna trial while a baseline (or a measured run) runs: the scheduler reports to it and asks
    it to prune like any trial; it keeps the attributes and reports to, and prunes, nothing."""

    def __init__(self, baseline: Baseline):
        self.baseline = baseline
        self.user_attrs: dict[str, Any] = {}

    def set_user_attr(self, key: str, value: Any) -> None:
        self.user_attrs[key] = value

    def report(self, value: float, step: int) -> None:
        return None

    def should_prune(self) -> bool:
        return False
