"""`smollab bench WORKLOAD`: each performance knob switched on alone, measured on the user's workload.

The speed guides promise speedups; this measures them. A workload (a pretrain or grpo recipe plus
overrides) runs briefly at a baseline with every benched knob off, then once per knob with that
knob on, then at the baseline again (the repeat shows the noise of the machine; speedups are
against the faster of the two), then with all the knobs that helped together. Each variant is a separate `smollab` child process with
its own run directory under the bench directory, so compile caches, thread settings and allocator
state never leak from one variant into the next.

Every variant's figures come from its run directory (metrics.csv, config.json, summary.json,
training.log): the median step time over the steady-state steps (the first `warmup` steps, which
hold compilation and allocator warm-up, are excluded; the first step is reported on its own),
tokens/s (pretrain) or completions/s (GRPO), peak memory (CUDA: max allocated; CPU: peak RSS of
the process), the speedup against the baseline, and whether the result stayed within a tolerance
of the baseline's (pretrain: final validation loss, relative; GRPO: mean reward over the steps,
absolute; the variants see the same seeded prompts and batches).

A knob that cannot apply is listed as skipped with the reason, never run and reported as if it
worked: CUDA-only knobs off CUDA, a knob the loop does not read (checked against the loop's own
source, so the rule follows the code), and anything the runtime itself reported as skipped in
the variant's training.log.

This module imports no torch: the parent only launches children and reads files.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from smollab.errors import UserError

DEFAULT_STEPS = {"pretrain": 30, "grpo": 20}
DEFAULT_TOLERANCE = {"pretrain": 0.02, "grpo": 0.05}  # relative loss / absolute reward


@dataclass(frozen=True)
class Knob:
    name: str
    what: str
    off: dict[str, Any] = field(default_factory=dict)  # forced on the baseline when benched
    on: dict[str, Any] = field(default_factory=dict)
    kinds: tuple[str, ...] = ("pretrain", "grpo")
    group: str | None = None  # alternatives: only the best of a group joins the combination
    reads: str | None = None  # the loop source must contain this for the knob to do anything
    cuda_only: str | None = None  # reason, when the knob only means something on CUDA
    runtime_word: str | None = None  # how the runtime names it in its `skipped` list


KNOBS: dict[str, Knob] = {k.name: k for k in [
    Knob("bf16", "bf16 autocast", {"perf.precision": "fp32"}, {"perf.precision": "bf16"},
         group="precision"),
    Knob("fp16", "fp16 autocast + GradScaler", {"perf.precision": "fp32"},
         {"perf.precision": "fp16"}, group="precision"),
    Knob("tf32", "TF32 matmuls", {"perf.tf32": False}, {"perf.tf32": True},
         cuda_only="TF32 is a CUDA (Ampere+) matmul mode", runtime_word="tf32"),
    Knob("compile", "torch.compile", {"perf.compile": False}, {"perf.compile": True},
         reads="maybe_compile(", runtime_word="compile"),
    Knob("fused", "fused AdamW (vs plain)", {"perf.optimizer_impl": "plain"},
         {"perf.optimizer_impl": "fused"}, group="optimizer", runtime_word="fused"),
    Knob("foreach", "foreach AdamW (vs plain)", {"perf.optimizer_impl": "plain"},
         {"perf.optimizer_impl": "foreach"}, group="optimizer"),
    Knob("grad_ckpt", "gradient checkpointing", {"perf.grad_checkpointing": False},
         {"perf.grad_checkpointing": True}),
    Knob("grad_accum", "2x accumulation of half batches (same tokens/step)", reads="grad_accum"),
    Knob("workers", "data loader workers (2)", {"perf.num_workers": 0}, {"perf.num_workers": 2},
         reads="num_workers"),
    Knob("pin_memory", "pinned host memory", {"perf.pin_memory": False}, {"perf.pin_memory": True},
         reads="pin_memory", cuda_only="pinned memory only speeds up host-to-CUDA copies",
         runtime_word="pin_memory"),
    Knob("sdpa", "SDPA attention (vs eager)", {"perf.attn_implementation": "eager"},
         {"perf.attn_implementation": "sdpa"}),
    Knob("completion_len", "grpo.max_completion_length halved", kinds=("grpo",)),
    Knob("reward_workers", "reward worker processes (2)", {"grpo.reward_workers": 0},
         {"grpo.reward_workers": 2}, kinds=("grpo",)),
]}  # fmt: skip


# ---- planning (pure) ----------------------------------------------------------------------------


def guess_kind(path: str | Path, overrides: list[str]) -> str:
    from smollab.config import read_yaml

    if "grpo" in read_yaml(path) or any(o.startswith(("grpo.", "reward")) for o in overrides):
        return "grpo"
    return "pretrain"


def loop_source(kind: str) -> str:
    """The training loop's source text (read, not imported: no torch in the parent)."""
    spec = find_spec(f"smollab.train.{kind}")
    return Path(spec.origin).read_text() if spec and spec.origin else ""


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return "null" if v is None else str(v)


