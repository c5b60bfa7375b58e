"""The `smollab` command: argument plumbing only. Each command calls its function in
`smollab.api` (the Python API), which imports what it needs lazily, because `import torch` alone
costs seconds and every sweep child pays for it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from smollab import api
from smollab.errors import RunFailed, UserError

COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {}


class Parser(argparse.ArgumentParser):
    """A parser whose help can end with the keys a command takes as `key=value`, each with its
    type, default and description, read from the command's schema only when help is asked for
    (building it would cost every command the schemas' import)."""

    keys: Callable[[], str] | None = None

    def format_help(self) -> str:
        text = super().format_help()
        return f"{text}\n{self.keys()}" if self.keys else text


def config_keys(command: str) -> Callable[[], str]:
    """The help section of `command`'s config keys (`smollab.config.registry.SCHEMAS`)."""

    def keys() -> str:
        from smollab.config.describe import keys_help
        from smollab.config.registry import SCHEMAS

        return keys_help(
            SCHEMAS[command],
            f"config keys of {command} (in the recipe, or as key=value; defaults < recipe < "
            "key=value):",
        )

    return keys


def spec_keys(module: str, name: str, title: str) -> Callable[[], str]:
    """The help section of a lab spec's keys (the sweep's, the probe's): `module`.`name`."""

    def keys() -> str:
        import importlib

        from smollab.config.describe import keys_help

        return keys_help(getattr(importlib.import_module(module), name), title)

    return keys


WORKLOAD_KEYS = (
    "A workload's own config keys, with type, default and description: `smollab pretrain "
    "--help`, `smollab grpo --help`, `smollab sft --help`."
)


def command(name: str, help: str):
    def register(fn):
        COMMANDS[name] = (help, fn)
        return fn

    return register


def split_config(items: list[str]) -> tuple[str | None, list[str]]:
    """`[CONFIG] [key=value ...]`: the first item is the recipe (a path or a shipped recipe's
    name) unless it is an override."""
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return None, items


def _config_args(p: argparse.ArgumentParser, command: str | None = None) -> None:
    """`[CONFIG] [key=value ...]`; with `command`, its help lists that command's keys."""
    if command is not None and isinstance(p, Parser):
        p.keys = config_keys(command)
    p.add_argument(
        "args",
        nargs="*",
        metavar="[CONFIG] [key=value ...]",
        help="YAML recipe (a path, or a name from `smollab recipes`), then dotted "
        "overrides such as optim.lr=3e-4",
    )


# ---- commands -------------------------------------------------------------------------------


@command("data", "prepare data: corpus, tokenizer and memmapped token files")
def _data(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    prep = sub.add_parser(
        "prepare", help="write corpus, tokenizer, train.bin and val.bin into data.dir"
    )
    _config_args(prep, "data")

    def run(a: argparse.Namespace) -> int:
        path, overrides = split_config(a.args)
        meta = api.data_prepare(path, overrides)
        print(
            f"data ready in {meta['dir']}: {meta['tokens']['train']:,} train tokens, "
            f"{meta['tokens']['val']:,} val tokens, vocab {meta['vocab_size']}"
        )
        return 0

    prep.set_defaults(run=run)


def _training_command(name: str, help_text: str) -> None:
    """`smollab NAME [CONFIG] [key=value ...]` for the loop `smollab.api.NAME` runs."""

    def configure(p: argparse.ArgumentParser) -> None:
        _config_args(p, name)

        def run(a: argparse.Namespace) -> int:
            path, overrides = split_config(a.args)
            summary = getattr(api, name)(path, overrides)
            return 0 if summary.get("status") != "failed" else 1  # a diverged run is a result

        p.set_defaults(run=run)

    command(name, help_text)(configure)


_training_command("pretrain", "pretrain a causal LM; writes a run directory")
_training_command(
    "grpo", "GRPO fine-tuning (full or LoRA) against reward functions; writes a run directory"
)
_training_command(
    "sft",
    "supervised fine-tuning (full or LoRA) on prompt/completion records; writes a run directory",
)
_training_command(
    "rft",
    "rejection-sampling fine-tuning: rounds of sample, score, keep the best, SFT; accuracy per "
    "round in one run directory",
)


@command("lanes", "train many GRPO configurations (LoRA or full) as lanes of one batched model")
def _lanes(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="lanes_command", required=True)
    g = sub.add_parser("grpo", help="one lane per --lane, each writing its own run directory")
    _config_args(g, "grpo")
    g.add_argument(
        "--lane",
        action="append",
        default=[],
        metavar='"key=value ..."',
        help="one lane's overrides over CONFIG and the shared ones (repeat per lane)",
    )
    g.add_argument(
        "--inbox",
        default=None,
        metavar="DIR",
        help="worker mode: also train the trials a sweep posts to DIR (executor: lanes)",
    )
    g.add_argument(
        "--max-lanes",
        type=int,
        default=None,
        metavar="N",
        help="lanes at once in worker mode (default: the --lane count)",
    )
    g.add_argument("--threads", type=int, default=None, help="perf.threads of every lane")

    def run(a: argparse.Namespace) -> int:
        import shlex

        path, overrides = split_config(a.args)
        summaries = api.lanes(
            path,
            overrides,
            [shlex.split(x) for x in a.lane],
            inbox=a.inbox,
            max_lanes=a.max_lanes,
            threads=a.threads,
        )
        return 0 if all(s.get("status") != "failed" for s in summaries) else 1

    g.set_defaults(run=run)


@command("sample", "generate text from a run directory or checkpoint, or play Wordle games")
def _sample(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="run directory or checkpoint directory")
    p.add_argument("--prompt", action="append", help="may be given several times")
    p.add_argument("--n", type=int, default=1, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0 = greedy; default 1.0, and 0 with --wordle-games",
    )
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--mode",
        choices=["both", "retain_only", "forget_only"],
        help="a gradient-routing run: the adapters to sample with (default both)",
    )
    p.add_argument(
        "--forget-scale",
        type=float,
        metavar="S",
        help="a gradient-routing run: both adapters, the forget one times S in [0, 1] "
        "(0: retain_only, 1: both)",
    )
    p.add_argument(
        "--wordle-games",
        type=int,
        metavar="N",
        help="instead of prompts: play N whole Wordle games (secrets drawn with "
        "--seed); prints and writes solve rate, mean guesses and error rates to "
        "wordle_games.json in PATH",
    )
    p.add_argument("--max-turns", type=int, default=6, help="--wordle-games: turns per game")
    p.add_argument("--wordle-out", help="--wordle-games: the report's file instead")

    def run(a: argparse.Namespace) -> int:
        if a.wordle_games is not None:
            return _play_wordle(a)
        if not a.prompt:
            raise UserError("sample: give --prompt (or --wordle-games N)")
        if a.wordle_out is not None or a.max_turns != 6:
            raise UserError("--wordle-out and --max-turns are read only with --wordle-games")
        if a.forget_scale is not None and a.mode not in (None, "both"):
            raise UserError(
                f"--forget-scale scales forget under both adapters, not --mode {a.mode}"
            )
        temperature = 1.0 if a.temperature is None else a.temperature
        for s in api.sample(
            a.path,
            a.prompt,
            n=a.n,
            max_new_tokens=a.max_new_tokens,
            temperature=temperature,
            top_p=a.top_p,
            top_k=a.top_k,
            seed=a.seed,
            device=a.device,
            mode=a.mode,
            forget_scale=a.forget_scale,
        ):
            print(f"[{s['prompt']}] {s['text']}\n")
        return 0

    p.set_defaults(run=run)


def _play_wordle(a: argparse.Namespace) -> int:
    if a.prompt or a.n != 1:
        raise UserError("--wordle-games plays games from its own prompts: drop --prompt and --n")
    if a.forget_scale is not None:
        raise UserError("--forget-scale is read with --prompt only, not --wordle-games")
    r = api.wordle_games(
        a.path,
        a.wordle_games,
        max_turns=a.max_turns,
        temperature=0.0 if a.temperature is None else a.temperature,
        top_p=a.top_p,
        top_k=a.top_k,
        max_new_tokens=a.max_new_tokens,
        seed=a.seed,
        device=a.device,
        mode=a.mode,
        out=a.wordle_out,
    )
    guesses = "-" if r["mean_guesses"] is None else f"{r['mean_guesses']:.2f}"
    print(
        f"wordle: {r['solved']}/{r['games']} games solved ({r['solve_rate']:.1%}), mean "
        f"guesses {guesses}; of {r['turns']} turns {r['invalid_rate']:.1%} wasted "
        f"({r['format_error_rate']:.1%} format errors); model {r['model']}; wrote "
        f"{r['path']}"
    )
    return 0


@command("models", "list model presets with total and non-embedding parameter counts")
def _models(p: argparse.ArgumentParser) -> None:
    def run(a: argparse.Namespace) -> int:
        import torch
        from transformers import AutoModelForCausalLM

        from smollab.models.presets import PRESETS, count_parameters, preset_config

        print(f"{'preset':<22}{'arch':<7}{'parameters':>14}{'non-embedding':>16}")
        for name, spec in PRESETS.items():
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(preset_config(name))
            total, non_embed = count_parameters(model)
            print(f"{name:<22}{spec['arch']:<7}{total:>14,}{non_embed:>16,}")
        return 0

    p.set_defaults(run=run)


@command("config", "show the resolved config of a recipe with overrides")
def _config(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    show = sub.add_parser("show", help="print the resolved config as YAML")
    show.add_argument(
        "--command",
        dest="for_command",
        default=None,
        help="schema to use (default: grpo when the file has a grpo section, else pretrain)",
    )
    _config_args(show)
    show.epilog = (
        "Each command's keys, with type, default and description: `smollab pretrain|grpo|sft|rft "
        "--help`, `smollab data prepare --help`."
    )

    def run(a: argparse.Namespace) -> int:
        import yaml

        from smollab.config.load import guess_command, load_config, to_dict
        from smollab.config.registry import SCHEMAS

        path, overrides = split_config(a.args)
        name = a.for_command or guess_command(path)
        if name not in SCHEMAS:
            raise UserError(f"--command {name}: one of {', '.join(sorted(SCHEMAS))}")
        cfg = load_config(name, path, overrides)
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        return 0

    show.set_defaults(run=run)


@command("demo", "the whole loop offline in minutes: data, pretraining, GRPO, a report")
def _demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default="demo", help="where data, runs, report.md and summary.json go")
    p.add_argument(
        "--quick",
        action="store_true",
        help="micro settings: checks the whole path in seconds (figures meaningless)",
    )

    def run(a: argparse.Namespace) -> int:
        s = api.demo(a.dir, quick=a.quick)
        sec = s["seconds"]
        print(
            f"\ndemo {s['status']} in {sec['total']:.0f} s (data {sec['data']:.0f}, pretrain "
            f"{sec['pretrain']:.0f}, grpo {sec['grpo']:.0f}, report {sec['report']:.0f}); "
            f"reward {s['base_reward']:.2f} -> {s['final_reward']:.2f}, unique "
            f"{s['final_unique_fraction']:.2f}"
        )
        print(f"report: {a.dir.rstrip('/')}/report.md")
        return 0

    p.set_defaults(run=run)


@command(
    "bench", "measure each performance knob alone on a workload: step time, throughput, memory"
)
def _bench(p: argparse.ArgumentParser) -> None:
    from typing import get_args

    from smollab.lab.bench.knobs import KNOBS
    from smollab.lab.spec_common import START_HELP, StartValue

    p.add_argument("workload", metavar="WORKLOAD", help="a pretrain, grpo or sft recipe (YAML)")
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="dotted overrides of the workload"
    )
    p.epilog = WORKLOAD_KEYS
    p.add_argument(
        "--knobs",
        default=None,
        help=f"comma-separated subset of: {', '.join(KNOBS)} (default: all)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="optimizer steps per variant (default 30 pretrain and sft, 20 grpo)",
    )
    p.add_argument("--out", default=None, help="bench directory (default runs/bench/<workload>)")
    p.add_argument(
        "--command",
        dest="kind",
        choices=("pretrain", "grpo", "sft"),
        default=None,
        help="workload type (default: grpo when the recipe has a grpo section, sft "
        "with an sft section or data.train_file/hf_dataset)",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="quality tolerance: relative for loss (default 0.02), absolute for reward (0.05)",
    )
    p.add_argument(
        "--min-speedup",
        type=float,
        default=1.03,
        help="speedup a knob needs to count as helping (default 1.03)",
    )
    p.add_argument("--repeat", type=int, default=1, help="runs per variant (median step time)")
    p.add_argument("--timeout", type=float, default=None, help="seconds allowed per variant")
    p.add_argument(
        "--start",
        default="auto",
        metavar="{" + ",".join(get_args(StartValue)) + "}",
        help=f"{START_HELP} (default auto)",
    )

    def run(a: argparse.Namespace) -> int:
        path, overrides = split_config([a.workload, *a.overrides])
        if path is None:
            raise UserError(
                "bench: give a workload recipe first, e.g. simplestories-1.25m or "
                "configs/pretrain/simplestories-1.25m.yaml"
            )
        knobs = [k.strip() for k in a.knobs.split(",") if k.strip()] if a.knobs else None
        result = api.bench(
            path,
            overrides,
            knobs=knobs,
            steps=a.steps,
            out=a.out,
            command=a.kind,
            tolerance=a.tolerance,
            min_speedup=a.min_speedup,
            timeout=a.timeout,
            repeat=a.repeat,
            start=a.start,
        )
        return 0 if result["baseline_ok"] else 1

    p.set_defaults(run=run)


