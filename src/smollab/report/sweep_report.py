"""A sweep's report: `report.md` and plots, drawn from the sweep dir alone (sweep.json,
results.csv and each trial's run dir), so it can be redrawn at any time, live or afterwards.

Plots: `curves.png` (every trial's curve), `metric_vs_<param>.png` (the metric against each swept
parameter, seed mean and spread), and for a learning-rate sweep `lr_sweep_comparison.png` and
`lr_vs_final_loss.png` with the LR analysis (`smollab.lab.lr_analysis`) in report.md.
"""

from __future__ import annotations

import csv
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smollab.errors import UserError
from smollab.runs import atomic_write_text, read_json, read_metrics

FAILURES = ("diverged", "degenerate", "stuck", "pruned", "failed", "interrupted")


@dataclass
class Trial:
    row: dict[str, Any]
    params: dict[str, Any]
    run_dir: Path
    metrics: list[dict[str, float | None]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return self.row.get("status") or "?"

    @property
    def name(self) -> str:
        return self.run_dir.name

    @property
    def seed(self) -> int | None:
        s = self.row.get("seed")
        return int(float(s)) if s not in (None, "") else None


@dataclass
class SweepData:
    dir: Path
    spec: dict[str, Any]
    metric_label: str
    trials: list[Trial]

    @property
    def space(self) -> list[str]:
        return list(self.spec.get("space", {}))

    @property
    def goal(self) -> str:
        return self.spec.get("metric", {}).get("goal", "min")

    @property
    def command(self) -> str:
        return self.spec.get("command", "?")


def _num(v: str | None) -> Any:
    if v is None or v == "":
        return None
    try:
        f = float(v)
    except ValueError:
        return {"True": True, "False": False, "true": True, "false": False}.get(v, v)
    return int(f) if f.is_integer() and "." not in v and "e" not in v.lower() else f


def load_sweep(sweep_dir: str | Path) -> SweepData:
    d = Path(sweep_dir)
    meta = read_json(d / "sweep.json") if (d / "sweep.json").exists() else {}
    spec = meta.get("spec", {})
    if not (d / "results.csv").exists():
        raise UserError(f"{d} has no results.csv: not a sweep directory (yet)")
    from smollab.lab.spec import Metric

    label = Metric(**spec["metric"]).label if spec.get("metric") else "metric"
    space = list(spec.get("space", {}))
    trials = []
    with open(d / "results.csv", newline="") as f:
        for r in csv.DictReader(f):
            row = {
                k: _num(v) if k not in ("trial", "status", "reason", "run_dir") else v
                for k, v in r.items()
            }
            if not space:  # no sweep.json: columns between trial and seed are parameters
                keys = list(r)
                space = keys[1 : keys.index("seed")] if "seed" in keys else []
            params = {k: row.get(k) for k in space}
            run_dir = d / (r.get("run_dir") or "")
            t = Trial(row=row, params=params, run_dir=run_dir)
            t.metrics = read_metrics(run_dir / "metrics.csv")
            try:
                t.summary = (
                    read_json(run_dir / "summary.json")
                    if (run_dir / "summary.json").exists()
                    else {}
                )
            except UserError:
                t.summary = {}
            trials.append(t)
    if not spec:
        spec = {"space": {k: None for k in space}}
    return SweepData(dir=d, spec=spec, metric_label=label, trials=trials)


# ---- markdown helpers -------------------------------------------------------------------------


def _f(v: Any) -> str:
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(_f(c).replace("|", "/") for c in r) + " |" for r in rows]
    return out


def _short(key: str) -> str:
    return key.split(".")[-1]


def _is_log(values: list[Any], key: str, spec: dict[str, Any]) -> bool:
    dist = spec.get("space", {}).get(key)
    if isinstance(dist, dict):
        return bool(dist.get("log"))
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if not nums or min(nums) <= 0:
        return False
    return key.endswith("lr") or max(nums) / min(nums) >= 20


# ---- the LR analysis over a sweep ------------------------------------------------------------


def is_lr_sweep(data: SweepData) -> bool:
    label = data.spec.get("metric", {}).get("name", "")
    return "optim.lr" in data.space and "loss" in label and data.goal == "min"


def lr_curves(data: SweepData):
    from smollab.lab.lr_analysis import RunCurve

    loss_key = "train_loss" if data.command == "pretrain" else "loss"
    name = data.spec.get("metric", {}).get("name", "val_loss")
    curves = []
    for t in data.trials:
        if (
            t.status in ("running", "interrupted", "failed", "pruned")
            or t.params.get("optim.lr") is None
        ):
            continue
        pts = [(r["step"], r[loss_key]) for r in t.metrics
               if r.get(loss_key) is not None and r.get("step") is not None]  # fmt: skip
        final = t.row.get(data.metric_label)
        if final is None and t.status != "completed":
            vals = [r[name] for r in t.metrics if r.get(name) is not None]
            final = vals[-1] if vals else None
        curves.append(RunCurve(name=t.name, lr=float(t.params["optim.lr"]), seed=t.seed,
                               status=t.status, steps=[p[0] for p in pts], loss=[p[1] for p in pts],
                               final=final if isinstance(final, int | float) else None,
                               evidence=t.row.get("reason") or t.summary.get("evidence")))  # fmt: skip
    return curves


