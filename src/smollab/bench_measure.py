"""One bench variant: a separate `smollab` child process in its own run directory, and its figures.

Every variant's figures come from its run directory (metrics.csv, config.json, summary.json,
training.log): the median step time over the steady-state steps (the first `warmup` steps, which
hold compilation and allocator warm-up, are excluded; the first step is reported on its own),
tokens/s (pretrain) or completions/s (GRPO), peak memory (CUDA: max allocated; CPU: peak RSS of
the process), the speedup against the baseline, and whether the result stayed within a tolerance
of the baseline's (pretrain: final validation loss, relative; GRPO: mean reward over the steps,
absolute; the variants see the same seeded prompts and batches).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from smollab.errors import UserError


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


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
