"""Configurations compared across seeds (`smollab.report.seed_stats`), gathered from a sweep dir
(its trials grouped by parameters) or from runs picked by hand (grouped by their resolved config
less the seed and where they write), then written as report.md, results.json and a plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smollab.config.load import flatten
from smollab.errors import UserError
from smollab.report.seed_stats import SeedStats, StatsOptions, compare, reduce_curve, stats_lines
from smollab.report.sweep_data import SweepData, _f, _short, load_sweep
from smollab.rundir.atomic import atomic_write_text
from smollab.rundir.runs import REPORT, SWEEP_RESULTS, RunView

RESULTS = "results.json"
# The run section says where a run writes, its name, seed, trackers and plots: runs that
# differ only there are seeds of one configuration.
_NOT_CONFIG = "run."


def options_from_spec(spec: dict[str, Any]) -> StatsOptions:
    r = spec.get("report") or {}
    keys = StatsOptions.__dataclass_fields__
    return StatsOptions(**{k: r[k] for k in keys if r.get(k) is not None})


def config_name(params: dict[str, Any]) -> str:
    return ", ".join(f"{_short(k)}={_f(v)}" for k, v in params.items()) or "(base)"


def sweep_groups(
    data: SweepData, opts: StatsOptions, measured: bool = False
) -> dict[str, tuple[dict, list[float]]]:
    """Completed trials (not baselines) grouped by their parameters: the search's, or with
    `measured` the measure step's runs. `last` is the results.csv value (the sweep's own
    objective); `best` and `mean_last_k` read each trial's logged curve."""
    name = data.spec.get("metric", {}).get("name", data.metric_label)
    groups: dict[str, tuple[dict, list[float]]] = {}
    for t in data.trials:
        if t.status != "completed" or t.is_baseline or t.is_measure != measured:
            continue
        if opts.reduce == "last":
            v = t.row.get(data.metric_label)
            v = v if isinstance(v, int | float) else None
        else:
            v = reduce_curve([r.get(name) for r in t.metrics], data.goal, opts.reduce, opts.last_k)
        if v is not None:
            groups.setdefault(config_name(t.params), (t.params, []))[1].append(float(v))
    return groups


def run_groups(
    runs: list[Path], metric: str, goal: str, opts: StatsOptions
) -> dict[str, tuple[dict, list[float]]]:
    """Runs grouped by their config less seed and paths; each group named by the keys in which
    the groups differ."""
    configs = []
    for r in runs:
        view = RunView(r)
        if not view.is_run():
            raise UserError(f"{r}: not a run directory (no config.json / metrics.csv)")
        flat = flatten(view.config())
        configs.append({k: v for k, v in flat.items() if not k.startswith(_NOT_CONFIG)})
    differing = sorted(
        {k for c in configs for k in c if any(o.get(k) != c.get(k) for o in configs)}
    )
    groups: dict[str, tuple[dict, list[float]]] = {}
    for r, c in zip(runs, configs, strict=True):
        vals = [row.get(metric) for row in RunView(r).metrics()]
        if all(v is None for v in vals):
            raise UserError(f"{r}: its metrics.csv has no {metric} values")
        v = reduce_curve(vals, goal, opts.reduce, opts.last_k)
        params = {k: c.get(k) for k in differing}
        groups.setdefault(config_name(params), (params, []))[1].append(float(v))
    return groups


def write_comparison(s: SeedStats, out_dir: Path, extra: dict[str, Any] | None = None) -> Path:
    """report.md (the section alone), results.json and the interval plot in `out_dir`."""
    from smollab.report.plots import plot_intervals

    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / RESULTS, json.dumps({**(extra or {}), **s.to_dict()}, indent=2))
    img = plot_intervals(s, out_dir)
    lines = [f"# Comparison across seeds: {s.metric} ({s.goal})", "", *stats_lines(s)]
    if img:
        lines += [f"![{img.stem}]({img.name})", ""]
    atomic_write_text(out_dir / REPORT, "\n".join(lines) + "\n")
    return out_dir / REPORT


def compare_paths(
    paths: list[str | Path],
    out: str | Path,
    metric: str | None,
    goal: str | None,
    opts: StatsOptions,
) -> Path:
    """`smollab compare`: one sweep dir (its configurations), or run dirs picked by hand."""
    ps = [Path(p) for p in paths]
    sweeps = [p for p in ps if (p / SWEEP_RESULTS).exists()]
    if sweeps and len(ps) > 1:
        raise UserError("compare takes one sweep directory, or run directories: not both")
    if sweeps:
        data = load_sweep(sweeps[0])
        if metric is not None or goal is not None:
            raise UserError("a sweep's metric and goal are its spec's: drop --metric/--goal")
        s = compare(sweep_groups(data, opts), data.goal, data.metric_label, opts)
    else:
        if metric is None:
            raise UserError("comparing runs needs --metric (a metrics.csv column, e.g. reward)")
        s = compare(run_groups(ps, metric, goal or "min", opts), goal or "min", metric, opts)
    if not s.configs:
        raise UserError(f"nothing to compare: no completed values of {s.metric} in {paths}")
    return write_comparison(s, Path(out), {"sources": [str(p) for p in ps]})