def as_overrides(d: dict[str, Any]) -> list[str]:
    return [f"{k}={_fmt(v)}" for k, v in d.items()]


def knob_values(knob: Knob, cfg) -> tuple[dict[str, Any], dict[str, Any]]:
    """(baseline values, switched-on values) for one knob on this config; ValueError = skip."""
    if knob.name == "grad_accum":
        b, a = cfg.train.batch_size, cfg.train.grad_accum
        if b < 2 or b % 2:
            raise ValueError(f"train.batch_size={b} cannot be halved")
        return {}, {"train.batch_size": b // 2, "train.grad_accum": 2 * a}
    if knob.name == "completion_len":
        n = cfg.grpo.max_completion_length
        if n < 2:
            raise ValueError(f"grpo.max_completion_length={n} cannot be halved")
        return {}, {"grpo.max_completion_length": n // 2}
    return dict(knob.off), dict(knob.on)


def select(names: list[str] | None, kind: str) -> list[str]:
    if names is None:
        return [n for n, k in KNOBS.items() if kind in k.kinds]
    unknown = [n for n in names if n not in KNOBS]
    if unknown:
        raise UserError(f"--knobs: unknown {', '.join(unknown)} (known: {', '.join(KNOBS)})")
    return list(dict.fromkeys(names))


def baseline_values(names: list[str], kind: str, cfg) -> dict[str, Any]:
    """Every benched knob off (values of knobs that later turn out skipped are harmless)."""
    out: dict[str, Any] = {}
    for n in names:
        k = KNOBS[n]
        if kind in k.kinds:
            with contextlib.suppress(ValueError):
                out.update(knob_values(k, cfg)[0])
    return out


def plan(names: list[str], kind: str, cfg, device: str, source: str | None = None
         ) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, str]]]:  # fmt: skip
    """([(knob, switched-on values)], [(knob, reason skipped)]) on `device` (cpu, cuda, mps)."""
    source = loop_source(kind) if source is None else source
    runs, skipped = [], []
    for n in names:
        k = KNOBS[n]
        if kind not in k.kinds:
            skipped.append((n, f"applies to {' and '.join(k.kinds)} workloads only"))
        elif k.cuda_only and device != "cuda":
            skipped.append((n, f"{k.cuda_only}; device is {device}"))
        elif k.reads and k.reads not in source:
            skipped.append((n, f"the {kind} loop (smollab.train.{kind}) does not use it"
                            f"{_NOT_READ.get((n, kind), '')}"))  # fmt: skip
        elif n in ("compile", "fused") and device == "mps":
            skipped.append((n, "not supported on MPS"))
        else:
            try:
                runs.append((n, knob_values(k, cfg)[1]))
            except ValueError as e:
                skipped.append((n, str(e)))
    return runs, skipped


_NOT_READ = {
    ("workers", "pretrain"): ": it slices batches from a memmap in-process, no DataLoader",
    ("pin_memory", "pretrain"): ": it slices batches from a memmap in-process, no DataLoader",
    ("compile", "grpo"): ": perf.compile is ignored there",
    ("grad_accum", "grpo"): ": one optimizer step per generated batch",
    ("workers", "grpo"): ": prompts are token lists in memory, no DataLoader",
    ("pin_memory", "grpo"): ": no DataLoader",
}


def combination(results: list[dict[str, Any]], min_speedup: float) -> list[str]:
    """The knobs that helped (fast enough and within tolerance), best of each group only."""
    helped = [r for r in results if r.get("status") == "ok" and r.get("knob")
              and (r.get("speedup") or 0) >= min_speedup and r.get("within_tolerance")]  # fmt: skip
    best: dict[str, dict[str, Any]] = {}
    for r in helped:
        g = KNOBS[r["knob"]].group or r["knob"]
        if g not in best or r["speedup"] > best[g]["speedup"]:
            best[g] = r
    return [r["knob"] for r in sorted(best.values(), key=lambda r: -r["speedup"])]


# ---- measuring ---------------------------------------------------------------------------------


