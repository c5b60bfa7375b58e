"""`smollab demo`: the whole loop offline in minutes: data -> pretraining -> GRPO -> a report.

Every stage is a shipped recipe (`configs/pretrain/simplestories-1.25m.yaml`,
`configs/grpo/happy.yaml`, package data, so a wheel install has them) loaded through `load_config` with a few keys overridden, and runs
in this process through the same `train()` the `pretrain` and `grpo` commands call. So the
report can print, for each stage, the ordinary command that reproduces it.

Layout of the demo directory (default `demo/`):

    data/                  corpus, tokenizer, token files (reused when already prepared)
    runs/pretrain/         pretraining run directory (resumes; a finished run is reused)
    runs/grpo/             GRPO run directory (same)
    report.md              plots, figures and samples before and after RL
    *.png                  copies of the runs' plots
    summary.json           rewards, diversity and the seconds of every stage (atomic; named
                           like a run's summary)

Running the command again reuses every finished stage and redoes only what is missing.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Any

from smollab.errors import RunFailed, UserError
from smollab.rundir.atomic import atomic_write_json, one_line
from smollab.rundir.runs import FINISHED, REPORT, SUMMARY, RunView
from smollab.rundir.writer import config_changes

PRETRAIN_RECIPE = "pretrain/simplestories-1.25m.yaml"
GRPO_RECIPE = "grpo/happy.yaml"

# The demo's changes to the recipes. Pretraining: 500 steps (the cosine schedule is shortened
# with them); at step 500 of a 1000-step schedule the loss was 0.98 and the happy rate of a
# sample already ~0.3, plenty for GRPO to work from. GRPO: full fine-tuning at 10x the
# recipe's LR, which reaches a reward of ~0.97 within 50 steps (~0.65 s each on 2 CPU cores)
# with diversity intact; the time cap keeps a slow machine inside the demo's budget.
PRETRAIN_OVERRIDES = ["train.max_steps=500", "train.eval_interval=100", "train.save_interval=100"]
GRPO_OVERRIDES = [
    "optim.lr=1e-4",
    "train.max_steps=60",
    "train.eval_interval=10",
    "train.save_interval=20",
    "grpo.eval_prompts=64",
    "train.max_time=300",
]

# --quick: the same path on micro settings (seconds; the figures mean nothing). One thread: on
# a shared 2-core machine two OpenMP threads stall each other at these tiny sizes.
QUICK_PRETRAIN = [
    "perf.threads=1",
    "model.preset=micro",
    "data.num_stories=400",
    "data.vocab_size=256",
    "train.max_steps=20",
    "train.batch_size=4",
    "train.seq_len=32",
    "train.log_interval=5",
    "train.eval_interval=10",
    "train.eval_tokens=512",
    "train.save_interval=10",
    "optim.warmup_steps=2",
    "optim.lr=1e-2",
]
QUICK_GRPO = [
    "perf.threads=1",
    "train.max_steps=4",
    "train.batch_size=8",
    "grpo.num_generations=4",
    "grpo.max_completion_length=12",
    "train.eval_interval=2",
    "grpo.eval_prompts=4",
    "train.save_interval=2",
    "optim.lr=1e-3",
]

SAMPLE_PROMPTS = 4  # held-out prompts shown before and after RL
TAIL_STEPS = 5  # training steps averaged for the final unique fraction

PLOTS = {  # demo file name -> (stage, plot written by plot_run)
    "pretrain_loss.png": ("pretrain", "loss_curves.png"),
    "grpo_reward.png": ("grpo", "reward.png"),
    "grpo_kl.png": ("grpo", "kl.png"),
    "grpo_diversity.png": ("grpo", "diversity.png"),
}


def stage_overrides(out: Path, quick: bool = False) -> dict[str, list[str]]:
    """The dotted overrides each stage applies to its recipe (in precedence order)."""
    data = out / "data"
    pre_dir, grpo_dir = out / "runs" / "pretrain", out / "runs" / "grpo"
    pretrain = [
        f"data.dir={data}",
        *PRETRAIN_OVERRIDES,
        *(QUICK_PRETRAIN if quick else []),
        f"run.dir={pre_dir}",
        "run.resume=auto",
    ]
    grpo = [
        f"model.path={pre_dir}",
        f"data.dir={data}",
        *GRPO_OVERRIDES,
        *(QUICK_GRPO if quick else []),
        f"run.dir={grpo_dir}",
        "run.resume=auto",
    ]
    return {"pretrain": pretrain, "grpo": grpo}


def collapse(overrides: list[str]) -> list[str]:
    """The effective overrides: the last value of each key, in first-seen order; no defaults."""
    last: dict[str, str] = {}
    for o in overrides:
        key = o.split("=", 1)[0]
        last[key] = o
    return [o for o in last.values() if o != "run.resume=auto"]


def build_configs(out: Path, quick: bool = False):
    from smollab.config.load import load_config
    from smollab.config.recipes import recipes_root

    ov = stage_overrides(out, quick)
    # the shipped files themselves, never a same-named file in the working directory
    pre = load_config("pretrain", recipes_root() / PRETRAIN_RECIPE, ov["pretrain"])
    grpo = load_config("grpo", recipes_root() / GRPO_RECIPE, ov["grpo"])
    return pre, grpo


def _earlier_seconds(path: Path) -> dict[str, float]:
    """Seconds of earlier invocations on this directory, from its summary.json, if any."""
    import json

    try:
        prev = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    secs = prev.get("seconds_all_runs") or prev.get("seconds") or {}
    return {k: float(v) for k, v in secs.items() if isinstance(v, int | float)}


def _finished(run_dir: Path) -> bool:
    return RunView(run_dir).status() in FINISHED


def _banner(i: int, name: str, what: str) -> None:
    print(f"\n[{i}/4] {name}: {what}", flush=True)


def run_demo(out: str | Path = "demo", quick: bool = False) -> dict[str, Any]:
    """Run (or finish, or reuse) every stage; write report.md and summary.json; return the summary.
    A stage that raises leaves summary.json `failed` (or `interrupted`) with its evidence."""
    try:
        return _run_demo(Path(out), quick)
    except BaseException as e:
        _record_end(Path(out) / SUMMARY, e)
        raise


def _record_end(path: Path, e: BaseException) -> None:
    """Mark this invocation's summary (status running) failed or interrupted; best effort."""
    import json

    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if summary.get("status") != "running":
        return
    if isinstance(e, KeyboardInterrupt):
        summary.update(status="interrupted", evidence="interrupted")
    else:
        why = e.evidence if isinstance(e, RunFailed) else f"{type(e).__name__}: {one_line(e)}"
        summary.update(status="failed", evidence=why)
    with contextlib.suppress(Exception):
        atomic_write_json(path, summary)


