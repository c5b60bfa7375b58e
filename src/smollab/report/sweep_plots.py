"""A sweep's plots: `curves.png` (every trial's curve), `metric_vs_<param>.png` (the metric against
each swept parameter, seed mean and spread), and for a learning-rate sweep `lr_sweep_comparison.png`
and `lr_vs_final_loss.png`."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from smollab.report.plots import pyplot, save_figure
from smollab.report.sweep_data import FAILURES, SweepData, _f, _short, lr_curves


def _is_log(values: list[Any], key: str, spec: dict[str, Any]) -> bool:
    dist = spec.get("space", {}).get(key)
    if isinstance(dist, dict):
        return bool(dist.get("log"))
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if not nums or min(nums) <= 0:
        return False
    return key.endswith("lr") or max(nums) / min(nums) >= 20


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
    plt = pyplot()
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
    finite_all = [
        r.get(k)
        for t in trials
        for r in t.metrics
        for k in ("train_loss", "val_loss")
        if r.get(k) is not None and math.isfinite(r.get(k))
    ]
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
            ax.plot(
                xs,
                ys,
                "--" if div else "-",
                color=color(lr),
                label=label,
                lw=1.4,
                marker="o" if len(xs) < 12 else None,
                markersize=3,
            )
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
    save_figure(fig, path)
    plt.close(fig)
    written.append(path)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    per = [p for p in analysis.per_lr if p["mean"] is not None]
    finals = [r.final for r in analysis.runs if r.final is not None and r.pattern != "diverged"]
    if per:
        xs = [p["lr"] for p in per]
        ax.errorbar(
            xs,
            [p["mean"] for p in per],
            yerr=[p["std"] or 0 for p in per],
            fmt="-o",
            color="C0",
            capsize=3,
            label="mean over seeds (± std)",
        )
    for r in analysis.runs:
        if r.pattern != "diverged" and r.final is not None:
            ax.plot(r.lr, r.final, ".", color="C0", alpha=0.5)
    ymax = max(finals) if finals else (top or 1.0)
    ymin = min(finals) if finals else 0.0
    span = max(ymax - ymin, 1e-3)
    div = sorted({r.lr for r in analysis.runs if r.pattern == "diverged"})
    if div:
        ax.plot(
            div,
            [ymax + 0.15 * span] * len(div),
            "x",
            color="red",
            markersize=10,
            mew=2,
            label="diverged (off scale)",
        )
    if analysis.best_lr is not None:
        ax.plot(
            [analysis.best_lr],
            [analysis.best_final],
            "*",
            color="gold",
            markersize=16,
            markeredgecolor="black",
            label=f"best lr {analysis.best_lr:g}",
        )
    if analysis.first_diverging_lr is not None:
        ax.axvline(
            analysis.first_diverging_lr,
            color="red",
            ls=":",
            label=f"first diverging lr {analysis.first_diverging_lr:g}",
        )
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
    save_figure(fig, path)
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
    plt = pyplot()
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
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            "--" if bad else "-",
            color=color(t.params.get(first)),
            lw=1.2,
            label=f"{label} ({t.status})" if bad else label,
        )
    ax.set_xlabel("step")
    ax.set_ylabel(key.replace("_", " "))
    ax.set_title(f"{data.dir.name}: {key.replace('_', ' ')} of every trial (dashed: stopped early)")
    ax.grid(alpha=0.3)
    if len(trials) <= 16:
        ax.legend(fontsize=7, ncol=2)
    path = out_dir / "curves.png"
    save_figure(fig, path)
    plt.close(fig)
    return path


def plot_metric_vs_params(data: SweepData, out_dir: Path) -> list[Path]:
    label = data.metric_label
    done = [
        t
        for t in data.trials
        if t.status == "completed"
        and isinstance(t.row.get(label), int | float)
        and not t.is_baseline  # not a point of the space
    ]
    if not done:
        return []
    plt = pyplot()
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
                ax.fill_between(
                    x,
                    [m - s for m, s in zip(mean, std, strict=True)],
                    [m + s for m, s in zip(mean, std, strict=True)],
                    color=f"C{i % 10}",
                    alpha=0.2,
                )
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
        save_figure(fig, path)
        plt.close(fig)
        written.append(path)
    return written
