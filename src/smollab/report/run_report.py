"""`smollab report RUN_DIR`: a run's plots (redrawn from metrics.csv) and `report.md`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from smollab.errors import UserError
from smollab.rundir.atomic import atomic_write_text
from smollab.rundir.runs import METRICS, REPORT, ROUTING_EVAL, SUMMARY, RunView

# Summary fields worth a line, in this order (others are left to summary.json).
KEYS = [
    "status",
    "evidence",
    "steps",
    "tokens",
    "final_train_loss",
    "final_val_loss",
    "best_val_loss",
    "base_accuracy",
    "final_accuracy",
    "best_accuracy",
    "base_reward",
    "final_reward",
    "base_eval_reward",
    "final_eval_reward",
    "train_seconds",
    "wall_seconds",
    "tokens_per_s",
    "params_total",
    "params_non_embedding",
    "params_trainable",
    "device",
]


def _f(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return "" if v is None else str(v)


def write_run_report(run_dir: str | Path, mode: str | None = None) -> Path:
    """report.md with the plots. On a routed run (routing_eval.jsonl) the headline gives the
    final figures of adapter `mode` (default both); a `mode` on any other run is refused."""
    from smollab.report import routing
    from smollab.report.plots import plot_run

    d = Path(run_dir)
    view = RunView(d)
    if not view.summary_path.exists() and not view.metrics_path.exists():
        raise UserError(f"{d}: no {SUMMARY} or {METRICS} (not a run directory)")
    if mode is not None and mode not in routing.MODES:
        raise UserError(f"mode must be one of {', '.join(routing.MODES)}, got {mode!r}")
    routed = routing.read_routing_eval(d)
    if mode is not None and not routed:
        raise UserError(f"{d}: --mode needs a routed run, and it has no {ROUTING_EVAL}")
    summary = view.summary()
    rows = view.metrics()
    config = view.config()
    head = routing.headline(routed, mode, config) if routed else []
    images = plot_run(d)
    routing_png = next((p for p in images if p.name == "routing.png"), None)
    scales_png = next((p for p in images if p.name == "routing_scales.png"), None)
    images = [p for p in images if p not in (routing_png, scales_png)]

    lines = [f"# Run `{d.name}`", "", f"_Written {time.strftime('%Y-%m-%d %H:%M:%S')}._", ""]
    lines += head
    if summary.get("command"):
        lines.append(f"- command: `smollab {summary['command']}`")
    for k in KEYS:
        if summary.get(k) is not None:
            lines.append(
                f"- {k.replace('_', ' ')}: **{_f(summary[k])}**"
                if k == "status"
                else f"- {k.replace('_', ' ')}: {_f(summary[k])}"
            )
    for name, evidence in (summary.get("flags") or {}).items():
        lines.append(f"- flag **{name}**: {evidence}")
    lines.append("")
    if config:
        model = config.get("model", {})
        optim = config.get("optim", {})
        train = config.get("train", {})
        lines += ["## Configuration (main keys; all in config.json)", ""]
        lines.append(
            f"model {model.get('path') or model.get('preset')}"
            + (f" (LoRA r={model['lora']['r']})" if model.get("lora", {}).get("enabled") else "")
            + f"; lr {optim.get('lr')} ({optim.get('schedule')}); batch {train.get('batch_size')}"
            + f"; max steps {train.get('max_steps')}; seed {config.get('run', {}).get('seed')}"
        )
        if "grpo" in config:
            g = config["grpo"]
            lines.append(
                f"GRPO: beta {g.get('beta')}, {g.get('num_generations')} generations, "
                f"max completion {g.get('max_completion_length')}, loss {g.get('loss_type')}"
            )
        lines.append("")
    if summary.get("command") == "rft" and rows:
        lines += _rounds_table(rows)
    elif rows:
        last = rows[-1]
        lines += ["## Last logged step", ""]
        keys = [k for k, v in last.items() if v is not None]
        lines.append("| " + " | ".join(keys) + " |")
        lines.append("|" + "---|" * len(keys))
        lines.append("| " + " | ".join(_f(last[k]) for k in keys) + " |")
        lines.append("")
    if routed:
        lines += routing.routing_section(
            routed,
            str(routing_png.relative_to(d)) if routing_png else None,
            config,
            str(scales_png.relative_to(d)) if scales_png else None,
        )
    if images:
        lines += ["## Plots", ""]
        for p in images:
            lines.append(f"![{p.stem}]({p.relative_to(d)})")
            lines.append("")
    path = d / REPORT
    atomic_write_text(path, "\n".join(lines) + "\n")
    return path


def _rounds_table(rows: list[dict[str, Any]]) -> list[str]:
    """`smollab rft`: one line per round (0 = the base model): held-out accuracy, what the round
    generated and kept, its SFT, the wall time at its end."""
    cols = [
        ("round", "step"),
        ("accuracy", "accuracy"),
        ("eval reward", "eval_reward_mean"),
        ("generated", "generated"),
        ("kept", "kept"),
        ("kept fraction", "kept_fraction"),
        ("prompts with a kept one", "prompts_with_kept"),
        ("completions/s", "completions_per_s"),
        ("SFT steps", "sft_steps"),
        ("SFT loss", "sft_train_loss"),
        ("wall s", "wall_s"),
    ]
    out = [
        "## Accuracy per round",
        "",
        "accuracy: the fraction of held-out completions the checker (rft.accuracy_reward) "
        "scores >= 1; round 0 is the base model.",
        "",
        "| " + " | ".join(c for c, _ in cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in rows:
        out.append("| " + " | ".join(_f(r.get(k)) for _, k in cols) + " |")
    return [*out, ""]