# ---- plots ------------------------------------------------------------------------------------


def _plt():
    from smollab.report.plots import _plt as plt

    return plt()


def _save(fig, path: Path) -> None:
    from smollab.report.plots import _save as save

    save(fig, path)


def _colors(plt, values: list[float], log: bool):
    import matplotlib.colors as mcolors

    finite = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if not finite:
        return lambda v: None
    lo, hi = min(finite), max(finite)
    norm = (
        mcolors.LogNorm(lo, hi)
        if log and lo > 0 and hi > lo
        else mcolors.Normalize(lo, hi if hi > lo else lo + 1)
    )
    cmap = plt.get_cmap("viridis")
    return lambda v: cmap(0.9 * norm(v)) if isinstance(v, int | float) else None


def plot_lr_sweep(data: SweepData, analysis, out_dir: Path) -> list[Path]:
    plt = _plt()
    written = []
    curves = {c.name: c for c in lr_curves(data)}
    trials = [t for t in data.trials if t.name in curves]
    if not trials:
        return []
    color = _colors(plt, [float(t.params["optim.lr"]) for t in trials], log=True)
    pattern = {r.name: r.pattern for r in analysis.runs}
    starts = [
        t.metrics[0].get("train_loss")
        for t in trials
        if t.metrics and t.metrics[0].get("train_loss")
    ]
    finite_all = [r.get(k) for t in trials for r in t.metrics for k in ("train_loss", "val_loss")
                  if r.get(k) is not None and math.isfinite(r.get(k))]  # fmt: skip
    top = max(starts) * 1.1 if starts else None
    bottom = min(finite_all) * 0.97 if finite_all else None

    has_val = any(r.get("val_loss") is not None for t in trials for r in t.metrics)
    keys = ["train_loss", "val_loss"] if has_val else ["train_loss"]
    fig, axes = plt.subplots(1, len(keys), figsize=(6.5 * len(keys), 4.5), squeeze=False)
    seen = set()
    for ax, key in zip(axes[0], keys, strict=True):
        for t in sorted(trials, key=lambda t: float(t.params["optim.lr"])):
            lr = float(t.params["optim.lr"])
            pts = [(r["step"], r[key]) for r in t.metrics if r.get(key) is not None]
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ys = [p[1] if math.isfinite(p[1]) else (top or 1e9) for p in pts]
            div = pattern.get(t.name) == "diverged"
            label = None
            if (key, lr) not in seen:
                label = f"lr {lr:g}" + (" (diverged)" if div else "")
                seen.add((key, lr))
            ax.plot(xs, ys, "--" if div else "-", color=color(lr), label=label, lw=1.4,
                    marker="o" if len(xs) < 12 else None, markersize=3)  # fmt: skip
            if div:
                ax.plot(xs[-1], ys[-1], "x", color="red", markersize=9, mew=2)
        ax.set_xlabel("step")
        ax.set_ylabel(key.replace("_", " "))
        if top and bottom and top > bottom:
            ax.set_ylim(bottom, top)
        ax.grid(alpha=0.3)
        ax.set_title(f"{key.replace('_', ' ')} by learning rate")
    axes[0][0].legend(fontsize=8, ncol=2)
    fig.suptitle(f"{data.dir.name}: LR sweep ({len(trials)} runs; red x = diverged)")
    fig.tight_layout()
    path = out_dir / "lr_sweep_comparison.png"
    _save(fig, path)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    per = [p for p in analysis.per_lr if p["mean"] is not None]
    finals = [r.final for r in analysis.runs if r.final is not None and r.pattern != "diverged"]
    if per:
        xs = [p["lr"] for p in per]
        ax.errorbar(xs, [p["mean"] for p in per], yerr=[p["std"] or 0 for p in per], fmt="-o",
                    color="C0", capsize=3, label="mean over seeds (± std)")  # fmt: skip
    for r in analysis.runs:
        if r.pattern != "diverged" and r.final is not None:
            ax.plot(r.lr, r.final, ".", color="C0", alpha=0.5)
    ymax = max(finals) if finals else (top or 1.0)
    ymin = min(finals) if finals else 0.0
    span = max(ymax - ymin, 1e-3)
    div = sorted({r.lr for r in analysis.runs if r.pattern == "diverged"})
    if div:
        ax.plot(div, [ymax + 0.15 * span] * len(div), "x", color="red", markersize=10, mew=2,
                label="diverged (off scale)")  # fmt: skip
    if analysis.best_lr is not None:
        ax.plot([analysis.best_lr], [analysis.best_final], "*", color="gold", markersize=16,
                markeredgecolor="black", label=f"best lr {analysis.best_lr:g}")  # fmt: skip
    if analysis.first_diverging_lr is not None:
        ax.axvline(analysis.first_diverging_lr, color="red", ls=":",
                   label=f"first diverging lr {analysis.first_diverging_lr:g}")  # fmt: skip
    if analysis.target_loss is not None:
        ax.axhline(
            analysis.target_loss, color="gray", ls="--", label=f"target {analysis.target_loss:g}"
        )
    ax.set_xscale("log")
    ax.set_ylim(ymin - 0.1 * span, ymax + 0.25 * span)
    ax.set_xlabel("learning rate (log scale)")
    ax.set_ylabel(f"final {data.spec.get('metric', {}).get('name', 'loss')}".replace("_", " "))
    title = f"{data.dir.name}: final loss vs learning rate"
    if analysis.ratio is not None:
        title += f"  (ratio {analysis.ratio:.3g})"
    ax.set_title(title)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    path = out_dir / "lr_vs_final_loss.png"
    _save(fig, path)
    plt.close(fig)
    written.append(path)
    return written


