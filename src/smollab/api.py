"""smollab from Python: every command as a function that returns what the command reports.

The CLI parses its arguments and calls these same functions, so a script and a shell run the
same code. Each training-style function takes a recipe (a shipped name such as `"happy"`, a path,
or a config object from `load_config`), then `args`, `key=value` strings exactly as on the command
line, then Python values by dotted key:

    import smollab
    smollab.grpo("happy", **{"optim.lr": 1e-4, "model.path": "runs/simplestories-1.25m"})

Bad input raises `smollab.errors.UserError` (one line) before any work starts. Heavy modules
(torch, transformers) are imported inside the functions: `import smollab` stays cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from smollab.errors import UserError

if TYPE_CHECKING:
    from smollab.config import Section

__all__ = [
    "bench",
    "data_prepare",
    "demo",
    "doctor",
    "grpo",
    "lanes",
    "load_config",
    "pretrain",
    "probe",
    "recipes",
    "report",
    "rft",
    "sample",
    "sft",
    "sweep",
]


def _as_args(values: dict[str, Any]) -> list[str]:
    """Python values as `key=value` strings, for the specs (sweep, probe) that pass them on to
    their children's command lines; written so that the child's parser reads them back exactly."""
    from smollab.lab.spec_common import override_value

    return [f"{k}={override_value(v)}" for k, v in values.items()]


def load_config(
    command: str,
    recipe: str | Path | Section | None = None,
    args: Sequence[str] = (),
    **values: Any,
) -> Section:
    """The validated config of `command` ("pretrain", "grpo", "sft", "rft", "data"): recipe < args <
    values."""
    from smollab.config.load import load_config as load
    from smollab.config.registry import SCHEMAS

    if command not in SCHEMAS:
        raise UserError(f"command {command!r}: one of {', '.join(sorted(SCHEMAS))}")
    return load(command, recipe, list(args), values)


# each training command's loop: a module with `train(cfg) -> summary`
_LOOPS = {
    "pretrain": "smollab.train.pretrain",
    "grpo": "smollab.train.grpo.run",
    "sft": "smollab.train.sft",
    "rft": "smollab.train.rft",
}


def _train(command: str, recipe: Any, args: Sequence[str], values: dict[str, Any]) -> dict:
    import importlib

    cfg = load_config(command, recipe, args, **values)
    _check_inputs(cfg)
    return importlib.import_module(_LOOPS[command]).train(cfg)


def _check_inputs(cfg: Any) -> None:
    """The prompts files and the model a run reads, looked at before its loop is imported (torch
    alone takes 2 s or more): a missing one answers in the time the config takes. Each loop
    checks them again, for a caller of its `train` alone."""
    from smollab.data.prompt_rows import check_prompt_files
    from smollab.models.loading import check_model_source

    for name in ("grpo", "rft"):
        if (section := getattr(cfg, name, None)) is not None:
            check_prompt_files(section, name, cfg.data.prompt_field)
    if cfg.model.path:
        check_model_source(cfg.model)


def pretrain(
    recipe: str | Path | Section | None = None, args: Sequence[str] = (), **values: Any
) -> dict[str, Any]:
    """Pretrain (or resume, or reuse the finished) run; returns its summary (summary.json)."""
    return _train("pretrain", recipe, args, values)


def grpo(
    recipe: str | Path | Section | None = None, args: Sequence[str] = (), **values: Any
) -> dict[str, Any]:
    """GRPO fine-tuning; returns the run's summary (summary.json)."""
    return _train("grpo", recipe, args, values)


def lanes(
    recipe: str | Path | Section | None = None,
    args: Sequence[str] = (),
    lanes: Sequence[Sequence[str] | dict[str, Any]] = (),
    *,
    inbox: str | Path | None = None,
    max_lanes: int | None = None,
    threads: int | None = None,
) -> list[dict[str, Any]]:
    """GRPO configurations (LoRA or full) trained as lanes of one batched model, one lane per entry of
    `lanes` (its overrides, `key=value` strings or a dict of dotted keys, over recipe + args);
    with `inbox`, a sweep's lanes worker (rundir/inbox.py). `threads`: perf.threads of every
    lane, the posted ones too. Returns each lane's summary."""
    if inbox is not None and not lanes and (recipe or args):
        raise UserError(
            "lanes: a worker (--inbox) takes each trial's config from its inbox; give "
            "CONFIG and overrides with --lane, or neither"
        )
    if inbox is not None and not max_lanes:
        raise UserError(
            "lanes: --max-lanes N is required with --inbox (the lanes it trains at once)"
        )
    args = [*args, *([f"perf.threads={threads}"] if threads else [])]
    cfgs = []
    for extra in lanes:
        if isinstance(extra, dict):
            cfgs.append(load_config("grpo", recipe, args, **extra))
        else:
            cfgs.append(load_config("grpo", recipe, [*args, *extra]))
    if not cfgs and inbox is None:
        raise UserError("lanes: give at least one lane (--lane) or an --inbox")
    for cfg in cfgs:
        _check_inputs(cfg)
    from smollab.train.grpo.lanes import train_lanes

    return train_lanes(cfgs, inbox=inbox, max_lanes=max_lanes, threads=threads)


