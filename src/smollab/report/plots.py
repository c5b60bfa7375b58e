"""Plots of one run, drawn from its metrics.csv so they can be redrawn at any time."""

from __future__ import annotations

from pathlib import Path

from smollab.rundir.runs import RunView


def pyplot():
    """matplotlib.pyplot on the Agg backend: figures go to files, no display is needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    """Write a png atomically, so a live report never links a half-written image."""
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    tmp.replace(path)


def _series(rows, x: str, y: str):
    pts = [(r[x], r[y]) for r in rows if r.get(x) is not None and r.get(y) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_run(run_dir: str | Path) -> list[Path]:
    """loss_curves.png and lr_schedule.png (pretraining); reward/KL/diversity when present;
    routing.png when the run wrote routing_eval.jsonl, and routing_scales.png when that holds
    forget-scale rows."""
    from smollab.report.routing import (
        plot_forget_scales,
        plot_routing,
        read_routing_eval,
        scale_curve,
    )

    run_dir = Path(run_dir)
    view = RunView(run_dir)
    rows = view.metrics()
    routing = read_routing_eval(run_dir)
    if not rows and not routing:
        return []
    plt = pyplot()
    out_dir = view.plots_dir
    out_dir.mkdir(exist_ok=True)
    written = []
    if routing:
        plot_routing(plt, routing, view.config(), run_dir.name, out_dir / "routing.png")
        written.append(out_dir / "routing.png")
    if scale_curve(routing):
        plot_forget_scales(
            plt, routing, view.config(), run_dir.name, out_dir / "routing_scales.png"
        )
        written.append(out_dir / "routing_scales.png")

    if any(r.get("train_loss") is not None for r in rows):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, x, label in ((axes[0], "step", "step"), (axes[1], "wall_s", "wall time (s)")):
            for key, style in (("train_loss", "-"), ("val_loss", "o-")):
                xs, ys = _series(rows, x, key)
                if xs:
                    ax.plot(xs, ys, style, label=key.replace("_", " "), markersize=3)
            ax.set_xlabel(label)
            ax.set_ylabel("loss")
            ax.grid(alpha=0.3)
            ax.legend()
        fig.suptitle(f"{run_dir.name}: loss")
        save_figure(fig, out_dir / "loss_curves.png")
        plt.close(fig)
        written.append(out_dir / "loss_curves.png")

    xs, ys = _series(rows, "step", "lr")
    if xs:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(xs, ys)
        ax.set_xlabel("step")
        ax.set_ylabel("learning rate")
        ax.set_title(f"{run_dir.name}: LR schedule")
        ax.grid(alpha=0.3)
        save_figure(fig, out_dir / "lr_schedule.png")
        plt.close(fig)
        written.append(out_dir / "lr_schedule.png")

    written += _plot_panels(plt, rows, run_dir, out_dir)
    return written


# Generation runs (GRPO): one figure per family of metrics, each panel a metric over steps.
_PANELS = {
    "reward.png": ["reward_mean", "eval_reward_mean"],
    "kl.png": ["kl"],
    "diversity.png": ["unique_fraction", "jaccard", "repetition"],
    "hack.png": ["hack_rate", "routed_frac", "eligible_frac"],  # routed GRPO, training batches
    "accuracy.png": ["accuracy", "kept_fraction"],  # rft: one row per round (step = round)
}


def _plot_panels(plt, rows, run_dir: Path, out_dir: Path) -> list[Path]:
    written = []
    for name, keys in _PANELS.items():
        present = [k for k in keys if any(r.get(k) is not None for r in rows)]
        if not present:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key in present:
            xs, ys = _series(rows, "step", key)
            ax.plot(
                xs, ys, "-o" if len(xs) < 30 else "-", label=key.replace("_", " "), markersize=3
            )
        ax.set_xlabel("step")
        ax.set_title(f"{run_dir.name}: {name.removesuffix('.png')}")
        ax.grid(alpha=0.3)
        ax.legend()
        save_figure(fig, out_dir / name)
        plt.close(fig)
        written.append(out_dir / name)
    return written


def plot_intervals(s, out_dir: Path, name: str = "seed_intervals.png") -> Path | None:
    """Each configuration's mean with its bootstrap interval and its seeds as dots, best on top:
    `s` is a `smollab.report.seed_stats.SeedStats`."""
    if not s.configs:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(s.configs) + 1.5))
    for i, c in enumerate(s.configs):
        y = len(s.configs) - 1 - i
        if c.ci[0] is not None:
            ax.plot([c.ci[0], c.ci[1]], [y, y], color="C0", lw=3, alpha=0.6)
        ax.plot([c.mean], [y], "o", color="C0")
        ax.plot(c.values, [y] * len(c.values), "x", color="gray", ms=5)
    ax.set_yticks(range(len(s.configs)))
    ax.set_yticklabels([c.name for c in reversed(s.configs)], fontsize=8)
    ax.set_xlabel(f"{s.metric} ({s.goal} is better)")
    ax.set_title(f"mean and {100 * s.options.level:g}% bootstrap interval; x: seeds")
    ax.grid(alpha=0.3, axis="x")
    path = out_dir / name
    save_figure(fig, path)
    plt.close(fig)
    return path
