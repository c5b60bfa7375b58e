"""`smollab bench WORKLOAD`: each performance knob switched on alone, measured on the user's workload.

The speed guides promise speedups; this measures them. A workload (a pretrain or grpo recipe plus
overrides) runs briefly at a baseline with every benched knob off, then once per knob with that
knob on, then at the baseline again (the repeat shows the noise of the machine; speedups are
against the faster of the two), then with all the knobs that helped together. Each variant is a separate `smollab` child process with
its own run directory under the bench directory, so compile caches, thread settings and allocator
state never leak from one variant into the next; on Linux each is forked from one warm start
server for the whole bench (`--start`, `smollab.lab.start`), so none pays the imports again.

The knobs and the plan are in `smollab.lab.bench.knobs`, running and reading one variant in
`smollab.lab.bench.measure`, and bench.md and bench.png in `smollab.lab.bench.report`.

This module imports no torch: the parent only launches children and reads files.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, get_args

from smollab.errors import UserError
from smollab.lab import children as ch
from smollab.lab.bench.knobs import (
    KNOBS,
    as_overrides,
    baseline_values,
    combination,
    plan,
    select,
)
from smollab.lab.bench.measure import load_average, run_variant, within_tolerance
from smollab.lab.bench.report import render_markdown, write_plot
from smollab.lab.spec_common import StartValue
from smollab.lab.start import check as check_start
from smollab.lab.start import server as warm_server
from smollab.rundir.atomic import atomic_write_json, atomic_write_text
from smollab.rundir.runs import WARM_LOG

DEFAULT_STEPS = {"pretrain": 30, "grpo": 20, "sft": 30}
DEFAULT_TOLERANCE = {"pretrain": 0.02, "grpo": 0.05, "sft": 0.02}  # relative loss / abs. reward


def run_bench(
    workload: str,
    overrides: list[str],
    *,
    knobs: list[str] | None = None,
    steps: int | None = None,
    out: str | Path | None = None,
    kind: str | None = None,
    tolerance: float | None = None,
    min_speedup: float = 1.03,
    timeout: float | None = None,
    recheck: bool = True,
    repeat: int = 1,
    start: str = "auto",
    echo=print,
) -> dict[str, Any]:
    """Run the bench; write bench.json, bench.md and bench.png into `out`; return the result.

    Order: baseline, each knob alone, the baseline again (`recheck`), then the knobs that helped
    together. Speedups are against the faster baseline run, and `repeat` runs every variant that
    many times and keeps the fastest: on a shared machine other work only ever adds time, so the
    fastest run is the best estimate of a variant's own cost, and the two baselines'
    disagreement shows how much noise there was. Each result records the load average at its
    start. `start`: how the variants' processes start (`smollab.lab.start`; warm: forked from one
    server for the whole bench, which ends with it).
    """
    from smollab.config.load import guess_command, load_config
    from smollab.config.recipes import resolve_recipe

    kind = kind or guess_command(resolve_recipe(workload, "bench"), overrides)
    cfg = load_config(kind, workload, overrides)  # bad workloads stop here, before any run
    if knobs is not None and not knobs:
        raise UserError("--knobs: empty; name at least one knob, or leave --knobs out for all")
    names = select(knobs, kind)
    steps = DEFAULT_STEPS[kind] if steps is None else steps
    if steps < 3:
        raise UserError(
            f"--steps must be at least 3 (warm-up steps are excluded from timing), got {steps}"
        )
    if repeat < 1:
        raise UserError(f"--repeat must be at least 1, got {repeat}")
    if timeout is not None and not timeout > 0:
        raise UserError(f"--timeout must be a positive number of seconds, got {timeout:g}")
    if tolerance is not None and not tolerance >= 0:
        raise UserError(f"--tolerance must be 0 or more, got {tolerance:g}")
    if not min_speedup > 0:
        raise UserError(f"--min-speedup must be above 0 (1.03: 3% faster), got {min_speedup:g}")
    if start not in get_args(StartValue):
        raise UserError(f"--start: auto, warm or cold, got {start!r}")
    check_start(start, "--start")
    warmup = max(1, min(5, steps // 5))
    tol = DEFAULT_TOLERANCE[kind] if tolerance is None else tolerance
    out = Path(out) if out else Path("runs") / "bench" / f"{kind}-{Path(workload).stem}"
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a directory")
    from smollab.models.loading import check_model_source

    check_model_source(cfg.model)  # every variant loads it: a missing one stops here, once
    out.mkdir(parents=True, exist_ok=True)
    if kind != "sft":  # SFT reads records, with no data directory to prepare
        from smollab.data.prepare import ensure_prepared

        # prepare data once, outside every variant's wall time
        ensure_prepared(cfg.data, exact=kind == "pretrain", log=lambda _: None)

    forced = [
        f"train.max_steps={steps}",
        "train.log_interval=1",
        f"train.eval_interval={steps}",
        f"train.save_interval={steps + 1}",
        "train.max_time=null",
        "run.resume=never",
    ]
    if cfg.optim.warmup_steps >= steps:  # the schedule's warmup must end within the run
        forced.append(f"optim.warmup_steps={steps - 1}")
    if kind == "pretrain":
        forced.append("train.max_tokens=null")
    if kind in ("sft", "grpo"):
        forced.append("train.epochs=null")  # the length is train.max_steps
    if kind == "grpo":
        forced.append("failure.action=flag")  # every variant runs all its steps
    base_vals = baseline_values(names, kind, cfg)
    base_ov = as_overrides(base_vals)

    def command(vals: dict[str, Any], run_dir: Path) -> list[str]:
        # forced before the knobs: the log_interval and save_interval knobs change two of them
        return ch.smollab_argv(
            kind,
            str(workload),
            [*overrides, *forced, *base_ov, *as_overrides(vals), f"run.dir={run_dir}"],
        )

    result: dict[str, Any] = {
        "workload": str(workload),
        "kind": kind,
        "overrides": overrides,
        "steps": steps,
        "warmup_steps": warmup,
        "repeat": repeat,
        "tolerance": tol,
        "min_speedup": min_speedup,
        "baseline_values": base_vals,
        "knobs": names,
        "results": [],
        "skipped": [],
        "load_start": load_average(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "start": None,  # warm or cold, once the server is (or is not) up
    }
    results: list[dict[str, Any]] = result["results"]
    counter = {"i": 0, "n": 1 + int(recheck)}

    def variant(name: str, dirname: str, vals: dict[str, Any], knob: str | None, what: str):
        counter["i"] += 1
        echo(f"[{counter['i']}/{counter['n']}] {name}: {what}")
        runs = [
            run_variant(name, command(vals, out / d), out / d, kind, warmup, timeout, vals, zygote)
            for d in [dirname] + [f"{dirname}.r{k}" for k in range(2, repeat + 1)]
        ]
        r = _merge_repeats(runs)
        r["knob"] = knob
        if knob and r.get("status") == "ok":
            word = KNOBS[knob].runtime_word
            hit = [x for x in r.get("runtime_skipped", []) if word and x.startswith(word)]
            if hit:
                r.update(status="skipped", reason=f"the runtime skipped it: {hit[0]}")
        results.append(r)
        rescore(results, kind, tol)
        atomic_write_json(out / "bench.json", result)
        echo(f"  {_short(r)}")
        return r

    echo(f"bench {workload} ({kind}): {len(names)} knobs, {steps} steps per run -> {out}")
    with warm_server(start, out / WARM_LOG, echo, what="variant") as zygote:
        result["start"] = "warm" if zygote else "cold"
        base = variant("baseline", "baseline", {}, None, " ".join(base_ov) or "(workload as given)")
        result["baseline_ok"] = base.get("status") == "ok"
        if not result["baseline_ok"]:
            _write_reports(out, result)
            raise UserError(
                f"bench: the baseline failed ({base.get('reason')}); see {out / 'baseline'}"
            )
        device = base.get("device") or "cpu"
        result["device"] = device
        runs, skipped = plan(names, kind, cfg, device)
        result["skipped"] = [{"knob": n, "reason": why} for n, why in skipped]
        counter["n"] += len(runs)
        for n, vals in runs:
            variant(n, n, vals, n, " ".join(as_overrides(vals)))
        if recheck:
            variant("baseline (repeat)", "baseline-repeat", {}, None, "the machine's noise")
        combo = combination(results, min_speedup)
        result["combined_knobs"] = combo
        if len(combo) >= 2:
            vals: dict[str, Any] = {}
            for n in combo:
                vals.update(dict(runs)[n])
            counter["n"] += 1
            r = variant("combined", "combined", vals, None, f"{'+'.join(combo)}")
            r["combined"] = combo
    result["load_end"] = load_average()
    _write_reports(out, result)
    echo("")
    echo(render_markdown(result, image=False))
    echo(f"bench: {out / 'bench.md'}, {out / 'bench.json'}, {out / 'bench.png'}")
    return result


def _merge_repeats(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from repeated runs of a variant: the fastest run's figures."""
    ok = [r for r in runs if r.get("status") == "ok"]
    if not ok:
        return runs[0]
    r = dict(min(ok, key=lambda x: x["step_s"]))
    if len(runs) > 1:
        r["step_s_runs"] = [x["step_s"] for x in ok]
        r["wall_s"] = sum(x.get("wall_s") or 0 for x in runs)
    return r


