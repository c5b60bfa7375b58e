"""The micro runs of `smollab doctor`: data, pretrain, GRPO full and LoRA, sample, and a probe at
k = 1, 2, each a `python -m smollab` child on the device under test.

Why children and not calls in this process: a check that crashes (a CUDA error poisons the whole
process's context; a segfault ends it) or runs out of memory takes only itself down, a hang is
stopped at its time limit (SIGINT, then SIGKILL: a thread stuck in a kernel cannot be stopped
any other way), and each check runs the real command line a user types. On Linux the checks
fork from one warm start server (`smollab.lab.start`, `start: auto`; the log's `check start:`
line says which and why), so the imports of torch, transformers and peft are paid once, not per
check; elsewhere each pays a fresh interpreter's start, which the stages below partly overlap.

Stages: data; pretrain; then GRPO full, GRPO LoRA and sample side by side (independent, tiny);
then the probe alone, since it measures how runs share the device. GRPO starts from the
pretrained model and sample reads it; when pretraining failed, GRPO starts from a fresh micro
model and sample reads the GRPO run instead, so one failure is reported once, not three times.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from smollab.lab import children as ch
from smollab.lab import start
from smollab.lab.zygote import Zygote
from smollab.rundir.runs import CHILD_LOG, WARM_LOG, RunView

MICRO_DATA = ["data.num_stories=400", "data.vocab_size=256"]  # as the test suite's micro runs
PROMPT = "Once upon a time"
SAMPLES = 2
DEVICE_JSON = "device.json"
Item = dict[str, Any]


class CheckFailed(Exception):
    """The child exited 0 but what it wrote is wrong; the message is the one-line reason."""


@dataclass
class Check:
    name: str
    command: str
    args: list[str]
    out_dir: Path  # the run (or probe) directory; child.log goes here
    verify: Callable[[Check], str]  # the ok line, or raises CheckFailed
    base: str | None = None  # `smollab COMMAND BASE args...`: a recipe, or sample's run directory
    extra: dict[str, Any] = field(default_factory=dict)
    module: str | None = None  # `python -m MODULE args...` instead of `python -m smollab ...`

    def argv(self) -> list[str]:
        if self.module:
            return [sys.executable, "-m", self.module, *self.args]
        return ch.smollab_argv(self.command, self.base, self.args)


# ---- what each check runs ---------------------------------------------------------------------


def device_check(work: Path, device: str) -> Check:
    """The device report (`doctor_device`), in a child like the rest: see its `main`."""
    d = work / "device"
    return Check(
        "device",
        "device",
        [device, str(d / DEVICE_JSON)],
        d,
        _verify_device,
        module="smollab.lab.doctor_device",
    )


def data_check(work: Path) -> Check:
    args = [f"data.dir={work / 'data'}", *MICRO_DATA]
    return Check("data", "data", ["prepare", *args], work / "data-log", _verify_data)


def pretrain_check(work: Path, device: str) -> Check:
    args = [
        "model.preset=micro",
        f"data.dir={work / 'data'}",
        *MICRO_DATA,
        "train.max_steps=12",
        "train.batch_size=8",
        "train.seq_len=64",
        "train.log_interval=2",
        "train.eval_interval=6",
        "train.eval_tokens=1024",
        "train.save_interval=0",
        "optim.warmup_steps=2",
        "optim.lr=1e-2",
        f"perf.device={device}",
        f"run.dir={work / 'pretrain'}",
        "run.resume=never",
    ]
    return Check("pretrain", "pretrain", args, work / "pretrain", _verify_pretrain)


def grpo_check(work: Path, device: str, base_model: Path | None, lora: bool) -> Check:
    """Three GRPO steps of 2 prompts x 4 completions of 12 tokens, rewarded for sentence length
    (a reward with spread, so the advantages and the policy gradient are not all zero)."""
    recipe = work / "grpo.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "reward": [
                    {
                        "name": "sentence_length",
                        "params": {"target": 6, "unit": "words", "mode": "smooth"},
                    }
                ]
            }
        )
    )
    name = "grpo lora" if lora else "grpo full"
    model = f"model.path={base_model}" if base_model else "model.preset=micro"
    args = [
        model,
        f"data.dir={work / 'data'}",
        *MICRO_DATA,
        "train.max_steps=3",
        "train.batch_size=8",
        "grpo.num_generations=4",
        "grpo.max_completion_length=12",
        "train.eval_interval=2",
        "grpo.eval_prompts=4",
        "train.save_interval=0",
        "optim.lr=1e-3",
        f"perf.device={device}",
        f"run.dir={work / name.replace(' ', '-')}",
        "run.resume=never",
    ]
    if lora:
        args.append("model.lora.enabled=true")
    note = "" if base_model else " (from a fresh micro model: pretrain failed)"
    return Check(
        name,
        "grpo",
        args,
        work / name.replace(" ", "-"),
        _verify_grpo,
        base=str(recipe),
        extra={"lora": lora, "note": note},
    )


def sample_check(work: Path, device: str, model_dir: Path) -> Check:
    args = ["--prompt", PROMPT, "--n", str(SAMPLES), "--max-new-tokens", "16", "--device", device]
    return Check("sample", "sample", args, work / "sample", _verify_sample, base=str(model_dir))


def probe_check(work: Path, device: str, timeout: float) -> Check:
    """Two levels, k = 1 and 2, of the micro pretraining workload (no thread splits, no cache:
    the doctor's probe must not become what `concurrency: auto` reads)."""
    recipe = work / "probe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "command": "pretrain",
                "overrides": {
                    "model.preset": "micro",
                    "data.dir": str(work / "data"),
                    "data.num_stories": 400,
                    "data.vocab_size": 256,
                    "train.batch_size": 8,
                    "train.seq_len": 64,
                    "perf.device": device,
                },
                "ks": [1, 2],
                "max_k": 2,
                "warmup": 2,
                "steps": 5,
                "split": False,
                "cache": False,
                "timeout_s": max(10.0, timeout / 3),
                "dir": str(work / "probe"),
            },
            sort_keys=False,
        )
    )
    return Check("probe k=1,2", "probe", [], work / "probe", _verify_probe, base=str(recipe))


