"""The measure step (`measure: {top_k, seeds}`, `smollab sweep SPEC --measure N`): once the
search ends, its best `top_k` configurations run again with `seeds` fresh seeds, ones the search
did not use, and the report compares them across those seeds.

Why fresh seeds: the search's best configuration was picked for its values on the search's seeds,
so those values are biased upward by the picking; runs on seeds the choice never saw are not.

A measured run is not an Optuna trial (the search is over, and the sampler must not learn from a
point it has seen): like a routing baseline its run directory, `trials/m<hash>-<params>-s<seed>`,
is its identity and its summary.json its state, so a rerun of the sweep finds the finished runs
and continues the open ones. The configurations are ranked by their mean objective over the
search's seeds; on a rerun the same finished search gives the same ones.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from smollab.errors import UserError
from smollab.lab.sweep.baseline import Baseline, BaselineTrial, side_row
from smollab.lab.sweep.spec import SweepSpec

ROLE = "measure"


def fresh_seeds(spec: SweepSpec) -> list[int]:
    """`measure.seeds` seeds after the search's largest: none of them ran in the search."""
    assert spec.measure is not None
    start = max(spec.seeds) + 1
    return list(range(start, start + spec.measure.seeds))


def best_configs(spec: SweepSpec, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The search's `measure.top_k` best configurations (their space keys), by the mean of their
    completed trials' objective over seeds."""
    assert spec.measure is not None
    label, sign = spec.metric.label, (1 if spec.metric.goal == "min" else -1)
    groups: dict[str, tuple[dict[str, Any], list[float]]] = {}
    for r in rows:
        v = r.get(label)
        if r.get("status") != "completed" or not isinstance(v, int | float) or not math.isfinite(v):
            continue
        params = {k: r[k] for k in spec.space}
        key = json.dumps(params, sort_keys=True, default=str)
        groups.setdefault(key, (params, []))[1].append(float(v))
    ranked = sorted(groups.values(), key=lambda g: sign * sum(g[1]) / len(g[1]))
    return [params for params, _ in ranked[: spec.measure.top_k]]


class Measure:
    """The measured runs of a sweep, found from its finished search (nothing is stored)."""

    def __init__(self, spec: SweepSpec):
        self.spec = spec
        self.by_name: dict[str, Baseline] = {}

    def plan(self, search_rows: list[dict[str, Any]]) -> list[Baseline]:
        """Every measured run, best configuration first, each once per fresh seed."""
        from smollab.lab.sweep.trials import trial_name

        configs = best_configs(self.spec, search_rows)
        if not configs:
            raise UserError(
                "sweep key measure: no search trial completed with a finite "
                f"{self.spec.metric.label}, so there is no configuration to measure"
            )
        out = []
        for params in configs:
            for seed in fresh_seeds(self.spec):
                ident = json.dumps([params, seed], sort_keys=True, default=str)
                digest = hashlib.sha1(ident.encode()).hexdigest()[:6]
                name = "m" + digest + trial_name(0, params, seed)[3:]
                out.append(self.by_name.setdefault(name, Baseline(name, params, {}, seed)))
        return out

    def rows(
        self, trials_dir: Path, runs: dict[str, BaselineTrial], live: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """A results.csv row per measured run with a run dir, `role` measure."""
        return [
            side_row(self.spec, trials_dir, b, runs, live, ROLE)
            for _, b in sorted(self.by_name.items())
            if (trials_dir / b.name).exists()
        ]
