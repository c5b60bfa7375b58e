"""A routed GRPO run's evaluation in three adapter modes (gradient routing): routing_eval.jsonl read back,
plots/routing.png, plots/routing_scales.png (the forget-scale curve), the report's "Gradient
routing" section and the headline of one chosen mode.

The file has one row per (eval step, mode), modes by adapter scales: both (1, 1), retain_only
(1, 0), forget_only (0, 1); with `grpo.routing.eval_forget_scales`, also rows of mode
forget_scale (1, s) with their `forget_scale` s, the forget-scale curve (from retain_only at 0 to
both at 1). Each row holds reward_mean, reward/<key> for every reward key,
hack_rate, unique_fraction and jaccard. The question it answers: does retain_only keep the task
reward while its hack rate falls to 0, with forget_only carrying the hack?

"Task reward" is the weighted sum of the rewards other than `grpo.routing.hack_reward` (weights
from the run's config.json), so the hack bonus does not prop it up; when the config does not
name them, reward_mean stands in and is labelled so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smollab.config.sections import reward_keys
from smollab.errors import UserError
from smollab.models.routing import MODES
from smollab.rundir.runs import ROUTING_EVAL

_COLORS = {"both": "tab:blue", "retain_only": "tab:green", "forget_only": "tab:red"}
_TAIL = ("hack_rate", "unique_fraction", "jaccard")
SCALED = "forget_scale"  # the mode of an eval_forget_scales row


def read_routing_eval(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of routing_eval.jsonl ([] without the file), a repeated (step, mode) keeping its
    last row (a resumed run), sorted by step. A last line a kill cut short is left out; any
    other bad line is a UserError naming the file and line."""
    path = Path(run_dir) / ROUTING_EVAL
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    rows: dict[tuple[int, str, float], dict[str, Any]] = {}
    order = [*MODES, SCALED]  # models.routing.MODES: mode -> its adapters, in order
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            key = (int(row["step"]), row["mode"], float(row.get("forget_scale", 1.0)))
        except (ValueError, TypeError, KeyError) as e:
            if i == len(lines):
                break  # torn by a kill mid-write
            raise UserError(f"{path}: line {i} is not a row with step and mode ({e})") from e
        if key[1] not in order:
            raise UserError(f"{path}: line {i}: mode {key[1]!r} is not one of {', '.join(order)}")
        rows[key] = row
    return [rows[k] for k in sorted(rows, key=lambda k: (k[0], order.index(k[1]), k[2]))]


def scale_curve(
    rows: list[dict[str, Any]], step: int | None = None
) -> list[tuple[float, dict[str, Any]]]:
    """The forget-scale curve of the evaluation at `step` (None: the last that sampled scales):
    (scale, row) from retain_only (0) through the forget_scale rows to both (1); [] when the run
    evaluated no scales (at `step`)."""
    scaled = [r for r in rows if r["mode"] == SCALED]
    step = scaled[-1]["step"] if step is None and scaled else step
    at = [r for r in rows if r["step"] == step]
    if not any(r["mode"] == SCALED for r in at):
        return []
    ends = {r["mode"]: r for r in at if r["mode"] in ("retain_only", "both")}
    curve = [(float(r["forget_scale"]), r) for r in at if r["mode"] == SCALED]
    if "retain_only" in ends:
        curve.insert(0, (0.0, ends["retain_only"]))
    if "both" in ends:
        curve.append((1.0, ends["both"]))
    return curve