def _curve_key(data: SweepData) -> str:
    if data.command == "pretrain":
        return "train_loss"
    if data.command == "grpo":
        return "reward_mean"
    return data.spec.get("metric", {}).get("name", "loss")


def plot_curves(data: SweepData, out_dir: Path) -> Path | None:
    key = _curve_key(data)
    trials = [t for t in data.trials if any(r.get(key) is not None for r in t.metrics)]
    if not trials:
        return None
    plt = _plt()
    first = data.space[0] if data.space else None
    vals = [t.params.get(first) for t in trials]
    color = _colors(plt, vals, log=_is_log(vals, first, data.spec) if first else False)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for t in trials:
        pts = [
            (r["step"], r[key])
            for r in t.metrics
            if r.get(key) is not None and math.isfinite(r[key])
        ]
        if not pts:
            continue
        bad = t.status in FAILURES and t.status != "interrupted"
        label = " ".join(f"{_short(k)}={_f(v)}" for k, v in t.params.items()) + f" s{t.seed}"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "--" if bad else "-",
                color=color(t.params.get(first)), lw=1.2, label=f"{label} ({t.status})" if bad else label)  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel(key.replace("_", " "))
    ax.set_title(f"{data.dir.name}: {key.replace('_', ' ')} of every trial (dashed: stopped early)")
    ax.grid(alpha=0.3)
    if len(trials) <= 16:
        ax.legend(fontsize=7, ncol=2)
    path = out_dir / "curves.png"
    _save(fig, path)
    plt.close(fig)
    return path


def plot_metric_vs_params(data: SweepData, out_dir: Path) -> list[Path]:
    label = data.metric_label
    done = [
        t
        for t in data.trials
        if t.status == "completed" and isinstance(t.row.get(label), int | float)
    ]
    if not done:
        return []
    plt = _plt()
    written = []
    for key in data.space:
        others = [k for k in data.space if k != key]
        groups: dict[tuple, list[float]] = {}
        for t in done:
            groups.setdefault((t.params.get(key), *(t.params.get(k) for k in others)), []).append(
                t.row[label]
            )
        xs_all = sorted(
            {g[0] for g in groups}, key=lambda v: (isinstance(v, str), v if v is not None else 0)
        )
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in xs_all)
        log = numeric and _is_log(xs_all, key, data.spec)
        pos = (lambda v: v) if numeric else (lambda v, xs=xs_all: xs.index(v))
        fig, ax = plt.subplots(figsize=(7, 4.2))
        series: dict[tuple, list[tuple]] = {}
        for g, ys in groups.items():
            series.setdefault(g[1:], []).append((g[0], ys))
        for i, (rest, pts) in enumerate(sorted(series.items(), key=lambda kv: str(kv[0]))):
            pts.sort(key=lambda p: pos(p[0]))
            x = [pos(p[0]) for p in pts]
            mean = [statistics.fmean(p[1]) for p in pts]
            std = [statistics.stdev(p[1]) if len(p[1]) > 1 else 0.0 for p in pts]
            name = (
                ", ".join(f"{_short(k)}={_f(v)}" for k, v in zip(others, rest, strict=True))
                or "mean over seeds"
            )
            ax.plot(x, mean, "-o", color=f"C{i % 10}", label=name, markersize=4)
            if any(std):
                ax.fill_between(x, [m - s for m, s in zip(mean, std, strict=True)],
                                [m + s for m, s in zip(mean, std, strict=True)], color=f"C{i % 10}",
                                alpha=0.2)  # fmt: skip
            for p in pts:
                ax.plot([pos(p[0])] * len(p[1]), p[1], ".", color=f"C{i % 10}", alpha=0.5)
        failed = [t for t in data.trials if t.status in ("diverged", "degenerate", "stuck")]
        for t in failed:
            v = t.params.get(key)
            if v in xs_all or numeric:
                ax.axvline(pos(v), color="red", alpha=0.25, ls=":")
        if log:
            ax.set_xscale("log")
        if not numeric:
            ax.set_xticks(range(len(xs_all)), [_f(v) for v in xs_all])
        ax.set_xlabel(key + (" (log scale)" if log else ""))
        ax.set_ylabel(label)
        ax.set_title(f"{label} vs {key} (band: seed spread; red: failed runs)")
        ax.grid(alpha=0.3)
        if len(series) > 1 or any(len(p[1]) > 1 for pts in series.values() for p in pts):
            ax.legend(fontsize=7)
        path = out_dir / f"metric_vs_{key.replace('.', '_')}.png"
        _save(fig, path)
        plt.close(fig)
        written.append(path)
    return written


