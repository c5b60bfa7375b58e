"""`smollab COMMAND --help` lists the command's keys from its schema: every key with its type,
default and a description (no key without one), for the command schemas and the lab's specs."""

from __future__ import annotations

import pytest

from smollab.cli import main
from smollab.config.describe import keys_help, schema_keys
from smollab.config.registry import SCHEMAS
from smollab.lab.probe.spec import ProbeSpec
from smollab.lab.sweep.spec import SweepSpec

ALL = {**SCHEMAS, "sweep": SweepSpec, "probe": ProbeSpec}


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_key_has_a_description(name):
    keys = schema_keys(ALL[name])
    assert keys and [k.key for k in keys if not k.description.strip()] == []


def test_keys_carry_type_bounds_default_and_list_items():
    by = {k.key: k for k in schema_keys(SCHEMAS["grpo"])}
    pretrain = {k.key: k for k in schema_keys(SCHEMAS["pretrain"])}
    assert by["grpo.beta"].type == "float >= 0" and by["grpo.beta"].default == "0.02"
    assert by["optim.lr"].default == "1e-05"  # GRPO's own default, the shared description
    assert by["optim.lr"].description == pretrain["optim.lr"].description
    assert by["optim.lr"].default != pretrain["optim.lr"].default
    assert by["perf.device"].type == "auto|cpu|cuda|mps"
    assert by["model.path"].type == "str|null" and by["model.path"].default == "null"
    assert by["reward"].default == "[{name: happy_binary}]"
    assert by["reward[].name"].default == "required"
    assert "grpo.routing.detector.threshold" in by and "grpo.routing" not in by


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["grpo", "--help"], ["config keys of grpo", "grpo.beta", "KL penalty weight"]),
        (["pretrain", "--help"], ["train.seq_len", "default 128"]),
        (["sft", "--help"], ["data.train_file", "sft.packing"]),
        (["rft", "--help"], ["rft.keep.threshold", "reward[].weight"]),
        (["data", "prepare", "--help"], ["data.vocab_size", "config keys of data"]),
        (["lanes", "grpo", "--help"], ["--max-lanes", "grpo.num_generations"]),
        (["sweep", "--help"], ["sweep spec keys", "pruner.type", "concurrency"]),
        (["probe", "--help"], ["probe keys", "max_k", "smollab pretrain --help"]),
    ],
)
def test_help_lists_the_commands_keys(capsys, argv, expect):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(x in out for x in expect), out[-2000:]


def test_help_wraps_to_the_width():
    text = keys_help(SCHEMAS["pretrain"], "keys:", width=80)
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "  optim.lr" in text