# ---- what each check must have written --------------------------------------------------------


def _finished(c: Check) -> tuple[RunView, list[dict]]:
    view = RunView(c.out_dir)
    status = view.status()
    if status != "completed":
        evidence = view.summary().get("evidence")
        raise CheckFailed(
            f"run ended {status or 'without a summary'}" + (f": {evidence}" if evidence else "")
        )
    return view, view.metrics()


def _verify_device(c: Check) -> str:
    try:
        report = json.loads((c.out_dir / DEVICE_JSON).read_text())
    except (OSError, ValueError) as e:
        raise CheckFailed(f"no readable {DEVICE_JSON} ({type(e).__name__})") from None
    if "items" not in report:
        raise CheckFailed(f"{DEVICE_JSON} holds no items: {str(report)[:200]}")
    return f"{len(report['items'])} items"


def _verify_data(c: Check) -> str:
    line = _log_lines(c.out_dir)
    ready = [ln for ln in line if ln.startswith("data ready in")]
    if not ready:
        raise CheckFailed("no 'data ready' line in its output")
    return ready[-1].split(": ", 1)[-1]


def _verify_pretrain(c: Check) -> str:
    view, rows = _finished(c)
    losses = [r["train_loss"] for r in rows if r.get("train_loss") is not None]
    if len(losses) < 2:
        raise CheckFailed(f"only {len(losses)} train_loss value(s) logged")
    if not all(math.isfinite(x) for x in losses):
        raise CheckFailed(f"a train_loss is not finite: {losses}")
    if not losses[-1] < losses[0]:
        raise CheckFailed(f"the loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}")
    s = view.summary()
    val = s.get("final_val_loss")
    return (
        f"{s.get('steps')} steps: loss {losses[0]:.2f} -> {losses[-1]:.2f}"
        + (f", val {val:.2f}" if val is not None else "")
        + f", {s.get('tokens_per_s') or 0:,.0f} tokens/s"
    )


def _verify_grpo(c: Check) -> str:
    view, rows = _finished(c)
    rewards = [r.get("reward_mean") for r in rows]
    if not rewards or any(x is None or not math.isfinite(x) for x in rewards):
        raise CheckFailed(f"rewards missing or not finite: {rewards}")
    s = view.summary()
    total, trainable = s.get("params_total"), s.get("params_trainable")
    if c.extra["lora"] and not (total and trainable and trainable < total):
        raise CheckFailed(f"LoRA trains {trainable} of {total} parameters")
    step_ms = 1000 * sum(r.get("step_s") or 0.0 for r in rows) / len(rows)
    kl = rows[-1].get("kl")
    return (
        f"{len(rows)} steps: reward {rewards[0]:.2f} -> {rewards[-1]:.2f}"
        + (f", kl {kl:.4f}" if kl is not None else "")
        + f", {trainable:,} of {total:,} parameters trained, {step_ms:.0f} ms/step"
        + c.extra["note"]
    )


def _verify_sample(c: Check) -> str:
    texts = [ln for ln in _log_lines(c.out_dir) if ln.startswith(f"[{PROMPT}] ")]
    if len(texts) != SAMPLES:
        raise CheckFailed(f"printed {len(texts)} samples, expected {SAMPLES}")
    new = [t.removeprefix(f"[{PROMPT}] {PROMPT}").strip() for t in texts]
    if not all(new):
        raise CheckFailed("a sample added no text to its prompt")
    return f"{SAMPLES} samples, e.g. {texts[0].split('] ', 1)[1][:60]!r}" + c.extra.get("note", "")


