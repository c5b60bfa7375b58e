"""The probe's table and plot (probe.png), and `smollab report PROBE_DIR`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def table(result: dict[str, Any]) -> list[str]:
    """One line per level; `start s` is the median launch to first logged step (process levels;
    "-" for lanes and for results cached before it was measured)."""
    unit = result.get("unit") or "units/s"
    head = f"{'k':>4} {'threads':>7} {'step ms':>9} {'steps/s':>9} {unit:>14} {'MB/run':>9} {'start s':>8}  note"
    lines = [head, "-" * len(head)]

    def key(o):
        return (o.get("k"), o.get("threads_per_run")) if o else None

    bl, bt = key(result.get("best_latency")), key(result.get("best_throughput"))
    for lv in result["levels"]:
        note = lv.get("error") or ""
        marks = [
            m
            for m, o in (("best latency", bl), ("best throughput", bt))
            if o == (lv["k"], lv["threads"])
        ]
        note = ", ".join(marks) + (f"; {note}" if note and marks else note)
        f = lambda v, fmt: format(v, fmt) if v is not None else "-"  # noqa: E731
        lines.append(
            f"{lv['k']:>4} {f(lv['threads'], '>7')} "
            f"{f(lv['step_s'] * 1000 if lv['step_s'] else None, '>9.1f')} "
            f"{f(lv['steps_per_s'], '>9.2f')} {f(lv['units_per_s'], '>14,.0f')} "
            f"{f(lv['peak_mem_mb'], '>9,.0f')} {f(lv.get('start_s'), '>8.2f')}  {note}"
        )
    return lines


def memory_line(result: dict[str, Any]) -> str:
    """What the table's MB/run is: warm runs on a CPU share the server's pages (`run_memory`)."""
    if result.get("run_memory") == "pss":
        return (
            "MB/run: each run's largest PSS seen (the runs forked from a warm start server and "
            "share its pages; PSS adds up across runs, where peak RSS counts them once per run)"
        )
    return "MB/run: each run's logged peak memory (CPU: peak RSS; CUDA: the most tensors held)"


def mps_line(result: dict[str, Any]) -> str | None:
    """How the runs shared a CUDA GPU (None off CUDA, or for a probe.json from before)."""
    m = result.get("mps_daemon")
    if not m:
        return None
    if not m.get("requested"):
        return "MPS daemon: off (the runs time-sliced the GPU, as a sweep with mps: false runs)"
    if m.get("used"):
        return "MPS daemon: on (as a sweep with mps: true runs)"
    return "MPS daemon: requested but not available (the runs time-sliced the GPU)"


def plot_probe(result: dict[str, Any], path: Path) -> None:
    from smollab.report.plots import pyplot, save_figure

    per_k: dict[int, dict] = {}
    for lv in result["levels"]:
        if lv.get("steps_per_s") and (
            lv["k"] not in per_k or lv["steps_per_s"] > per_k[lv["k"]]["steps_per_s"]
        ):
            per_k[lv["k"]] = lv
    levels = [per_k[k] for k in sorted(per_k)]
    if not levels:
        return
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    ks = [lv["k"] for lv in levels]
    a1.plot(ks, [lv["step_s"] * 1000 for lv in levels], "-o")
    a1.set_ylabel("median step time per run (ms)")
    a2.plot(ks, [lv["steps_per_s"] for lv in levels], "-o", color="C1", label="k processes")
    lanes = [lv for lv in result.get("lanes") or [] if lv.get("steps_per_s")]
    ticks = ks
    series: dict[int, list[dict]] = {}  # per workers W; x: the trials at once, W x N
    for lv in lanes:
        series.setdefault(lv.get("workers", 1), []).append(lv)
    for i, (w, lvs) in enumerate(sorted(series.items())):
        xs = [w * lv["lanes"] for lv in lvs]
        name = "N lanes, one process" if w == 1 else f"{w} processes x N lanes"
        a1.plot(
            xs,
            [lv["step_s"] * 1000 for lv in lvs],
            "-s",
            color=f"C{2 + i}",
            label=f"{name}: one iteration",
        )
        a2.plot(xs, [lv["steps_per_s"] for lv in lvs], "-s", color=f"C{2 + i}", label=name)
        ticks = sorted({*ticks, *xs})
    if lanes:
        a1.legend(fontsize=8)
    a2.set_ylabel("aggregate steps/s")
    if result.get("unit") and all(lv.get("units_per_s") for lv in levels):
        a3 = a2.twinx()
        a3.plot(ks, [lv["units_per_s"] for lv in levels], alpha=0)
        if lanes:  # the same ratio of units to steps: the two axes stay in step
            a3.plot(
                [lv.get("workers", 1) * lv["lanes"] for lv in lanes],
                [lv["units_per_s"] for lv in lanes],
                alpha=0,
            )
        a3.set_ylabel(f"aggregate {result['unit']}")
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(k) for k in ticks])
        ax.set_xlabel("concurrent runs k" + (" (or lanes: W x N)" if lanes else ""))
        ax.grid(alpha=0.3)
    for key, color, label in (
        ("best_latency", "green", "best latency"),
        ("best_throughput", "red", "best throughput"),
    ):
        o = result.get(key)
        if o:
            for ax in (a1, a2):
                ax.axvline(o["k"], color=color, ls=":", label=f"{label}: k={o['k']}")
    a2.legend(fontsize=8)
    dev = result["device"]
    mps = result.get("mps_daemon")
    fig.suptitle(
        f"probe: {result['command']} {Path(result.get('base') or '').name} on "
        f"{dev['kind']} ({dev['name']})"
        + (f", MPS daemon {'on' if mps['used'] else 'off'}" if mps else ""),
        fontsize=10,
    )
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def report_probe(probe_dir: str | Path) -> Path:
    d = Path(probe_dir)
    result = json.loads((d / "probe.json").read_text())
    plot_probe(result, d / "probe.png")
    for line in table(result):
        print(line)
    print(memory_line(result))
    print(f"stopped: {result.get('stop_reason')}")
    if line := mps_line(result):
        print(line)
    if result.get("lanes"):
        from smollab.lab.probe.lanes import lanes_table, recommendation_line

        for line in lanes_table(result):
            print(line)
        print(f"lanes stopped: {result.get('lanes_stop_reason')}")
        if line := recommendation_line(result):
            print(line)
    return d / "probe.png"
