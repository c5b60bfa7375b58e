"""The bench's reports: the results table, bench.md and bench.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from smollab.lab.bench.knobs import as_overrides


def _n(v: Any, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def table_markdown(result: dict[str, Any]) -> str:
    """The results as one markdown table (printed, and the heart of bench.md)."""
    grpo = result.get("kind") == "grpo"
    qname = "mean reward" if grpo else "val loss"
    for r in result.get("results", []):
        qname = r.get("quality_name") or qname
    head = ["variant", "changes", "step s", "1st step s", "compl/s" if grpo else "tok/s"]
    head += ["gen tok/s"] if grpo else []
    head += ["speedup", "peak MB", qname, "delta", "within tol", "wall s", "load"]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" if h in ("variant", "changes") else "---:" for h in head) + "|",
    ]
    for r in result.get("results", []):
        changes = " ".join(as_overrides(r.get("values") or {})) or "-"
        if r.get("status") != "ok":
            cells = [r["variant"], changes, f"{r.get('status')}: {r.get('reason', '')}"]
            cells += [""] * (len(head) - len(cells))
        else:
            tol = r.get("within_tolerance")
            cells = [
                r["variant"],
                changes,
                _n(r.get("wall_step_s"), ".3f") + " wall"
                if r.get("timing") == "wall"
                else _n(r.get("step_s"), ".3f"),
                _n(r.get("first_step_s"), ".2f"),
                _n(r.get("throughput"), ",.1f"),
            ]
            if grpo:
                cells.append(_n(r.get("gen_tokens_per_s"), ",.0f"))
            cells += [
                _n(r.get("speedup"), ".2f") + "x",
                _n(r.get("peak_mem_mb"), ",.0f"),
                _n(r.get("quality"), ".4f"),
                _n(r.get("quality_delta"), "+.4f"),
                "" if tol is None else ("yes" if tol else "**no**"),
                _n(r.get("wall_s"), ".0f"),
                _n(r.get("load"), ".1f"),
            ]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def _rep(result: dict[str, Any]) -> str:
    n = result.get("repeat") or 1
    return f", the fastest of {n} runs per variant" if n > 1 else ""


def render_markdown(result: dict[str, Any], image: bool = True) -> str:
    kind = result.get("kind")
    tol = result.get("tolerance")
    tol_text = (
        f"final validation loss within {100 * tol:g}% of the baseline's"
        if kind != "grpo"
        else f"mean training reward within {tol:g} of the baseline's"
    )
    base_vals = " ".join(as_overrides(result.get("baseline_values") or {})) or "(none)"
    lines = [
        f"# smollab bench: `{result.get('workload')}` ({kind})",
        "",
        f"Device {result.get('device', '?')}; {result.get('steps')} optimizer steps per variant, "
        f"each a separate `smollab {kind}` process; step time is the median over steps "
        f"{result.get('warmup_steps', 0) + 1}..{result.get('steps')} (steps up to "
        f"{result.get('warmup_steps')} are warm-up; the first step is shown on its own: it holds "
        f"compilation){_rep(result)}. A step time marked wall (the logging and saving "
        f"intervals, whose cost falls between the loop's timed steps) is wall clock per step "
        f"from step {result.get('warmup_steps', 0)} on, against the baseline's wall clock. "
        f"Within tolerance: {tol_text}. Peak memory: max allocated on CUDA, peak "
        f"RSS of the process on CPU. Load average at start {result.get('load_start')}, at end "
        f"{result.get('load_end')}.",
        "",
        f"Workload overrides: `{' '.join(result.get('overrides') or []) or '(none)'}`; baseline "
        f"(every benched knob off): `{base_vals}`.",
        "",
        table_markdown(result),
        "",
    ]
    res = {r["variant"]: r for r in result.get("results", [])}
    base, rep = res.get("baseline"), res.get("baseline (repeat)")
    if base and rep and base.get("status") == rep.get("status") == "ok":
        diff = abs(base["step_s"] - rep["step_s"]) / min(base["step_s"], rep["step_s"])
        lines += [
            f"Noise: the baseline, run again after the knobs, took {rep['step_s']:.3f} s "
            f"per step against {base['step_s']:.3f} s the first time ({100 * diff:.0f}% "
            "apart). Speedups are against the faster of the two; the load column shows "
            "what else the machine was doing when each run started.",
            "",
        ]
    combo = result.get("combined_knobs")
    if combo is not None:
        if len(combo) >= 2:
            lines += [
                f"Combined: the knobs that helped (at least {result.get('min_speedup'):g}x "
                f"and within tolerance; the best of each group): {', '.join(combo)}.",
                "",
            ]
        elif combo:
            lines += [
                f"Only {combo[0]} helped (at least {result.get('min_speedup'):g}x and within "
                "tolerance), so there is no separate combined run.",
                "",
            ]
        else:
            lines += [
                f"No knob helped by at least {result.get('min_speedup'):g}x within "
                "tolerance, so there is no combined run.",
                "",
            ]
    skipped = [(s["knob"], s["reason"]) for s in result.get("skipped", [])]
    skipped += [
        (r["variant"], r["reason"])
        for r in result.get("results", [])
        if r.get("status") == "skipped"
    ]
    if skipped:
        lines += ["Skipped (do not apply here):", ""]
        lines += [f"- **{n}**: {why}" for n, why in skipped]
        lines.append("")
    if image and any(r.get("status") == "ok" for r in result.get("results", [])):
        lines += ["![speedup and peak memory per variant](bench.png)", ""]
    return "\n".join(lines)


def write_plot(result: dict[str, Any], path: Path) -> Path | None:
    """bench.png: speedup and peak memory per measured variant (green: within tolerance)."""
    rows = [r for r in result.get("results", []) if r.get("status") == "ok"]
    if not rows:
        return None
    from smollab.report.plots import pyplot, save_figure

    plt = pyplot()
    names = [r["variant"] for r in rows][::-1]
    speed = [r.get("speedup") or 0.0 for r in rows][::-1]
    mem = [r.get("peak_mem_mb") or 0.0 for r in rows][::-1]
    colors = [
        "tab:green"
        if r.get("within_tolerance")
        else "tab:orange"
        if r.get("within_tolerance") is False
        else "tab:gray"
        for r in rows
    ][::-1]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(rows) + 1.6), sharey=True)
    axes[0].barh(names, speed, color=colors)
    axes[0].axvline(1.0, color="black", lw=1)
    for y, v in enumerate(speed):
        axes[0].text(v, y, f" {v:.2f}x", va="center", fontsize=8)
    axes[0].set_xlabel("speedup vs baseline (step time)")
    axes[0].set_xlim(0, max(speed) * 1.2 + 0.05)
    axes[1].barh(names, mem, color="tab:blue")
    axes[1].set_xlabel("peak memory (MB)")
    for ax in axes:
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(
        f"smollab bench: {Path(str(result.get('workload'))).name} ({result.get('kind')}, "
        f"{result.get('device', '?')}); orange = outside tolerance"
    )
    save_figure(fig, path)
    plt.close(fig)
    return path
