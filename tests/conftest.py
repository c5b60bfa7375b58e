"""Shared micro fixtures: a tiny prepared corpus and the overrides of a micro pretraining run."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

MICRO_DATA = ["data.num_stories=400", "data.vocab_size=256"]


@pytest.fixture(scope="session")
def micro_data(tmp_path_factory):
    """A prepared data dir: 400 offline stories, a 256-entry WordPiece tokenizer."""
    from smollab.config import DataConfig
    from smollab.data.prepare import prepare

    d = tmp_path_factory.mktemp("micro_data")
    prepare(DataConfig(dir=str(d), num_stories=400, vocab_size=256), log=lambda _: None)
    return d


@pytest.fixture
def micro_pretrain(micro_data, tmp_path):
    """Overrides for a micro pretraining run that takes a second or two."""
    return [
        "model.preset=micro", f"data.dir={micro_data}", *MICRO_DATA,
        "train.max_steps=20", "train.batch_size=4", "train.seq_len=32", "train.log_interval=5",
        "train.eval_interval=10", "train.eval_tokens=512", "train.save_interval=10",
        "optim.warmup_steps=2", "optim.lr=1e-2", f"run.dir={tmp_path / 'run'}",
    ]  # fmt: skip


@pytest.fixture(scope="session")
def micro_model(micro_data, tmp_path_factory):
    """A run directory holding a micro model pretrained for a few steps (the GRPO base)."""
    from smollab.config import load_config
    from smollab.train.pretrain import train

    run = tmp_path_factory.mktemp("micro_model") / "run"
    train(load_config("pretrain", None, [
        "model.preset=micro", f"data.dir={micro_data}", *MICRO_DATA, "train.max_steps=30",
        "train.batch_size=8", "train.seq_len=64", "optim.lr=1e-2", "optim.warmup_steps=2",
        f"run.dir={run}",
    ]))  # fmt: skip
    return run


@pytest.fixture
def micro_grpo(micro_model, micro_data, tmp_path):
    """Overrides for a micro GRPO run: 8 completions (2 prompts x 4) of 12 tokens per step."""
    return [
        f"model.path={micro_model}", f"data.dir={micro_data}", "train.max_steps=6",
        "train.batch_size=8", "grpo.num_generations=4", "grpo.max_completion_length=12",
        "train.eval_interval=3", "grpo.eval_prompts=4", "train.save_interval=2",
        "optim.lr=1e-3", f"run.dir={tmp_path / 'grpo'}",
    ]  # fmt: skip