def sft(
    recipe: str | Path | Section | None = None, args: Sequence[str] = (), **values: Any
) -> dict[str, Any]:
    """Supervised fine-tuning (full or LoRA) on prompt/completion records; returns the run's
    summary (summary.json)."""
    return _train("sft", recipe, args, values)


def rft(
    recipe: str | Path | Section | None = None, args: Sequence[str] = (), **values: Any
) -> dict[str, Any]:
    """Rejection-sampling fine-tuning: rounds of sampling, scoring with the rewards, keeping the
    best and SFT on them, with held-out accuracy per round; returns the run's summary."""
    return _train("rft", recipe, args, values)


def data_prepare(
    recipe: str | Path | Section | None = None, args: Sequence[str] = (), **values: Any
) -> dict[str, Any]:
    """Corpus, tokenizer and token files in data.dir (reused when prepared); returns their meta
    (meta.json) with the directory under "dir"."""
    from smollab.data.prepare import prepare

    cfg = load_config("data", recipe, args, **values)
    return {**prepare(cfg.data), "dir": cfg.data.dir}


def sample(
    path: str | Path,
    prompts: str | Sequence[str],
    *,
    n: int = 1,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    device: str = "auto",
    mode: str | None = None,
    forget_scale: float | None = None,
) -> list[dict[str, str]]:
    """Generate from a run or checkpoint directory: `n` samples per prompt, each
    {"prompt", "text"} (the text starts with its prompt). `mode` (both, retain_only,
    forget_only) picks a gradient-routing run's adapters; `forget_scale` in [0, 1] samples
    both with the forget adapter scaled (0: retain_only, 1: both)."""
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    if not prompts:
        raise UserError("sample: give at least one prompt")
    if n < 1 or max_new_tokens < 1:
        raise UserError("--n and --max-new-tokens must be at least 1")
    if temperature < 0 or not 0 < top_p <= 1:
        raise UserError("--temperature must be >= 0 and --top-p in (0, 1]")
    from smollab.models.loading import resolve_model_dir

    resolve_model_dir(str(path))  # a missing one answers before torch is imported
    from smollab.engine.sample_texts import sample_texts

    pairs = sample_texts(
        str(path),
        prompts,
        n=n,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        device=device,
        mode=mode,
        forget_scale=forget_scale,
    )
    return [{"prompt": p, "text": t} for p, t in pairs]


def wordle_games(
    path: str | Path,
    games: int,
    *,
    max_turns: int = 6,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_new_tokens: int = 64,
    seed: int = 0,
    device: str = "auto",
    mode: str | None = None,
    out: str | Path | None = None,
) -> dict[str, Any]:
    """Play `games` whole Wordle games with the model of a run or checkpoint directory (greedy
    at temperature 0); writes wordle_games.json beside it (or `out`) and returns the report:
    games, solved, turns, solve_rate, mean_guesses, invalid_rate, format_error_rate, ...."""
    if games < 1 or max_turns < 1 or max_new_tokens < 1:
        raise UserError("--wordle-games, --max-turns and --max-new-tokens must be at least 1")
    if temperature < 0 or not 0 < top_p <= 1:
        raise UserError("--temperature must be >= 0 and --top-p in (0, 1]")
    if out is not None or Path(path).is_dir():  # else the report has nowhere to go: said first
        from smollab.models.loading import resolve_model_dir

        resolve_model_dir(str(path))  # a missing one answers before torch is imported
    from smollab.engine.wordle_play import play_wordle

    return play_wordle(
        str(path),
        games,
        max_turns=max_turns,
        seed=seed,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_new_tokens=max_new_tokens,
        device=device,
        mode=mode,
        out=out,
    )


def sweep(
    spec: str | Path | None, args: Sequence[str] = (), dry_run: bool = False, **values: Any
) -> dict[str, Any]:
    """Run a sweep spec (a shipped name such as "lr-micro" or a path; `values` set spec keys:
    `dir=...`, `**{"overrides.train.max_steps": 50}`); returns the sweep's result. With
    `dry_run`, prints the trials and returns {"status": "dry_run", "plan": [lines]}."""
    from smollab.lab.sweep import scheduler
    from smollab.lab.sweep.spec_load import load_spec

    loaded = load_spec(spec, [*args, *_as_args(values)])
    if dry_run:
        scheduler.dry_run(loaded)
        return {"status": "dry_run", "plan": loaded.describe()}
    return scheduler.run_sweep(loaded)