@command("sweep", "run a sweep spec: packed, early-stopped, resumable trials; live results")
def _sweep(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "args",
        nargs="+",
        metavar="SPEC [key=value ...]",
        help="sweep spec (a path, or a name from `smollab recipes`), then overrides on the spec (dir=..., concurrency=4, "
        "space.optim.lr=[1e-3,1e-2], overrides.train.max_steps=50)",
    )
    p.add_argument("--dry-run", action="store_true", help="print the trials and exit")
    p.add_argument(
        "--measure",
        type=int,
        metavar="N",
        default=None,
        help="once the search ends, rerun its best measure.top_k (3) configurations with N fresh "
        "seeds and compare them (the spec key measure.seeds)",
    )
    if isinstance(p, Parser):
        p.keys = spec_keys(
            "smollab.lab.sweep.spec",
            "SweepSpec",
            "sweep spec keys (in the spec, or as key=value; trials' config keys go in overrides "
            "and space, as dotted keys):",
        )

    def run(a: argparse.Namespace) -> int:
        path, overrides = split_config(a.args)
        if a.measure is not None:
            overrides = [*overrides, f"measure.seeds={a.measure}"]
        api.sweep(path, overrides, dry_run=a.dry_run)
        return 0

    p.set_defaults(run=run)


@command("compare", "how sure a comparison across seeds is: a sweep's configurations, or runs")
def _compare(p: argparse.ArgumentParser) -> None:
    p.add_argument("paths", nargs="+", help="one sweep directory, or run directories")
    p.add_argument("--out", default="compare", help="where report.md, results.json and the plot go")
    p.add_argument("--metric", default=None, help="runs: the metrics.csv column compared")
    p.add_argument("--goal", choices=["min", "max"], default=None, help="runs: default min")
    p.add_argument("--level", type=float, default=0.95, help="confidence level of the intervals")
    p.add_argument("--resamples", type=int, default=10000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="the bootstrap's random seed")
    p.add_argument("--method", choices=["percentile"], default="percentile")
    p.add_argument("--reduce", choices=["last", "best", "mean_last_k"], default="last")
    p.add_argument("--last-k", type=int, default=3, help="--reduce mean_last_k: values averaged")
    p.add_argument("--leaders", type=int, default=3, help="configurations compared with the best")

    def run(a: argparse.Namespace) -> int:
        path = api.compare(
            a.paths,
            out=a.out,
            metric=a.metric,
            goal=a.goal,
            level=a.level,
            resamples=a.resamples,
            seed=a.seed,
            method=a.method,
            reduce=a.reduce,
            last_k=a.last_k,
            leaders=a.leaders,
        )
        print(f"report: {path}")
        return 0

    p.set_defaults(run=run)


