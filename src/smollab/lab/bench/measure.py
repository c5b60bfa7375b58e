"""One bench variant: a separate `smollab` child process in its own run directory, and its figures.

The child is launched like a sweep's or a probe's (`smollab.lab.children`): its own session, its
output in child.log, stopped with the parent. Variants run one at a time, so each gets the whole
machine and the workload's own thread setting.

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
import time
from pathlib import Path
from typing import Any

from smollab.errors import UserError
from smollab.lab import children as ch
from smollab.lab.zygote import Zygote
from smollab.rundir.atomic import read_json
from smollab.rundir.runs import CHILD_LOG, RunView

STOP_GRACE_S = 30.0  # a variant stopped by Ctrl-C may save its state this long before SIGKILL


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
    lines = [ln for ln in RunView(run_dir).log_lines() if "runtime: " in ln]
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


def wall_step_s(rows: list[dict[str, Any]], warmup: int) -> float | None:
    """Mean wall-clock seconds per step from the first logged step at or past `warmup` (else the
    first) to the last. Unlike the loop's step time it holds what happens between steps (the
    metrics sync and write, periodic checkpoints), which is what the logging and saving
    intervals change. A row's wall_s is taken before that step's evaluation, so the final
    evaluation stays out."""
    pts = [
        (int(r["step"]), r["wall_s"])
        for r in rows
        if r.get("step") is not None and r.get("wall_s") is not None
    ]
    if len(pts) < 2:
        return None
    start = next((p for p in pts[:-1] if p[0] >= warmup), pts[0])
    return (pts[-1][1] - start[1]) / (pts[-1][0] - start[0])


def measure(run_dir: Path, kind: str, warmup: int) -> dict[str, Any]:
    """A finished variant's figures, from its run directory alone."""
    view = RunView(run_dir)
    rows = view.metrics()
    cfg = read_json(view.config_path)  # a missing config is an error, not an empty one
    summary = view.summary()
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
        "wall_step_s": wall_step_s(rows, warmup),
        "peak_mem_mb": max(
            (r["peak_mem_mb"] for r in rows if r.get("peak_mem_mb") is not None), default=None
        ),
        "device": str(summary.get("device", "")).split(":")[0] or None,
        "run_status": summary.get("status"),
        "runtime_skipped": runtime_skipped(run_dir),
    }
    if kind in ("pretrain", "sft"):
        tokens = tc["batch_size"] * tc["seq_len"] * tc["grad_accum"]
        if kind == "sft" and rows and rows[-1].get("tokens"):  # rows vary in length: measured
            tokens = rows[-1]["tokens"] / rows[-1]["step"]
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
    if kind in ("pretrain", "sft"):
        return abs(value - base) <= tol * abs(base)
    return abs(value - base) <= tol


def _tail(run_dir: Path, n: int = 3) -> str:
    """The child's last printed lines (child.log without its launch lines)."""
    try:
        text = (run_dir / CHILD_LOG).read_text(errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("$ ")]
    return " | ".join(lines[-n:])


def _wait(child: ch.Child, timeout: float | None) -> int | None:
    """The child's exit code; None when it ran past `timeout` (then it is killed)."""
    try:
        rc = child.wait(timeout)
    except BaseException:  # Ctrl-C reaches only the parent: the child has its own session
        ch.stop_all([child], timeout=STOP_GRACE_S)
        raise
    if rc is None:
        ch.stop_all([child], kill_now=True, timeout=10.0)
    return rc


def run_variant(
    name: str,
    argv: list[str],
    run_dir: Path,
    kind: str,
    warmup: int,
    timeout: float | None,
    values: dict[str, Any] | None = None,
    zygote: Zygote | None = None,
) -> dict[str, Any]:
    """Run one variant to its end (forked from `zygote`, the bench's warm start server, when
    given) and read its figures; its wall time runs from launch to exit."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    res: dict[str, Any] = {
        "variant": name,
        "values": values or {},
        "run_dir": str(run_dir),
        "load": (load_average() or [None])[0],
        "command": argv[2:],
    }
    t0 = time.perf_counter()
    rc = _wait(ch.launch(name, argv, run_dir, env=env, zygote=zygote), timeout)
    res["wall_s"] = time.perf_counter() - t0
    if rc != 0:
        why = f"timed out after {timeout:g}s" if rc is None else f"exit {rc}"
        res.update(status="failed", reason=f"{why}: {_tail(run_dir)}")
        return res
    try:
        res.update(measure(run_dir, kind, warmup), status="ok")
    except (ValueError, KeyError, UserError) as e:
        res.update(status="failed", reason=f"unreadable results: {e}")
    return res


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