def _split_top(text: str, sep: str = "; ") -> list[str]:
    """Split on `sep` outside parentheses ("tf32 (CUDA only; cpu ...); pin_memory (...)")."""
    parts, depth, cur, i = [], 0, "", 0
    while i < len(text):
        c = text[i]
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and text.startswith(sep, i):
            parts.append(cur)
            cur, i = "", i + len(sep)
            continue
        cur += c
        i += 1
    if cur:
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def runtime_skipped(run_dir: Path) -> list[str]:
    """The `skipped:` items of the last runtime line of training.log."""
    log = run_dir / "training.log"
    if not log.exists():
        return []
    lines = [ln for ln in log.read_text().splitlines() if "runtime: " in ln]
    if not lines or "; skipped: " not in lines[-1]:
        return []
    return _split_top(lines[-1].split("; skipped: ", 1)[1])


def step_times(rows: list[dict[str, Any]], kind: str) -> list[tuple[int, float]]:
    """(step, seconds) per logged step: GRPO logs step_s; pretraining a cumulative train_s."""
    out, prev_step, prev_t = [], 0, 0.0
    for r in rows:
        if r.get("step") is None:
            continue
        step = int(r["step"])
        if kind == "grpo":
            if r.get("step_s") is not None:
                out.append((step, r["step_s"]))
        elif r.get("train_s") is not None and step > prev_step:
            out.append((step, (r["train_s"] - prev_t) / (step - prev_step)))
            prev_step, prev_t = step, r["train_s"]
    return out


def measure(run_dir: Path, kind: str, warmup: int) -> dict[str, Any]:
    """A finished variant's figures, from its run directory alone."""
    from smollab.runs import read_json, read_metrics

    rows = read_metrics(run_dir / "metrics.csv")
    cfg = read_json(run_dir / "config.json")
    summary = read_json(run_dir / "summary.json") if (run_dir / "summary.json").exists() else {}
    times = step_times(rows, kind)
    if not times:
        raise ValueError("no step was logged")
    steady = [t for s, t in times if s > warmup] or [t for _, t in times[1:]] or [times[0][1]]
    step_s = statistics.median(steady)
    tc = cfg["train"]
    out: dict[str, Any] = {
        "steps": int(times[-1][0]),
        "step_s": step_s,
        "first_step_s": times[0][1],
        "steady_steps": len(steady),
        "peak_mem_mb": max(
            (r["peak_mem_mb"] for r in rows if r.get("peak_mem_mb") is not None), default=None
        ),  # fmt: skip
        "device": str(summary.get("device", "")).split(":")[0] or None,
        "run_status": summary.get("status"),
        "runtime_skipped": runtime_skipped(run_dir),
    }
    if kind == "pretrain":
        tokens = tc["batch_size"] * tc["seq_len"] * tc["grad_accum"]
        out.update(throughput=tokens / step_s, unit="tok/s", tokens_per_step=tokens)
        vals = [r["val_loss"] for r in rows if r.get("val_loss") is not None]
        losses = [r["train_loss"] for r in rows if r.get("train_loss") is not None]
        if vals:
            out.update(quality=vals[-1], quality_name="val loss")
        elif losses:
            out.update(quality=statistics.mean(losses[-5:]), quality_name="train loss")
    else:
        out.update(throughput=tc["batch_size"] / step_s, unit="compl/s")
        lens = [r["completion_len"] for r in rows if r.get("completion_len") is not None]
        if lens:
            out["gen_tokens_per_s"] = statistics.mean(lens) * tc["batch_size"] / step_s
        rewards = [r["reward_mean"] for r in rows if r.get("reward_mean") is not None]
        if rewards:
            out.update(quality=statistics.mean(rewards), quality_name="mean reward")
    return out


def within_tolerance(kind: str, value: float | None, base: float | None, tol: float) -> bool | None:
    if value is None or base is None:
        return None
    if kind == "pretrain":
        return abs(value - base) <= tol * abs(base)
    return abs(value - base) <= tol