# ---- report.md ---------------------------------------------------------------------------------


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
        from smollab.lab.lr_analysis import analyze

        curves = lr_curves(data)
        if curves:
            analysis = analyze(curves, target_loss=target_loss)
            (d / "lr_analysis.json").write_text(
                __import__("json").dumps(analysis.to_dict(), indent=2)
            )
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
    lines.append(f"_Updated {time.strftime('%Y-%m-%d %H:%M:%S')}; "
                 f"{', '.join(f'{n} {s}' for s, n in sorted(counts.items()))} of {total} trials._")  # fmt: skip
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
        lines.append(f"- sampler {spec.get('sampler')}, seeds {spec.get('seeds')}, metric `{label}` "
                     f"({spec.get('metric', {}).get('goal')}), pruner {spec.get('pruner', {}).get('type')}")  # fmt: skip
    lines.append("")

    done = [
        t
        for t in data.trials
        if t.status == "completed" and isinstance(t.row.get(label), int | float)
    ]
    if done:
        sign = 1 if data.goal == "min" else -1
        best = sorted(done, key=lambda t: sign * t.row[label])
        b = best[0]
        lines += ["## Best", ""]
        lines.append(f"**{label} = {_f(b.row[label])}** with "
                     + ", ".join(f"`{k}={_f(v)}`" for k, v in b.params.items())
                     + f" (seed {b.seed}, `{b.row.get('run_dir')}`)")  # fmt: skip
        lines.append("")
        seeds = spec.get("seeds") or []
        if len(seeds) > 1:
            lines += ["### Seed mean and spread", ""]
            groups: dict[tuple, list[float]] = {}
            for t in done:
                groups.setdefault(tuple(t.params.values()), []).append(t.row[label])
            rows = []
            for key, vals in sorted(groups.items(), key=lambda kv: sign * statistics.fmean(kv[1])):
                sd = statistics.stdev(vals) if len(vals) > 1 else None
                rows.append([*key, len(vals), statistics.fmean(vals), sd, min(vals), max(vals)])
            lines += _table([*data.space, "seeds", f"mean {label}", "std", "min", "max"], rows)
            lines.append("")

    if analysis:
        from smollab.lab.lr_analysis import DEFINITIONS, summary_lines

        lines += ["## Learning-rate analysis", ""]
        lines += summary_lines(analysis)
        lines.append("")
        lines.append(f"_Definitions._ Best LR: {DEFINITIONS['best_lr']}. First diverging LR: "
                     f"{DEFINITIONS['first_diverging_lr']}. Ratio: {DEFINITIONS['ratio']}")  # fmt: skip
        lines.append("")
        rows = [[r.lr, r.seed, r.pattern, r.final, *([("yes" if r.met_target else "no")] if analysis.target_loss is not None else []), r.why]
                for r in analysis.runs]  # fmt: skip
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
        lines += _table(["trial", *data.space, "seed", "status", "step", "evidence"],
                        [[t.row.get("trial"), *t.params.values(), t.seed, t.status, t.row.get("steps"),
                          t.row.get("reason") or t.summary.get("evidence") or ""] for t in failed])  # fmt: skip
    lines.append("")

    lines += ["## All trials", ""]
    lines += _table(["trial", *data.space, "seed", "status", label, "steps", "wall s"],
                    [[t.row.get("trial"), *t.params.values(), t.seed, t.status, t.row.get(label),
                      t.row.get("steps"), t.row.get("wall_s")] for t in data.trials])  # fmt: skip
    lines.append("")
    if images:
        lines += ["## Plots", ""]
        for p in images:
            lines.append(f"![{p.stem}]({p.name})")
            lines.append("")
    path = d / "report.md"
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path