def rescore(results: list[dict[str, Any]], kind: str, tol: float) -> None:
    """Speedups against the faster baseline run; quality against the first baseline. A knob
    timed by wall clock (`Knob.timing`) is compared with the baselines' wall clock per step."""
    bases = [r for r in results if r["variant"].startswith("baseline") and r.get("status") == "ok"]
    if not bases:
        return
    ref = min(b["step_s"] for b in bases)
    ref_wall = min((b["wall_step_s"] for b in bases if b.get("wall_step_s")), default=None)
    q0 = bases[0].get("quality")
    for r in results:
        if r.get("status") != "ok":
            continue
        knob = KNOBS.get(r.get("knob") or "")
        if knob and knob.timing == "wall" and ref_wall and r.get("wall_step_s"):
            r.update(timing="wall", speedup=ref_wall / r["wall_step_s"])
        else:
            r["speedup"] = ref / r["step_s"]
        q = r.get("quality")
        r["quality_delta"] = None if q is None or q0 is None else q - q0
        r["within_tolerance"] = within_tolerance(kind, q, q0, tol)


def _short(r: dict[str, Any]) -> str:
    if r.get("status") != "ok":
        return f"{r['variant']}: {r.get('status')} ({r.get('reason')})"
    q = r.get("quality")
    if r.get("timing") == "wall":
        return (
            f"{r['variant']}: {r['wall_step_s']:.3f} s/step by wall clock, "
            f"x{r.get('speedup', 1.0):.2f}"
        )
    return (
        f"{r['variant']}: {r['step_s']:.3f} s/step, {r['throughput']:,.1f} {r['unit']}, "
        f"x{r.get('speedup', 1.0):.2f}"
        + (f", {r['quality_name']} {q:.4f}" if q is not None else "")
    )


def _write_reports(out: Path, result: dict[str, Any]) -> None:
    atomic_write_json(out / "bench.json", result)
    atomic_write_text(out / "bench.md", render_markdown(result))
    write_plot(result, out / "bench.png")
