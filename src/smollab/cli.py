"""The `smollab` command: argument plumbing only. Each command imports what it needs lazily,
because `import torch` alone costs seconds and every sweep child pays for it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from smollab.errors import RunFailed, UserError

COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {}


def command(name: str, help: str):
    def register(fn):
        COMMANDS[name] = (help, fn)
        return fn

    return register


def split_config(items: list[str]) -> tuple[str | None, list[str]]:
    """`[CONFIG] [key=value ...]`: the first item is the config file unless it is an override."""
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return None, items


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", metavar="[CONFIG] [key=value ...]",
                   help="YAML recipe, then dotted overrides such as optim.lr=3e-4")  # fmt: skip


# ---- commands -------------------------------------------------------------------------------


@command("data", "prepare data: corpus, tokenizer and memmapped token files")
def _data(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="action", required=True)
    prep = sub.add_parser(
        "prepare", help="write corpus, tokenizer, train.bin and val.bin into data.dir"
    )
    _config_args(prep)

    def run(a: argparse.Namespace) -> int:
        from smollab.config import load_config
        from smollab.data.prepare import prepare

        path, overrides = split_config(a.args)
        cfg = load_config("data", path, overrides)
        meta = prepare(cfg.data)
        print(f"data ready in {cfg.data.dir}: {meta['tokens']['train']:,} train tokens, "
              f"{meta['tokens']['val']:,} val tokens, vocab {meta['vocab_size']}")  # fmt: skip
        return 0

    prep.set_defaults(run=run)


def _training_command(name: str, help_text: str) -> None:
    """`smollab NAME [CONFIG] [key=value ...]` for a loop in `smollab.train.NAME`."""

    def configure(p: argparse.ArgumentParser) -> None:
        _config_args(p)

        def run(a: argparse.Namespace) -> int:
            import importlib

            from smollab.config import load_config

            path, overrides = split_config(a.args)
            cfg = load_config(name, path, overrides)
            summary = importlib.import_module(f"smollab.train.{name}").train(cfg)
            return 0 if summary.get("status") != "failed" else 1  # a diverged run is a result

        p.set_defaults(run=run)

    command(name, help_text)(configure)


_training_command("pretrain", "pretrain a causal LM; writes a run directory")
_training_command(
    "grpo", "GRPO fine-tuning (full or LoRA) against reward functions; writes a run directory"
)


@command("sample", "generate text from a run directory or checkpoint")
def _sample(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="run directory or checkpoint directory")
    p.add_argument("--prompt", action="append", required=True, help="may be given several times")
    p.add_argument("--n", type=int, default=1, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")

    def run(a: argparse.Namespace) -> int:
        from smollab.engine.sample_texts import sample_texts

        if a.n < 1 or a.max_new_tokens < 1:
            raise UserError("--n and --max-new-tokens must be at least 1")
        if a.temperature < 0 or not 0 < a.top_p <= 1:
            raise UserError("--temperature must be >= 0 and --top-p in (0, 1]")
        for prompt, text in sample_texts(a.path, a.prompt, a.n, a.max_new_tokens, a.temperature,
                                         a.top_p, a.top_k, a.seed, a.device):  # fmt: skip
            print(f"[{prompt}] {text}\n")
        return 0

    p.set_defaults(run=run)


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
    show.add_argument("--command", dest="for_command", default=None,
                      help="schema to use (default: grpo when the file has a grpo section, else pretrain)")  # fmt: skip
    _config_args(show)

    def run(a: argparse.Namespace) -> int:
        import yaml

        from smollab.config import SCHEMAS, guess_command, load_config, to_dict

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
    p.add_argument("--quick", action="store_true",
                   help="micro settings: checks the whole path in seconds (figures meaningless)")  # fmt: skip

    def run(a: argparse.Namespace) -> int:
        from smollab.demo import run_demo

        s = run_demo(a.dir, quick=a.quick)
        sec = s["seconds"]
        print(f"\ndemo {s['status']} in {sec['total']:.0f} s (data {sec['data']:.0f}, pretrain "
              f"{sec['pretrain']:.0f}, grpo {sec['grpo']:.0f}, report {sec['report']:.0f}); "
              f"reward {s['base_reward']:.2f} -> {s['final_reward']:.2f}, unique "
              f"{s['final_unique_fraction']:.2f}")  # fmt: skip
        print(f"report: {a.dir.rstrip('/')}/report.md")
        return 0

    p.set_defaults(run=run)


@command(
    "bench", "measure each performance knob alone on a workload: step time, throughput, memory"
)
def _bench(p: argparse.ArgumentParser) -> None:
    from smollab.lab.bench.knobs import KNOBS

    p.add_argument("workload", metavar="WORKLOAD", help="a pretrain or grpo recipe (YAML)")
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="dotted overrides of the workload"
    )
    p.add_argument("--knobs", default=None,
                   help=f"comma-separated subset of: {', '.join(KNOBS)} (default: all)")  # fmt: skip
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps per variant (default 30 pretrain, 20 grpo)")  # fmt: skip
    p.add_argument("--out", default=None, help="bench directory (default runs/bench/<workload>)")
    p.add_argument("--command", dest="kind", choices=("pretrain", "grpo"), default=None,
                   help="workload type (default: grpo when the recipe has a grpo section)")  # fmt: skip
    p.add_argument("--tolerance", type=float, default=None,
                   help="quality tolerance: relative for loss (default 0.02), absolute for reward (0.05)")  # fmt: skip
    p.add_argument("--min-speedup", type=float, default=1.03,
                   help="speedup a knob needs to count as helping (default 1.03)")  # fmt: skip
    p.add_argument("--repeat", type=int, default=1, help="runs per variant (median step time)")
    p.add_argument("--timeout", type=float, default=None, help="seconds allowed per variant")

    def run(a: argparse.Namespace) -> int:
        from smollab.lab.bench.run import run_bench

        path, overrides = split_config([a.workload, *a.overrides])
        if path is None:
            raise UserError(
                "bench: give a workload recipe first, e.g. configs/pretrain/simplestories-1.25m.yaml"
            )
        knobs = [k.strip() for k in a.knobs.split(",") if k.strip()] if a.knobs else None
        result = run_bench(path, overrides, knobs=knobs, steps=a.steps, out=a.out, kind=a.kind,
                           tolerance=a.tolerance, min_speedup=a.min_speedup, timeout=a.timeout,
                           repeat=a.repeat)  # fmt: skip
        return 0 if result["baseline_ok"] else 1

    p.set_defaults(run=run)


@command("sweep", "run a sweep spec: packed, early-stopped, resumable trials; live results")
def _sweep(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="+", metavar="SPEC [key=value ...]",
                   help="sweep spec YAML, then overrides on the spec (dir=..., concurrency=4, "
                        "space.optim.lr=[1e-3,1e-2], overrides.train.max_steps=50)")  # fmt: skip
    p.add_argument("--dry-run", action="store_true", help="print the trials and exit")

    def run(a: argparse.Namespace) -> int:
        from smollab.lab.sweep.spec_load import load_spec

        path, overrides = split_config(a.args)
        spec = load_spec(path, overrides)
        from smollab.lab.sweep import scheduler

        if a.dry_run:
            scheduler.dry_run(spec)
            return 0
        scheduler.run_sweep(spec)
        return 0

    p.set_defaults(run=run)


@command("report", "plots and report.md for a run, sweep or probe directory")
def _report(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a run directory or a sweep directory")
    p.add_argument("--target-loss", type=float, default=None,
                   help="LR sweeps: mark which learning rates reach this loss")  # fmt: skip
    p.add_argument("--mode", choices=["both", "retain_only", "forget_only"], default=None,
                   help="routed GRPO runs: the adapter mode the headline reports (default both)")  # fmt: skip

    def run(a: argparse.Namespace) -> int:
        from pathlib import Path

        from smollab.runs import ROUTING_EVAL, SWEEP_META, SWEEP_RESULTS

        d = Path(a.path)
        if not d.is_dir():
            raise UserError(f"not a directory: {d}")
        if a.mode is not None and not (d / ROUTING_EVAL).exists():
            raise UserError(f"{d}: --mode needs a routed GRPO run, and it has no {ROUTING_EVAL}")
        if (d / SWEEP_RESULTS).exists() or (d / SWEEP_META).exists():
            from smollab.report.sweep_report import write_sweep_report

            out = write_sweep_report(d, plots=True, target_loss=a.target_loss)
        elif (d / "probe.json").exists():
            from smollab.lab.probe.report import report_probe

            out = report_probe(d)
        else:
            from smollab.report.run_report import write_run_report

            out = write_run_report(d, mode=a.mode)
        print(f"report: {out}")
        return 0

    p.set_defaults(run=run)


@command("probe", "step time and throughput vs concurrent runs: the best concurrency")
def _probe(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="+", metavar="WORKLOAD [key=value ...]",
                   help="a probe recipe (configs/probe/) or a pretrain/grpo config; probe settings "
                        "(steps=, warmup=, max_k=, drop=, bisect=true, dir=) or config overrides")  # fmt: skip

    def run(a: argparse.Namespace) -> int:
        from smollab.lab.probe.run import run_probe
        from smollab.lab.probe.spec import load_probe

        workload, overrides = split_config(a.args)
        if workload is None:
            raise UserError("probe: give a WORKLOAD (a probe recipe or a training config) first")
        spec, work = load_probe(workload, overrides)
        run_probe(spec, work)
        return 0

    p.set_defaults(run=run)


@command("doctor", "self-check: what this device supports, then a micro run of every command on it")
def _doctor(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=("auto", "cpu", "cuda", "mps"), default="auto",
                   help="device to check (default: CUDA, then MPS, else the CPU)")  # fmt: skip
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds each check may take before it is stopped (default 300)")  # fmt: skip
    p.add_argument("--keep", default=None, metavar="DIR",
                   help="run the checks in DIR and keep it (each check's child.log), instead of "
                        "a temporary directory removed afterwards")  # fmt: skip

    def run(a: argparse.Namespace) -> int:
        from smollab.lab.doctor import render, run_doctor

        if a.timeout <= 0:
            raise UserError(f"--timeout {a.timeout:g}: must be above 0 seconds")
        report = run_doctor(a.device, json_path=a.json, timeout=a.timeout, keep=a.keep)
        render(report)
        if a.json:
            print(f"report: {a.json}")
        return 0 if report["ok"] else 1

    p.set_defaults(run=run)


# ---- entry point ----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from smollab import __version__

    parser = argparse.ArgumentParser(
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
