"""A sweep's report: `report.md` and the plots (`smollab.report.sweep_plots`), drawn from the sweep
dir alone (`smollab.report.sweep_data`), so it can be redrawn at any time, live or afterwards.

For a learning-rate sweep, report.md holds the LR analysis (`smollab.report.lr_analysis`).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from smollab.report.pbt_lineage import lineage_section
from smollab.report.sweep_data import (
    FAILURES,
    SweepData,
    _f,
    beside_baselines,
    is_lr_sweep,
    load_sweep,
    lr_curves,
)
from smollab.report.sweep_plots import plot_curves, plot_lr_sweep, plot_metric_vs_params
from smollab.rundir.atomic import atomic_write_text
from smollab.rundir.runs import REPORT


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_f(c).replace("|", "/") for c in r) + " |" for r in rows]
    return out


def write_sweep_report(
    sweep_dir: str | Path, plots: bool = True, target_loss: float | None = None
) -> Path:
    data = load_sweep(sweep_dir)
    if target_loss is None:
        target_loss = (data.spec.get("report") or {}).get("target_loss")
    d = data.dir
    label = data.metric_label
    images: list[Path] = []
    analysis = None
    if is_lr_sweep(data):
        from smollab.report.lr_analysis import analyze

        curves = lr_curves(data)
        if curves:
            analysis = analyze(curves, target_loss=target_loss)
            (d / "lr_analysis.json").write_text(json.dumps(analysis.to_dict(), indent=2))
    if plots:
        p = plot_curves(data, d)
        images += [p] if p else []
        images += plot_metric_vs_params(data, d)
        if analysis:
            images += plot_lr_sweep(data, analysis, d)
    else:  # keep linking the plots already drawn
        images = sorted(d.glob("*.png"))

    counts: dict[str, int] = {}
    for t in data.trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    spec = data.spec
    total = len(data.trials)
    lines = [f"# Sweep `{d.name}`", ""]
    lines.append(
        f"_Updated {time.strftime('%Y-%m-%d %H:%M:%S')}; "
        f"{', '.join(f'{n} {s}' for s, n in sorted(counts.items()))} of {total} trials._"
    )
    lines.append("")
    if spec.get("command"):
        lines.append(
            f"- command: `smollab {spec['command']}` on `{spec.get('base') or '(defaults)'}`"
        )
        if spec.get("overrides"):
            lines.append(
                "- overrides: " + ", ".join(f"`{k}={v}`" for k, v in spec["overrides"].items())
            )
        lines.append(
            "- space: " + "; ".join(f"`{k}`: {v}" for k, v in spec.get("space", {}).items())
        )
        lines.append(
            f"- sampler {spec.get('sampler')}, seeds {spec.get('seeds')}, metric `{label}` "
            f"({spec.get('metric', {}).get('goal')}), pruner {spec.get('pruner', {}).get('type')}"
        )
        lines.append(f"- optuna {_optuna_version()}")
    lines.append("")

    done = [
        t
        for t in data.trials
        if t.status == "completed"
        and isinstance(t.row.get(label), int | float)
        and not t.is_baseline
    ]
    if done:
        sign = 1 if data.goal == "min" else -1
        best = sorted(done, key=lambda t: sign * t.row[label])
        b = best[0]
        lines += ["## Best", ""]
        lines.append(
            f"**{label} = {_f(b.row[label])}** with "
            + ", ".join(f"`{k}={_f(v)}`" for k, v in b.params.items())
            + f" (seed {b.seed}, `{b.row.get('run_dir')}`)"
        )
        lines.append("")
        from smollab.report.plots import plot_intervals
        from smollab.report.seed_stats import stats_lines

        seeds = spec.get("seeds") or []
        results: dict[str, Any] = {}
        if len(seeds) > 1:
            stats = _across_seeds(data, spec, measured=False)
            lines += ["### Across seeds", ""]
            lines += stats_lines(stats)
            results.update(stats.to_dict())
            if plots:
                p = plot_intervals(stats, d)
                images += [p] if p and p not in images else []
        measured = _across_seeds(data, spec, measured=True)
        if measured.configs:
            m = spec.get("measure") or {}
            fresh = sorted({t.seed for t in data.trials if t.is_measure and t.seed is not None})
            lines += ["## Measured on fresh seeds", ""]
            lines.append(
                f"The search's best {m.get('top_k', '?')} configuration(s) rerun with seeds "
                f"{fresh}, none of which the search used: the search's own values were picked "
                "for being best, so these are the unbiased comparison."
            )
            lines.append("")
            lines += stats_lines(measured)
            results["measure"] = measured.to_dict()
            if plots:
                p = plot_intervals(measured, d, name="measure_intervals.png")
                images += [p] if p and p not in images else []
        if results:
            results = {"optuna": _optuna_version(), **results}
            atomic_write_text(d / "results.json", json.dumps(results, indent=2))

    if analysis:
        from smollab.report.lr_analysis import DEFINITIONS, summary_lines

        lines += ["## Learning-rate analysis", ""]
        lines += summary_lines(analysis)
        lines.append("")
        lines.append(
            f"_Definitions._ Best LR: {DEFINITIONS['best_lr']}. First diverging LR: "
            f"{DEFINITIONS['first_diverging_lr']}. Ratio: {DEFINITIONS['ratio']}"
        )
        lines.append("")
        rows = [
            [
                r.lr,
                r.seed,
                r.pattern,
                r.final,
                *([("yes" if r.met_target else "no")] if analysis.target_loss is not None else []),
                r.why,
            ]
            for r in analysis.runs
        ]
        head = (
            ["lr", "seed", "pattern", "final loss"]
            + (["target met"] if analysis.target_loss is not None else [])
            + ["why"]
        )
        lines += _table(head, rows)
        lines.append("")
        lines.append(
            "Patterns: _converged_ (within 5% of the best final loss, or meets the target); "
            "_too slow_ (a smaller LR than the best that ends clearly worse or misses the "
            "target); _unstable_ (the loss climbs back more than 10% above its running minimum, or a "
            "larger LR than the best that ends clearly worse); _diverged_ (NaN/inf, or the "
            "run's own divergence rule, or a loss ending above its start)."
        )
        lines.append("")

    lines += ["## Failures by name", ""]
    failed = [t for t in data.trials if t.status in FAILURES]
    if not failed:
        lines.append("None: every trial so far completed.")
    else:
        for status in FAILURES:
            ts = [t for t in failed if t.status == status]
            if ts:
                lines.append(f"- **{status}**: {len(ts)}")
        lines.append("")
        lines += _table(
            ["trial", *data.space, "seed", "status", "step", "evidence"],
            [
                [
                    f"`{t.name}`",
                    *t.params.values(),
                    t.seed,
                    t.status,
                    t.row.get("steps"),
                    t.row.get("reason") or t.summary.get("evidence") or "",
                ]
                for t in failed
            ],
        )
    lines.append("")

    lines += _baseline_section(data)
    lines += lineage_section(data)
    roles = any(t.row.get("role") for t in data.trials)
    lines += ["## All trials", ""]
    starts = [
        t.row["start_s"] for t in data.trials if isinstance(t.row.get("start_s"), int | float)
    ]
    if starts:
        lines.append(
            f"Launch to first logged step (start s): median {statistics.median(starts):.2f} s "
            f"over {len(starts)} trials (min {min(starts):.2f}, max {max(starts):.2f})."
        )
        lines.append("")
    lines += _table(
        [
            "trial",
            *data.space,
            "seed",
            *(["role"] if roles else []),
            "status",
            label,
            "steps",
            "wall s",
            "start s",
        ],
        [
            [
                t.row.get("trial"),
                *t.params.values(),
                t.seed,
                *([t.row.get("role") or ""] if roles else []),
                t.status,
                t.row.get(label),
                t.row.get("steps"),
                t.row.get("wall_s"),
                t.row.get("start_s"),
            ]
            for t in beside_baselines(data.trials)
        ],
    )
    lines.append("")
    if images:
        lines += ["## Plots", ""]
        for p in images:
            lines.append(f"![{p.stem}]({p.name})")
            lines.append("")
    path = d / REPORT
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def _across_seeds(data: SweepData, spec: dict[str, Any], measured: bool):
    """The search's configurations compared across seeds, or (`measured`) the measure step's."""
    from smollab.report.compare import options_from_spec, sweep_groups
    from smollab.report.seed_stats import compare

    opts = options_from_spec(spec)
    return compare(sweep_groups(data, opts, measured), data.goal, data.metric_label, opts)


def _optuna_version() -> str:
    """The Optuna this report was drawn with (the sweep's own is in sweep.json when it wrote it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("optuna")
    except PackageNotFoundError:
        return "not installed"


def _baseline_section(data: SweepData) -> list[str]:
    """`routing_baseline: true`: each matched mode=none baseline beside its routed trials."""
    baselines = [t for t in data.trials if t.is_baseline]
    if not baselines:
        return []
    label = data.metric_label
    by_id = {str(t.row.get("trial")): t for t in data.trials if not t.is_baseline}
    rows = []
    for b in baselines:
        served = [by_id[i] for i in str(b.row.get("baseline_of") or "").split() if i in by_id]
        shown = ", ".join(
            f"{t.row.get('trial')} ({_f(t.row.get(label)) or t.status})" for t in served
        )
        rows.append([f"`{b.name}`", b.seed, b.status, b.row.get(label), shown])
    return [
        "## Routing baselines",
        "",
        "Each routed trial's matched non-routed baseline (the same config with "
        "grpo.routing.mode=none), run once for the routed trials that differ only in routing "
        f"keys; {label} of each routed trial in brackets.",
        "",
        *_table(["baseline", "seed", "status", label, f"routed trials ({label})"], rows),
        "",
    ]