def _verify_probe(c: Check) -> str:
    try:
        result = json.loads((c.out_dir / "probe.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckFailed(f"no readable probe.json ({type(e).__name__})") from None
    levels = {lv["k"]: lv for lv in result.get("levels", [])}
    for k in (1, 2):
        lv = levels.get(k)
        if lv is None or lv.get("error") or not lv.get("steps_per_s"):
            raise CheckFailed(
                f"k={k}: " + (lv.get("error") or "no steps measured" if lv else "not measured")
            )
    one, two = levels[1]["steps_per_s"], levels[2]["steps_per_s"]
    line = f"k=1 {one:.1f} steps/s, k=2 {two:.1f} steps/s together ({two / one:.2f}x)"
    mps = levels[2].get("mps")
    if mps:
        line += f"; MPS clients {mps.get('attached')}/2"
    return line


def _log_lines(d: Path) -> list[str]:
    try:
        return (d / CHILD_LOG).read_text(errors="replace").splitlines()
    except OSError:
        return []


# ---- running a stage ----------------------------------------------------------------------------


def run_stage(
    checks: list[Check],
    timeout: float,
    out: Callable[[str], None],
    parallel: bool = True,
    poll_s: float = 0.2,
    zygote: Zygote | None = None,
) -> list[Item]:
    """Run the checks (side by side, the CPU threads split among them, or one after another),
    each with its own time limit, forked from `zygote` when given; one item per check, ok or
    failed with a one-line reason."""
    if not parallel:
        return [
            it for c in checks for it in run_stage([c], timeout, out, poll_s=poll_s, zygote=zygote)
        ]
    threads = ch.split_threads(ch.cpu_count(), len(checks))
    for c in checks:
        out(f"doctor: running {c.name} ...")
    kids = [
        ch.launch(c.name, c.argv(), c.out_dir, threads=t, zygote=zygote)
        for c, t in zip(checks, threads, strict=True)
    ]
    timed_out: set[int] = set()
    ended: dict[int, float] = {}
    try:
        while len(ended) < len(kids):
            for i, k in enumerate(kids):
                if i in ended:
                    continue
                if k.poll() is None and time.time() - k.started > timeout:
                    timed_out.add(i)
                    ch.stop_all([k], timeout=10)
                if k.poll() is not None:
                    ended[i] = time.time()
            time.sleep(poll_s)
    finally:
        ch.stop_all([k for k in kids if k.poll() is None], timeout=10)
    items = []
    for i, (c, k) in enumerate(zip(checks, kids, strict=True)):
        seconds = ended.get(i, time.time()) - k.started
        if i in timed_out:
            status, detail = (
                "failed",
                f"timed out after {timeout:.0f} s; last output: {ch.last_log_line(c.out_dir)}",
            )
        elif k.proc.returncode != 0:
            status, detail = "failed", f"exit {k.proc.returncode}: {ch.last_log_line(c.out_dir)}"
        else:
            try:
                status, detail = "ok", c.verify(c)
            except CheckFailed as e:
                status, detail = "failed", str(e)
            except Exception as e:  # noqa: BLE001 - a surprise in a check is its finding
                status, detail = "failed", f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        items.append(
            {
                "item": c.name,
                "status": status,
                "detail": detail,
                "seconds": round(seconds, 1),
                "argv": c.argv(),
            }
        )
        out(f"doctor: {c.name}: {status} ({seconds:.0f} s)")
    return items


def run_checks(work: Path, device: str, timeout: float, out: Callable[[str], None]) -> list[Item]:
    """Every micro check, in stages, forked from one warm start server where `start: auto`
    resolves to warm; later checks adapt to earlier failures (see the docstring)."""
    with start.server("auto", work / WARM_LOG, out, what="check") as zygote:
        items = run_stage([data_check(work)], timeout, out, zygote=zygote)
        data_ok = items[-1]["status"] == "ok"
        items += run_stage([pretrain_check(work, device)], timeout, out, zygote=zygote)
        pretrained = work / "pretrain" if items[-1]["status"] == "ok" else None
        stage = [
            grpo_check(work, device, pretrained, lora=False),
            grpo_check(work, device, pretrained, lora=True),
        ]
        if pretrained:
            stage.append(sample_check(work, device, pretrained))
        # children preparing one data directory at once would race: side by side only once it exists
        items += run_stage(stage, timeout, out, parallel=data_ok, zygote=zygote)
        if not pretrained:
            full = work / "grpo-full"
            if items[-2]["status"] == "ok":
                c = sample_check(work, device, full)
                c.extra["note"] = " (from the GRPO run: pretrain failed)"
                items += run_stage([c], timeout, out, zygote=zygote)
            else:
                items.append(
                    {
                        "item": "sample",
                        "status": "failed",
                        "seconds": 0.0,
                        "detail": "no model to sample from: pretrain and grpo full failed",
                    }
                )
        items += run_stage([probe_check(work, device, timeout)], timeout, out, zygote=zygote)
        return items
