"""The `smollab` command: argument plumbing only. Each command imports what it needs lazily,
because `import torch` alone costs seconds and every sweep child pays for it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from smollab.errors import UserError

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
    prep = sub.add_parser("prepare", help="write corpus, tokenizer, train.bin and val.bin into data.dir")
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


@command("pretrain", "pretrain a causal LM; writes a run directory")
def _pretrain(p: argparse.ArgumentParser) -> None:
    _config_args(p)

    def run(a: argparse.Namespace) -> int:
        from smollab.config import load_config

        path, overrides = split_config(a.args)
        cfg = load_config("pretrain", path, overrides)
        from smollab.train.pretrain import train

        summary = train(cfg)
        return 0 if summary.get("status") != "failed" else 1  # a diverged run is a result

    p.set_defaults(run=run)


@command("grpo", "GRPO fine-tuning (full or LoRA) against reward functions; writes a run directory")
def _grpo(p: argparse.ArgumentParser) -> None:
    _config_args(p)

    def run(a: argparse.Namespace) -> int:
        from smollab.config import load_config

        path, overrides = split_config(a.args)
        cfg = load_config("grpo", path, overrides)
        from smollab.train.grpo import train

        summary = train(cfg)
        return 0 if summary.get("status") != "failed" else 1

    p.set_defaults(run=run)


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
        from smollab.generate import sample_texts

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

        from smollab.config import SCHEMAS, load_config, to_dict

        path, overrides = split_config(a.args)
        name = a.for_command or _guess_command(path)
        if name not in SCHEMAS:
            raise UserError(f"--command {name}: one of {', '.join(sorted(SCHEMAS))}")
        cfg = load_config(name, path, overrides)
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        return 0

    show.set_defaults(run=run)


def _guess_command(path: str | None) -> str:
    if path:
        from smollab.config import _read_yaml

        if "grpo" in _read_yaml(path):
            return "grpo"
    return "pretrain"


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
    except KeyboardInterrupt:
        print("smollab: interrupted", file=sys.stderr)
        return 130