def _tail(path: Path, n: int = 3) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def run_variant(name: str, cmd: list[str], run_dir: Path, kind: str, warmup: int,
                timeout: float | None, values: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    res: dict[str, Any] = {"variant": name, "values": values or {}, "run_dir": str(run_dir),
                           "load": (_load() or [None])[0],
                           "command": cmd[2:]}  # fmt: skip
    t0 = time.perf_counter()
    with open(run_dir / "stdout.log", "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                timeout=timeout).returncode  # fmt: skip
        except subprocess.TimeoutExpired:
            rc = None
    res["wall_s"] = time.perf_counter() - t0
    if rc != 0:
        why = f"timed out after {timeout:g}s" if rc is None else f"exit {rc}"
        res.update(status="failed", reason=f"{why}: {_tail(run_dir / 'stdout.log')}")
        return res
    try:
        res.update(measure(run_dir, kind, warmup), status="ok")
    except (ValueError, KeyError, UserError) as e:
        res.update(status="failed", reason=f"unreadable results: {e}")
    return res


# ---- the bench ---------------------------------------------------------------------------------


def run_bench(workload: str, overrides: list[str], knobs: list[str] | None = None,
              steps: int | None = None, out: str | Path | None = None, kind: str | None = None,
              tolerance: float | None = None, min_speedup: float = 1.03,
              timeout: float | None = None, recheck: bool = True, repeat: int = 1,
              echo=print) -> dict[str, Any]:  # fmt: skip
    """Run the bench; write bench.json, bench.md and bench.png into `out`; return the result.

    Order: baseline, each knob alone, the baseline again (`recheck`), then the knobs that helped
    together. Speedups are against the faster baseline run, and `repeat` runs every variant that
    many times and keeps the fastest: on a shared machine other work only ever adds time, so the
    fastest run is the best estimate of a variant's own cost, and the two baselines'
    disagreement shows how much noise there was. Each result records the load average at its
    start.
    """
    from smollab.config import load_config

    kind = kind or guess_kind(workload, overrides)
    cfg = load_config(kind, workload, overrides)  # bad workloads stop here, before any run
    names = select(knobs, kind)
    steps = steps or DEFAULT_STEPS[kind]
    if steps < 3:
        raise UserError("--steps must be at least 3 (warm-up steps are excluded from timing)")
    if repeat < 1:
        raise UserError("--repeat must be at least 1")
    warmup = max(1, min(5, steps // 5))
    tol = DEFAULT_TOLERANCE[kind] if tolerance is None else tolerance
    out = Path(out) if out else Path("runs") / "bench" / f"{kind}-{Path(workload).stem}"
    out.mkdir(parents=True, exist_ok=True)
    if kind == "pretrain":  # prepare data once, outside every variant's wall time
        from smollab.data.prepare import prepare

        prepare(cfg.data, log=lambda _: None)

    forced = [f"train.max_steps={steps}", "train.log_interval=1", f"train.eval_interval={steps}",
              f"train.save_interval={steps + 1}", "train.max_time=null", "train.max_tokens=null",
              "run.resume=never"]  # fmt: skip
    if kind == "grpo":
        forced.append("failure.action=flag")  # every variant runs all its steps
    base_vals = baseline_values(names, kind, cfg)
    base_ov = as_overrides(base_vals)

    def command(vals: dict[str, Any], run_dir: Path) -> list[str]:
        return [sys.executable, "-m", "smollab", kind, str(workload), *overrides, *base_ov,
                *as_overrides(vals), *forced, f"run.dir={run_dir}"]  # fmt: skip

    result: dict[str, Any] = {
        "workload": str(workload), "kind": kind, "overrides": overrides, "steps": steps,
        "warmup_steps": warmup, "repeat": repeat, "tolerance": tol, "min_speedup": min_speedup,
        "baseline_values": base_vals, "knobs": names, "results": [], "skipped": [],
        "load_start": _load(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }  # fmt: skip
    results: list[dict[str, Any]] = result["results"]
    counter = {"i": 0, "n": 1 + int(recheck)}

    def variant(name: str, dirname: str, vals: dict[str, Any], knob: str | None, what: str):
        counter["i"] += 1
        echo(f"[{counter['i']}/{counter['n']}] {name}: {what}")
        runs = [run_variant(name, command(vals, out / d), out / d, kind, warmup, timeout, vals)
                for d in [dirname] + [f"{dirname}.r{k}" for k in range(2, repeat + 1)]]  # fmt: skip
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

    from smollab.runs import atomic_write_json

    echo(f"bench {workload} ({kind}): {len(names)} knobs, {steps} steps per run -> {out}")
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
    result["load_end"] = _load()
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
    """Speedups against the faster baseline run; quality against the first baseline."""
    bases = [r for r in results if r["variant"].startswith("baseline") and r.get("status") == "ok"]
    if not bases:
        return
    ref = min(b["step_s"] for b in bases)
    q0 = bases[0].get("quality")
    for r in results:
        if r.get("status") != "ok":
            continue
        r["speedup"] = ref / r["step_s"]
        q = r.get("quality")
        r["quality_delta"] = None if q is None or q0 is None else q - q0
        r["within_tolerance"] = within_tolerance(kind, q, q0, tol)


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _short(r: dict[str, Any]) -> str:
    if r.get("status") != "ok":
        return f"{r['variant']}: {r.get('status')} ({r.get('reason')})"
    q = r.get("quality")
    return (
        f"{r['variant']}: {r['step_s']:.3f} s/step, {r['throughput']:,.1f} {r['unit']}, "
        f"x{r.get('speedup', 1.0):.2f}"
        + (f", {r['quality_name']} {q:.4f}" if q is not None else "")
    )


def _write_reports(out: Path, result: dict[str, Any]) -> None:
    from smollab.runs import atomic_write_json, atomic_write_text

    atomic_write_json(out / "bench.json", result)
    atomic_write_text(out / "bench.md", render_markdown(result))
    write_plot(result, out / "bench.png")


# ---- reports -----------------------------------------------------------------------------------


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
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(
        "---" if h in ("variant", "changes") else "---:" for h in head) + "|"]  # fmt: skip
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
                _n(r.get("step_s"), ".3f"),
                _n(r.get("first_step_s"), ".2f"),
                _n(r.get("throughput"), ",.1f"),
            ]
            if grpo:
                cells.append(_n(r.get("gen_tokens_per_s"), ",.0f"))
            cells += [_n(r.get("speedup"), ".2f") + "x", _n(r.get("peak_mem_mb"), ",.0f"),
                      _n(r.get("quality"), ".4f"), _n(r.get("quality_delta"), "+.4f"),
                      "" if tol is None else ("yes" if tol else "**no**"),
                      _n(r.get("wall_s"), ".0f"), _n(r.get("load"), ".1f")]  # fmt: skip
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def _rep(result: dict[str, Any]) -> str:
    n = result.get("repeat") or 1
    return f", the fastest of {n} runs per variant" if n > 1 else ""


def render_markdown(result: dict[str, Any], image: bool = True) -> str:
    kind = result.get("kind")
    tol = result.get("tolerance")
    tol_text = (f"final validation loss within {100 * tol:g}% of the baseline's" if kind == "pretrain"
                else f"mean training reward within {tol:g} of the baseline's")  # fmt: skip
    base_vals = " ".join(as_overrides(result.get("baseline_values") or {})) or "(none)"
    lines = [
        f"# smollab bench: `{result.get('workload')}` ({kind})", "",
        f"Device {result.get('device', '?')}; {result.get('steps')} optimizer steps per variant, "
        f"each a separate `smollab {kind}` process; step time is the median over steps "
        f"{result.get('warmup_steps', 0) + 1}..{result.get('steps')} (steps up to "
        f"{result.get('warmup_steps')} are warm-up; the first step is shown on its own: it holds "
        f"compilation){_rep(result)}. Within tolerance: {tol_text}. Peak memory: max allocated on CUDA, peak "
        f"RSS of the process on CPU. Load average at start {result.get('load_start')}, at end "
        f"{result.get('load_end')}.", "",
        f"Workload overrides: `{' '.join(result.get('overrides') or []) or '(none)'}`; baseline "
        f"(every benched knob off): `{base_vals}`.", "",
        table_markdown(result), "",
    ]  # fmt: skip
    res = {r["variant"]: r for r in result.get("results", [])}
    base, rep = res.get("baseline"), res.get("baseline (repeat)")
    if base and rep and base.get("status") == rep.get("status") == "ok":
        diff = abs(base["step_s"] - rep["step_s"]) / min(base["step_s"], rep["step_s"])
        lines += [f"Noise: the baseline, run again after the knobs, took {rep['step_s']:.3f} s "
                  f"per step against {base['step_s']:.3f} s the first time ({100 * diff:.0f}% "
                  "apart). Speedups are against the faster of the two; the load column shows "
                  "what else the machine was doing when each run started.", ""]  # fmt: skip
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
    skipped += [(r["variant"], r["reason"]) for r in result.get("results", [])
                if r.get("status") == "skipped"]  # fmt: skip
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
    from smollab.report.plots import _plt, _save

    plt = _plt()
    names = [r["variant"] for r in rows][::-1]
    speed = [r.get("speedup") or 0.0 for r in rows][::-1]
    mem = [r.get("peak_mem_mb") or 0.0 for r in rows][::-1]
    colors = ["tab:green" if r.get("within_tolerance") else "tab:orange" if
              r.get("within_tolerance") is False else "tab:gray" for r in rows][::-1]  # fmt: skip
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
    fig.suptitle(f"smollab bench: {Path(str(result.get('workload'))).name} ({result.get('kind')}, "
                 f"{result.get('device', '?')}); orange = outside tolerance")  # fmt: skip
    _save(fig, path)
    plt.close(fig)
    return path