def _refuse_other_demo(out: Path, configs: dict[str, Any]) -> None:
    """A directory that holds a demo of other settings (quick vs full, another smollab version's
    recipe) is never resumed with these: one line naming --dir, before anything is written."""
    from smollab.config.load import to_dict

    for command, cfg in configs.items():
        old = RunView(cfg.run.dir).config()
        changes = config_changes(old, to_dict(cfg), command) if old else []
        if changes:
            raise UserError(
                f"--dir {out} holds a demo with other settings ({changes[0]}); "
                f"give another --dir, or remove {out}"
            )


def _run_demo(out: Path, quick: bool) -> dict[str, Any]:
    pre_cfg, grpo_cfg = build_configs(out, quick)  # a bad recipe stops before any work
    _refuse_other_demo(out, {"pretrain": pre_cfg, "grpo": grpo_cfg})
    out.mkdir(parents=True, exist_ok=True)
    overrides = stage_overrides(out, quick)
    t_total = time.perf_counter()
    seconds: dict[str, float] = {}
    reused: dict[str, bool] = {}
    # Seconds summed over every invocation on this directory (an interrupted demo that is run
    # again, a rerun that reuses everything): the cost of the results, beside this run's own.
    earlier = _earlier_seconds(out / SUMMARY)
    seconds_all: dict[str, float] = {}
    summary: dict[str, Any] = {
        "status": "running",
        "quick": quick,
        "dir": str(out),
        "seconds": seconds,
        "seconds_all_runs": seconds_all,
        "reused": reused,
    }

    def save() -> None:
        seconds.pop("total", None)
        seconds["total"] = round(time.perf_counter() - t_total, 2)
        seconds_all.clear()
        for k in ("data", "pretrain", "grpo", "report", "total"):
            if k in seconds or k in earlier:
                seconds_all[k] = round(earlier.get(k, 0.0) + seconds.get(k, 0.0), 2)
        atomic_write_json(out / SUMMARY, summary)

    # ---- 1. data ----------------------------------------------------------------------------
    _banner(1, "data", f"offline corpus and tokenizer in {pre_cfg.data.dir}")
    t0 = time.perf_counter()
    from smollab.data.prepare import ensure_prepared

    lines: list[str] = []

    def log(msg: str) -> None:
        lines.append(msg)
        print(msg, flush=True)

    meta = ensure_prepared(pre_cfg.data, exact=True, log=log)  # the pretraining data
    reused["data"] = any(m.startswith("data: reusing") for m in lines)
    seconds["data"] = round(time.perf_counter() - t0, 2)
    summary["data"] = {
        "dir": pre_cfg.data.dir,
        "stories": meta["stories"],
        "tokens": meta["tokens"],
        "vocab_size": meta["vocab_size"],
    }
    save()

    # ---- 2. pretraining ---------------------------------------------------------------------
    _banner(
        2,
        "pretrain",
        f"{pre_cfg.model.preset or pre_cfg.model.path}, "
        f"{pre_cfg.train.max_steps} steps of {pre_cfg.train.batch_size} x {pre_cfg.train.seq_len} tokens",
    )
    from smollab.train.pretrain import train as pretrain

    t0 = time.perf_counter()
    reused["pretrain"] = _finished(Path(pre_cfg.run.dir))
    pre = pretrain(pre_cfg)
    seconds["pretrain"] = round(time.perf_counter() - t0, 2)
    summary["pretrain"] = {
        k: pre.get(k)
        for k in (
            "status",
            "steps",
            "tokens",
            "final_train_loss",
            "final_val_loss",
            "tokens_per_s",
            "train_seconds",
            "params_total",
        )
    }
    summary["pretrain"]["run_dir"] = pre_cfg.run.dir
    save()
    if pre.get("status") != "completed":
        why = f"pretraining ended {pre.get('status')} ({pre.get('evidence')})"
        summary.update(status="failed", evidence=why)
        save()
        raise RunFailed(f"{why}; see {RunView(pre_cfg.run.dir).log_path}")

    # ---- 3. GRPO ------------------------------------------------------------------------------
    rewards = ", ".join(r.name for r in grpo_cfg.reward)
    _banner(
        3,
        "grpo",
        f"{rewards}, full FT, lr {grpo_cfg.optim.lr:g}, up to "
        f"{grpo_cfg.train.max_steps} steps of {grpo_cfg.train.batch_size} completions",
    )
    from smollab.train.grpo.run import train as grpo_train

    t0 = time.perf_counter()
    reused["grpo"] = _finished(Path(grpo_cfg.run.dir))
    rl = grpo_train(grpo_cfg)
    seconds["grpo"] = round(time.perf_counter() - t0, 2)
    summary.update(grpo_figures(Path(grpo_cfg.run.dir), rl))
    summary["grpo"]["run_dir"] = grpo_cfg.run.dir
    save()

    # ---- 4. report ----------------------------------------------------------------------------
    _banner(4, "report", f"samples before and after RL, plots, {out / REPORT}")
    t0 = time.perf_counter()
    from smollab.report.demo_report import write_report

    plots = copy_plots(out, Path(pre_cfg.run.dir), Path(grpo_cfg.run.dir))
    samples = samples_before_after(grpo_cfg, Path(pre_cfg.run.dir), Path(grpo_cfg.run.dir))
    summary["plots"] = plots
    summary["samples"] = samples
    grpo_status = summary["grpo"].get("status")
    summary["status"] = "completed" if grpo_status == "completed" else f"grpo {grpo_status}"
    pre_ov, grpo_ov = collapse(overrides["pretrain"]), collapse(overrides["grpo"])
    commands = {
        "data": " ".join(["smollab data prepare", *[o for o in pre_ov if o.startswith("data.")]]),
        "pretrain": " ".join([f"smollab pretrain configs/{PRETRAIN_RECIPE}", *pre_ov]),
        "grpo": " ".join([f"smollab grpo configs/{GRPO_RECIPE}", *grpo_ov]),
    }
    summary["commands"] = commands
    write_report(out / REPORT, summary)
    seconds["report"] = round(time.perf_counter() - t0, 2)
    save()
    write_report(out / REPORT, summary)  # again, now with the report's own seconds
    return summary