@command("report", "plots and report.md for a run, sweep or probe directory")
def _report(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a run directory or a sweep directory")
    p.add_argument(
        "--target-loss",
        type=float,
        default=None,
        help="LR sweeps: mark which learning rates reach this loss",
    )
    p.add_argument(
        "--mode",
        choices=["both", "retain_only", "forget_only"],
        default=None,
        help="routed GRPO runs: the adapter mode the headline reports (default both)",
    )

    def run(a: argparse.Namespace) -> int:
        print(f"report: {api.report(a.path, target_loss=a.target_loss, mode=a.mode)}")
        return 0

    p.set_defaults(run=run)


@command("probe", "step time and throughput vs concurrent runs: the best concurrency")
def _probe(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "args",
        nargs="+",
        metavar="WORKLOAD [key=value ...]",
        help="a probe recipe (configs/probe/) or a pretrain/grpo config; probe settings "
        "(steps=, warmup=, max_k=, drop=, bisect=true, dir=) or config overrides",
    )
    if isinstance(p, Parser):
        p.keys = spec_keys(
            "smollab.lab.probe.spec",
            "ProbeSpec",
            "probe keys (in a probe recipe, or as key=value; any other key=value is a config key "
            "of the workload: `smollab pretrain --help`, `grpo --help`, `sft --help`):",
        )

    def run(a: argparse.Namespace) -> int:
        workload, overrides = split_config(a.args)
        if workload is None:
            raise UserError("probe: give a WORKLOAD (a probe recipe or a training config) first")
        api.probe(workload, overrides)
        return 0

    p.set_defaults(run=run)


@command("doctor", "self-check: what this device supports, then a micro run of every command on it")
def _doctor(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda", "mps"),
        default="auto",
        help="device to check (default: CUDA, then MPS, else the CPU)",
    )
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds each check may take before it is stopped (default 300)",
    )
    p.add_argument(
        "--keep",
        default=None,
        metavar="DIR",
        help="run the checks in DIR and keep it (each check's child.log), instead of "
        "a temporary directory removed afterwards",
    )

    def run(a: argparse.Namespace) -> int:
        from smollab.lab.doctor import render

        report = api.doctor(a.device, json_path=a.json, timeout=a.timeout, keep=a.keep)
        render(report)
        if a.json:
            print(f"report: {a.json}")
        return 0 if report["ok"] else 1

    p.set_defaults(run=run)


@command("recipes", "list the shipped recipes: name, command and the command line each starts with")
def _recipes(p: argparse.ArgumentParser) -> None:
    def run(a: argparse.Namespace) -> int:
        rows = api.recipes()
        width = max(len(r["name"]) for r in rows) + 2
        print(f"{'name':<{width}}{'command':<10}first line")
        for r in rows:
            print(f"{r['name']:<{width}}{r['command']:<10}{r['header']}")
        print(
            "\nrun one by name (smollab grpo happy) or by path (configs/grpo/happy.yaml); "
            "`smollab config show NAME` prints it resolved"
        )
        return 0

    p.set_defaults(run=run)


# ---- entry point ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from smollab import __version__

    parser = Parser(
        prog="smollab",
        description="Fast, systematic experiments on small language models.",
    )
    parser.add_argument("--version", action="version", version=f"smollab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, configure) in COMMANDS.items():
        configure(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except UserError as e:
        print(f"smollab: error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:  # recorded in its run directory: status failed, traceback in the log
        print(f"smollab: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("smollab: interrupted", file=sys.stderr)
        return 130