def probe(workload: str | Path, args: Sequence[str] = (), **values: Any) -> dict[str, Any]:
    """Step time and throughput against concurrent runs (a probe recipe or a training recipe;
    probe settings such as steps=10 or config keys); returns probe.json's result."""
    from smollab.lab.probe.run import run_probe
    from smollab.lab.probe.spec import load_probe

    spec, work = load_probe(str(workload), [*args, *_as_args(values)])
    return run_probe(spec, work)


def bench(
    workload: str | Path,
    args: Sequence[str] = (),
    *,
    knobs: Sequence[str] | None = None,
    steps: int | None = None,
    out: str | Path | None = None,
    command: str | None = None,
    tolerance: float | None = None,
    min_speedup: float = 1.03,
    repeat: int = 1,
    timeout: float | None = None,
    start: str = "auto",
    **values: Any,
) -> dict[str, Any]:
    """Measure each performance knob alone on a pretrain, grpo or sft workload; returns
    bench.json. `start`: auto, warm or cold, as a sweep's and a probe's `start` key."""
    from smollab.lab.bench.run import run_bench

    if command not in (None, "pretrain", "grpo", "sft"):
        raise UserError(f"bench: command {command!r}: pretrain, grpo or sft")
    return run_bench(
        str(workload),
        [*args, *_as_args(values)],
        knobs=list(knobs) if knobs is not None else None,
        steps=steps,
        out=out,
        kind=command,
        tolerance=tolerance,
        min_speedup=min_speedup,
        timeout=timeout,
        repeat=repeat,
        start=start,
    )


def compare(
    paths: list[str | Path],
    out: str | Path = "compare",
    metric: str | None = None,
    goal: str | None = None,
    **stats: Any,
) -> Path:
    """Configurations across seeds (`smollab.report.seed_stats`): one sweep dir, or run dirs
    grouped by their config less the seed; writes report.md, results.json and a plot in `out`.
    `stats`: level, resamples, seed, method, reduce, last_k, leaders, power."""
    from smollab.report.compare import compare_paths
    from smollab.report.seed_stats import StatsOptions

    if not 0 < stats.get("level", 0.95) < 1:
        raise UserError(f"level {stats['level']}: a confidence level is between 0 and 1")
    if stats.get("resamples", 10000) < 100:
        raise UserError(f"resamples {stats['resamples']}: at least 100 for a usable interval")
    if stats.get("leaders", 3) < 2:
        raise UserError(f"leaders {stats['leaders']}: at least 2 (the best and one other)")
    if stats.get("last_k", 3) < 1:
        raise UserError(f"last_k {stats['last_k']}: at least 1")
    return compare_paths(paths, out, metric, goal, StatsOptions(**stats))


def report(path: str | Path, target_loss: float | None = None, mode: str | None = None) -> Path:
    """Plots and report.md for a run, sweep or probe directory; returns the report's path.
    `mode` (both, retain_only, forget_only): the adapter mode a routed GRPO run's headline shows."""
    from smollab.rundir.runs import ROUTING_EVAL, SWEEP_META, SWEEP_RESULTS

    d = Path(path)
    if not d.is_dir():
        raise UserError(f"not a directory: {d}")
    if mode is not None and not (d / ROUTING_EVAL).exists():
        raise UserError(f"{d}: --mode needs a routed GRPO run, and it has no {ROUTING_EVAL}")
    if (d / SWEEP_RESULTS).exists() or (d / SWEEP_META).exists():
        from smollab.report.sweep_report import write_sweep_report

        return Path(write_sweep_report(d, plots=True, target_loss=target_loss))
    if (d / "probe.json").exists():
        from smollab.lab.probe.report import report_probe

        return Path(report_probe(d))
    from smollab.report.run_report import write_run_report

    return Path(write_run_report(d, mode=mode))


def demo(dir: str | Path = "demo", quick: bool = False) -> dict[str, Any]:
    """The whole loop offline (data, pretraining, GRPO, a report) under `dir`; returns its
    summary.json."""
    from smollab.demo import run_demo

    return run_demo(dir, quick=quick)


def doctor(
    device: str = "auto",
    json_path: str | Path | None = None,
    timeout: float = 300.0,
    keep: str | Path | None = None,
) -> dict[str, Any]:
    """What this device supports, then a micro run of every command on it; returns the report
    (`report["ok"]`: every check passed)."""
    from smollab.lab.doctor import run_doctor

    if device not in ("auto", "cpu", "cuda", "mps"):
        raise UserError(f"doctor: device {device!r}: one of auto, cpu, cuda, mps")
    if timeout <= 0:
        raise UserError(f"--timeout {timeout:g}: must be above 0 seconds")
    return run_doctor(
        device,
        json_path=None if json_path is None else str(json_path),
        timeout=timeout,
        keep=None if keep is None else str(keep),
    )


def recipes() -> list[dict[str, str]]:
    """The shipped recipes: name, command, path and the command line from each one's header."""
    from smollab.config.recipes import list_recipes

    return [
        {"name": r.name, "command": r.command, "path": str(r.path), "header": r.header}
        for r in list_recipes()
    ]