def final_by_mode(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last evaluated row of each mode present, in MODES order (forget_scale rows: see
    `scale_curve`)."""
    last: dict[str, dict[str, Any]] = {}
    for r in rows:  # sorted by step
        if r["mode"] in MODES:
            last[r["mode"]] = r
    return {m: last[m] for m in MODES if m in last}


def task_weights(config: dict[str, Any]) -> dict[str, float] | None:
    """{reward key: weight} of the task rewards (all but the hack reward), keys made as the
    registry makes them (name, name#2, ...); None when the config does not name a hack reward."""
    hack = ((config.get("grpo") or {}).get("routing") or {}).get("hack_reward")
    specs = config.get("reward") or []
    if not hack or not specs:
        return None
    keys = reward_keys(s.get("name") for s in specs)
    weights = {
        k: float(s.get("weight", 1.0)) for k, s in zip(keys, specs, strict=True) if k != hack
    }
    return weights or None


def task_reward(row: dict[str, Any], weights: dict[str, float] | None) -> float | None:
    """The row's task reward (see the module docstring); None when a task key is missing."""
    if weights is None:
        return row.get("reward_mean")
    vals = [row.get(f"reward/{k}") for k in weights]
    if any(v is None for v in vals):
        return None
    return sum(w * v for w, v in zip(weights.values(), vals, strict=True))


def _panels(config: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """(y label, value of a row) of the routing plots' two panels: task reward, hack rate."""
    weights = task_weights(config)
    return (
        ("task reward" if weights else "reward mean", lambda r: task_reward(r, weights)),
        ("hack rate", lambda r: r.get("hack_rate")),
    )


def plot_routing(plt, rows: list[dict[str, Any]], config: dict[str, Any], title: str, path: Path):
    """Two panels against steps, one line per mode: task reward and hack rate."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = _panels(config)
    for ax, (_, value) in zip(axes, panels, strict=True):
        for mode in MODES:
            pts = [(r["step"], value(r)) for r in rows if r["mode"] == mode]
            pts = [p for p in pts if p[1] is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(
                    xs,
                    ys,
                    "-o" if len(xs) < 30 else "-",
                    color=_COLORS[mode],
                    label=mode.replace("_", " "),
                    markersize=3,
                )
    _finish(
        plt,
        fig,
        axes,
        panels,
        "step",
        f"{title}: gradient routing, evaluation per adapter mode",
        path,
    )


def plot_forget_scales(
    plt, rows: list[dict[str, Any]], config: dict[str, Any], title: str, path: Path
) -> None:
    """Two panels against the forget scale (0: retain_only, 1: both), one line per evaluation
    that sampled scales, the last drawn bold: task reward and hack rate. How smoothly the hack
    leaves as forget is turned down says whether forget holds it alone or retain shares it."""
    steps = sorted({r["step"] for r in rows if r["mode"] == SCALED})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    panels = _panels(config)
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        color = plt.cm.Blues(0.35 + 0.65 * i / max(len(steps) - 1, 1))  # later: darker
        for ax, (_, value) in zip(axes, panels, strict=True):
            pts = [(s, value(r)) for s, r in scale_curve(rows, step) if value(r) is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(
                    xs,
                    ys,
                    "-o",
                    color=color,
                    alpha=1.0 if last else 0.7,
                    linewidth=2.0 if last else 1.0,
                    markersize=3,
                    label=f"step {step}" if last or i == 0 else None,
                )
    for ax in axes:
        ax.set_xlim(-0.03, 1.03)
    title = f"{title}: gradient routing, the forget-scale curve per evaluation"
    _finish(plt, fig, axes, panels, "forget scale (0: retain_only, 1: both)", title, path)


def _finish(plt, fig, axes, panels, xlabel: str, title: str, path: Path) -> None:
    """Label, grid and save a routing plot's two panels (the hack rate's axis from 0 to 1)."""
    from smollab.report.plots import save_figure

    for ax, (label, _) in zip(axes, panels, strict=True):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    axes[1].set_ylim(-0.03, 1.03)
    fig.suptitle(title)
    save_figure(fig, path)
    plt.close(fig)


def _f(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, int | float) and not isinstance(v, bool) else ""


def routing_section(
    rows: list[dict[str, Any]],
    image: str | None,
    config: dict[str, Any] | None = None,
    scales_image: str | None = None,
) -> list[str]:
    """Markdown: the final row of each mode as a table, the forget-scale curve when the run
    evaluated one (its table and `scales_image`), then the modes' plot (`image`)."""
    final = final_by_mode(rows)
    keys = sorted({k for r in final.values() for k in r if k.startswith("reward/")})
    cols = ["step", "reward_mean", *keys, *_TAIL]
    lines = [
        "## Gradient routing",
        "",
        "Final evaluation per adapter mode (retain_only should keep the task reward with a "
        "hack rate near 0; forget_only should carry the hack).",
        "",
        "| mode | " + " | ".join(cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for mode, r in final.items():
        cells = [str(r["step"])] + [_f(r.get(c)) for c in cols[1:]]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    lines.append("")
    curve = scale_curve(rows)
    if curve:
        weights = task_weights(config or {})
        label = "task reward" if weights else "reward_mean"
        lines += [
            f"Forget-scale curve at step {curve[-1][1]['step']} (both adapters, forget's times "
            "the scale: 0 is retain_only, 1 both):",
            "",
            f"| forget scale | {label} | hack_rate |",
            "|---|---|---|",
        ]
        for scale, r in curve:
            lines.append(
                f"| {scale:g} | {_f(task_reward(r, weights))} | {_f(r.get('hack_rate'))} |"
            )
        lines.append("")
        if scales_image:
            lines += [f"![forget scales]({scales_image})", ""]
    if image:
        lines += [f"![routing]({image})", ""]
    return lines


def headline(rows: list[dict[str, Any]], mode: str | None, config: dict[str, Any]) -> list[str]:
    """The report's first line: the final figures of `mode` (None: both, or the first mode
    evaluated yet); UserError when a mode asked for has no rows."""
    final = final_by_mode(rows)
    if mode is None:
        mode = "both" if "both" in final else next(iter(final))
    if mode not in final:
        raise UserError(f"{ROUTING_EVAL} has no rows for mode {mode!r}")
    r = final[mode]
    weights = task_weights(config)
    task = task_reward(r, weights)
    parts = [f"task reward {_f(task)}"] if weights else []
    parts += [
        f"reward mean {_f(r.get('reward_mean'))}",
        f"hack rate {_f(r.get('hack_rate'))}",
        f"unique fraction {_f(r.get('unique_fraction'))}",
    ]
    return [f"- adapter mode **{mode}** (step {r['step']}): " + ", ".join(parts)]