def grpo_figures(run_dir: Path, rl: dict[str, Any]) -> dict[str, Any]:
    """The demo's headline figures from the GRPO run directory.

    base_reward / final_reward: mean reward of one completion per held-out prompt before RL and
    at the last evaluation. final_unique_fraction: distinct completions among the last training
    batches (each batch is 16 samples of the same few prompts, the place collapse shows first).
    """
    rows = RunView(run_dir).metrics()
    evals = [r for r in rows if r.get("eval_reward_mean") is not None]
    tail = rows[-TAIL_STEPS:]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {
        "base_reward": rl.get("base_eval_reward"),
        "final_reward": evals[-1]["eval_reward_mean"] if evals else rl.get("final_eval_reward"),
        "final_unique_fraction": mean(
            [r["unique_fraction"] for r in tail if r.get("unique_fraction") is not None]
        ),
        "final_eval_unique_fraction": evals[-1].get("eval_unique_fraction") if evals else None,
        "train_reward_start": rl.get("base_reward"),
        "train_reward_end": rl.get("final_reward"),
        "grpo": {
            "status": rl.get("status"),
            "evidence": rl.get("evidence"),
            "steps": rl.get("steps"),
            "seconds_per_step": rl.get("seconds_per_step"),
            "final_kl": tail[-1].get("kl") if tail else None,
            "eval_steps": [int(r["step"]) for r in evals],
            "eval_rewards": [r["eval_reward_mean"] for r in evals],
        },
    }


def copy_plots(out: Path, pre_dir: Path, grpo_dir: Path) -> list[str]:
    """Copy the runs' plots beside report.md (copies survive moving the demo directory)."""
    from smollab.report.plots import plot_run

    dirs = {"pretrain": pre_dir, "grpo": grpo_dir}
    for d in dirs.values():
        if not RunView(d).plots_dir.is_dir():
            plot_run(d)
    written = []
    for name, (stage, src_name) in PLOTS.items():
        src = RunView(dirs[stage]).plots_dir / src_name
        if src.is_file():
            tmp = out / f".{name}.tmp"
            shutil.copyfile(src, tmp)
            tmp.replace(out / name)
            written.append(name)
    return written


def samples_before_after(cfg, base_dir: Path, rl_dir: Path) -> list[dict[str, Any]]:
    """One completion per held-out prompt from the pretrained and the RL model (same seed)."""
    import torch

    from smollab.config import ModelConfig
    from smollab.device.runtime import pick_device
    from smollab.engine.sampler import Sampler
    from smollab.models.loading import build_model, load_tokenizer_near, resolve_model_dir
    from smollab.rewards.pool import RewardPool
    from smollab.train.prompts import story_prompts

    g = cfg.grpo
    device = pick_device(cfg.perf.device)
    tokenizer = load_tokenizer_near(resolve_model_dir(str(rl_dir)))
    eos = tokenizer.eos_token_id
    prompts = story_prompts(cfg.data.dir, "test", tokenizer, g.prompt_tokens, SAMPLE_PROMPTS)
    prompt_texts = [tokenizer.decode(p, skip_special_tokens=True) for p in prompts]
    out = [{"prompt": t} for t in prompt_texts]
    with RewardPool(cfg.reward) as pool:
        for tag, run_dir in (("before", base_dir), ("after", rl_dir)):
            where = resolve_model_dir(str(run_dir))
            model = build_model(ModelConfig(preset=None, path=str(where))).to(device).eval()
            sampler = Sampler(model, eos_token_id=eos, pad_token_id=eos)
            gen = torch.Generator(device=sampler.device).manual_seed(cfg.run.seed + 1234)
            r = sampler.generate(
                prompts,
                g.max_completion_length,
                temperature=g.temperature,
                top_p=g.top_p,
                top_k=g.top_k,
                generator=gen,
            )
            texts = r.completion_texts(tokenizer)
            total, _ = pool(prompt_texts, texts, r.completion_rows())
            for i, (text, reward) in enumerate(zip(texts, total.tolist(), strict=True)):
                out[i][tag] = text
                out[i][f"{tag}_reward"] = reward
    return out
