"""Tasks as data, TRL's contract: prompts from a JSONL file whose other columns reach every
reward as keyword arguments, one value per completion, under `smollab grpo`, `smollab rft` and a
sweep (processes and lanes). The reward here is written to TRL's documented signature and logs
what it was given, so the tests check that each completion came with its own prompt's
`solution`, prompts shuffled and several generations each."""

from __future__ import annotations

import json
import os
import random
import textwrap
from collections import Counter
from pathlib import Path

import pytest
import yaml

from smollab import api
from smollab.train import pretrain
from tests.replicas import FAMILIES

SRC = str(Path(pretrain.__file__).resolve().parents[2])

TRL_REWARD = """
import json, os


def accuracy_reward(completions, solution, **kwargs):
    # TRL's documented signature: the `solution` column, one value per completion
    with open(os.environ["SEEN_LOG"], "a") as f:
        f.write(json.dumps({"prompts": kwargs["prompts"], "solution": solution,
                            "level": kwargs["level"], "n": len(completions)}) + "\\n")
    return [1.0 if s.split("-")[0] in c else 0.0 for c, s in zip(completions, solution)]
"""


def solution_of(i: int) -> str:
    return f"{['red', 'blue', 'green', 'tall', 'small'][i % 5]}-{i}"


def _task(tmp_path, monkeypatch, rows: list[dict], module: str, source: str):
    """The rows as a JSONL file and the reward module on this process's path, logging to
    SEEN_LOG; returns (the file, the log)."""
    f = tmp_path / "task.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    log = tmp_path / "seen.jsonl"
    monkeypatch.setenv("SEEN_LOG", str(log))
    monkeypatch.syspath_prepend(str(tmp_path))
    return f, log


@pytest.fixture
def task(tmp_path, monkeypatch):
    """A 12-row JSONL (prompt, solution, level) in shuffled order, and the reward module on the
    path of this process and of child processes; returns (file, {prompt: (solution, level)},
    the log the reward appends to)."""
    order = list(range(12))
    random.Random(3).shuffle(order)
    rows = [
        {"prompt": f"the {k} little bird sang", "solution": solution_of(k), "level": k % 3}
        for k in order
    ]
    f, log = _task(tmp_path, monkeypatch, rows, "trl_task_reward", TRL_REWARD)
    paths = [str(tmp_path), SRC, os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    truth = {r["prompt"]: (r["solution"], r["level"]) for r in rows}
    return f, truth, log


def calls(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()]


def check_calls(log: Path, truth: dict) -> list[dict]:
    """Every completion the reward scored came with its own prompt's solution and level."""
    seen = calls(log)
    assert seen
    for c in seen:
        assert len(c["prompts"]) == len(c["solution"]) == len(c["level"]) == c["n"]
        for p, s, lv in zip(c["prompts"], c["solution"], c["level"], strict=True):
            assert (s, lv) == truth[p], p
    return seen


REWARD = "reward=[{name: trl_task_reward:accuracy_reward}]"


def test_grpo_passes_each_completion_its_own_row(task, micro_model, micro_data, tmp_path):
    """Two epochs over 10 training prompts (2 carved out), 2 prompts x 4 generations a step:
    every training prompt appears in each epoch once, as a group of 4, with its solution."""
    f, truth, log = task
    run = tmp_path / "grpo"
    summary = api.grpo(
        None,
        [
            f"model.path={micro_model}",
            f"data.dir={micro_data}",
            f"grpo.prompts_file={f}",
            "data.eval_fraction=0.15",
            "train.epochs=2",
            "train.batch_size=8",
            "grpo.num_generations=4",
            "grpo.max_completion_length=8",
            "train.eval_interval=5",
            "grpo.eval_prompts=4",
            "train.save_interval=0",
            "grpo.log_samples=8",
            REWARD,
            "run.plots=false",
            f"run.dir={run}",
        ],
    )
    assert summary["status"] == "completed" and summary["steps"] == 10  # 2 x 10 prompts / 2
    seen = check_calls(log, truth)
    train = [c for c in seen if c["n"] == 8]
    assert len(train) == 10
    held = {p for c in seen if c["n"] != 8 for p in c["prompts"]}
    assert len(held) == 2 and not held & {p for c in train for p in c["prompts"]}
    for epoch in (train[:5], train[5:]):
        counts = Counter(p for c in epoch for p in c["prompts"])
        assert len(counts) == 10 and set(counts.values()) == {4}
        for c in epoch:  # a group is one prompt's 4 completions, side by side
            assert c["prompts"][:4] == [c["prompts"][0]] * 4
    assert [p for c in train[:5] for p in c["prompts"]] != [
        p for c in train[5:] for p in c["prompts"]
    ]
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    solutions = {s for s, _ in truth.values()}
    assert samples and all(s["solution"] in solutions for s in samples)
    assert len({s["solution"] for s in samples[:4]}) == 1  # a group: one prompt, one row
    assert all("level" not in s for s in samples)  # only the columns a reward names
    log_text = (run / "training.log").read_text()
    assert "prompts: grpo.prompts_file" in log_text and "train.epochs=2: 10 steps" in log_text


def test_rft_passes_each_completion_its_own_row(task, micro_model, tmp_path):
    f, truth, log = task
    summary = api.rft(
        None,
        [
            f"model.path={micro_model}",
            f"rft.prompts_file={f}",
            "data.eval_fraction=0.25",
            "rft.rounds=1",
            "rft.oversample=3",
            "rft.max_new_tokens=6",
            "rft.gen_batch_size=3",
            "rft.keep.threshold=null",
            "rft.keep.top_k=1",
            "train.batch_size=4",
            "train.seq_len=32",
            "train.max_steps=2",
            "train.epochs=null",
            "optim.warmup_steps=1",
            REWARD,
            "run.plots=false",
            f"run.dir={tmp_path / 'rft'}",
        ],
    )
    assert summary["status"] == "completed"
    seen = check_calls(log, truth)
    generated = Counter(p for c in seen if c["n"] == 9 for p in c["prompts"])
    assert len(generated) == 9 and set(generated.values()) == {3}  # 12 - 3 held out, 3 each
    records = [
        json.loads(x)
        for x in (tmp_path / "rft" / "rounds" / "1" / "data.jsonl").read_text().splitlines()
    ]
    assert records and all(r["columns"]["solution"] == truth[r["prompt"]][0] for r in records)


@pytest.mark.parametrize("executor", ["processes", "lanes"])
def test_a_sweep_passes_each_completion_its_own_row(
    task, micro_model, micro_data, tmp_path, executor
):
    from smollab.lab.sweep.scheduler import run_sweep
    from smollab.lab.sweep.spec_load import load_spec

    f, truth, log = task
    spec = {
        "command": "grpo",
        "threads": 1,
        "overrides": {
            "model.path": str(micro_model),
            "model.lora.enabled": True,
            "data.dir": str(micro_data),
            "grpo.prompts_file": str(f),
            "reward": [{"name": "trl_task_reward:accuracy_reward"}],
            "perf.device": "cpu",
            "train.max_steps": 2,
            "train.batch_size": 8,
            "grpo.num_generations": 4,
            "grpo.max_completion_length": 8,
            "train.eval_interval": 0,
            "run.plots": False,
        },
        "space": {"optim.lr": [1e-3, 3e-3]},
        "metric": {"name": "reward_mean", "goal": "max"},
        "dir": str(tmp_path / "sweep"),
        "poll_s": 0.2,
    }
    if executor == "lanes":
        spec |= {"executor": "lanes", "lanes": 2}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert run_sweep(load_spec(tmp_path / "spec.yaml"), out=lambda _: None) == {"completed": 2}
    train = [c for c in check_calls(log, truth) if c["n"] % 8 == 0]
    # 2 steps of 8 completions for each trial (lanes: a call holds both lanes' rows)
    assert sum(c["n"] for c in train) == 32


CHAT_REWARD = """
import json, os


def assistant_words(completions, prompts, topic, **kwargs):
    # TRL's conversational form: the prompt's messages, the assistant's message
    with open(os.environ["SEEN_LOG"], "a") as f:
        f.write(json.dumps({"prompts": prompts, "completions": completions, "topic": topic}) + "\\n")
    return [float(len(c[0]["content"].split())) for c in completions]
"""


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_prompts_train_on_each_family_with_trl_s_conversational_form(
    replica_dir, family, tmp_path, monkeypatch
):
    """One GRPO step on chat-message prompts of each family's replica: the reward gets each
    prompt's messages, its `topic`, and the completions as the assistant's messages."""
    questions = ["two plus two", "a red fruit", "say hello", "the sky"]
    rows = [
        {"prompt": [{"role": "user", "content": q}], "topic": i} for i, q in enumerate(questions)
    ]
    f, log = _task(tmp_path, monkeypatch, rows, "chat_reward", CHAT_REWARD)
    summary = api.grpo(
        None,
        [
            f"model.path={replica_dir}",
            f"grpo.prompts_file={f}",
            "train.max_steps=1",
            "train.batch_size=4",
            "grpo.num_generations=2",
            "grpo.max_completion_length=4",
            "train.eval_interval=0",
            "train.save_interval=0",
            "reward=[{name: chat_reward:assistant_words}]",
            "run.plots=false",
            f"run.dir={tmp_path / 'run'}",
        ],
    )
    assert summary["status"] == "completed"
    seen = calls(log)
    assert len(seen) == 2  # the reward check, then the step
    for c in seen:
        for p, comp, t in zip(c["prompts"], c["completions"], c["topic"], strict=True):
            assert p == rows[t]["prompt"]
            assert len(comp) == 1 and comp[0]["role"] == "assistant"
            assert isinstance(comp[0]["content"], str)


def test_word_problems_as_data_give_the_text_form_s_rewards_step_for_step(tmp_path):
    """The word-problem task as text (the reward parses each prompt) and as data (the reward
    reads the `answer` column): the same seed gives the same rewards, step for step, on a micro
    model that learnt the task's corpus well enough to get some answers right."""
    from smollab.data.word_problems import write_all
    from smollab.rundir.runs import read_metrics

    d = tmp_path / "wp"
    write_all(d, prompts=64, heldout=16, corpus=3000, stories=100, sft=0)
    model = tmp_path / "base"
    api.pretrain(
        None,
        [
            "model.preset=micro",
            f"data.dir={tmp_path / 'data'}",
            "data.source=files",
            f"data.files=[{d / 'corpus.txt'}]",
            "data.tokenizer=bpe",
            "data.vocab_size=300",
            "train.max_steps=150",
            "train.batch_size=16",
            "train.seq_len=48",
            "optim.lr=1e-2",
            "optim.warmup_steps=5",
            "train.eval_interval=0",
            "run.plots=false",
            f"run.dir={model}",
        ],
    )
    runs = {}
    for form in ("txt", "jsonl"):
        runs[form] = tmp_path / form
        api.grpo(
            "configs/grpo/word-problems.yaml",
            [
                f"model.path={model}",
                f"data.dir={tmp_path / 'data'}",
                f"grpo.prompts_file={d / f'prompts.{form}'}",
                f"grpo.eval_prompts_file={d / f'heldout.{form}'}",
                "train.max_steps=6",
                "train.batch_size=16",
                "grpo.num_generations=4",
                "grpo.max_completion_length=10",
                "train.eval_interval=3",
                "grpo.eval_prompts=8",
                "train.save_interval=0",
                "grpo.log_samples=16",
                "run.plots=false",
                f"run.dir={runs[form]}",
            ],
        )
    text, table = (read_metrics(runs[f] / "metrics.csv") for f in ("txt", "jsonl"))
    for key in ("reward_mean", "eval_reward_mean", "loss", "kl"):
        assert [r[key] for r in text] == [r[key] for r in table], key
    assert max(r["reward_mean"] for r in text) > 0  # some answers right: not a vacuous match
    samples = [
        [json.loads(x) for x in (runs[f] / "samples.jsonl").read_text().splitlines()]
        for f in ("txt", "jsonl")
    ]
    assert [s["reward"] for s in samples[0]] == [s["reward"] for s in samples[1]]
    assert all("answer" in s for s in samples[1])  # the column the reward read


def _readme_block(after: str, lang: str) -> str:
    text = (Path(SRC).parent / "README.md").read_text()
    section = text[text.index(after) :]
    start = section.index(f"```{lang}\n") + len(lang) + 4
    return section[start : section.index("```", start)]


def test_the_readme_s_own_task_runs_as_written(replicas, tmp_path, monkeypatch):
    """The README's 10-line JSONL and TRL-signature reward, with its command's keys, on the
    offline Qwen2.5 replica (its model and budget scaled down)."""
    rows = _readme_block("## Your own task", "")
    assert len(rows.splitlines()) == 10
    (tmp_path / "task.jsonl").write_text(rows)
    reward = _readme_block("`my_rewards.py`", "python")
    assert len(reward.strip().splitlines()) == 5
    (tmp_path / "my_rewards.py").write_text(reward)
    command = _readme_block("`my_rewards.py`", "bash")
    assert "grpo.prompts_file=task.jsonl" in command and "my_rewards:accuracy_reward" in command
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    summary = api.grpo(
        None,
        [
            f"model.path={replicas('qwen2.5')}",
            "model.lora.enabled=true",
            "grpo.prompts_file=task.jsonl",
            "data.eval_fraction=0.2",
            "train.epochs=1",
            "grpo.system_prompt=Answer with the number only.",
            "reward=[{name: my_rewards:accuracy_reward}]",
            "train.batch_size=8",
            "grpo.num_generations=4",
            "grpo.max_completion_length=4",
            "train.eval_interval=2",
            "train.save_interval=0",
            "run.plots=false",
            "run.dir=run",
        ],
    )
    assert summary["status"] == "completed" and summary["steps"] == 4  # 8 prompts, 2 a step
    assert "held out: 2 rows carved out" in (tmp_path / "run" / "training.log").read_text()


def test_the_wordle_recipes_run_on_their_data(replicas, micro_model, micro_data, tmp_path):
    """Both Wordle recipes, scaled down: the small model's on text games, the chat model's (LoRA,
    epochs) on chat games of the Qwen2.5 replica; then whole games of each."""
    from smollab.data.wordle_games import write_games

    for chat, recipe, model in (
        (False, "wordle", micro_model),
        (True, "wordle-chat-lora", replicas("qwen2.5")),
    ):
        train, held = tmp_path / f"{recipe}-train.jsonl", tmp_path / f"{recipe}-held.jsonl"
        write_games(train, 4, seed=0, chat=chat)
        write_games(held, 2, seed=1, chat=chat)
        budget = ["train.epochs=1"] if chat else ["train.max_steps=2"]
        run = tmp_path / recipe
        summary = api.grpo(
            recipe,
            [
                f"model.path={model}",
                *([] if chat else [f"data.dir={micro_data}"]),
                f"grpo.prompts_file={train}",
                f"grpo.eval_prompts_file={held}",
                *budget,
                "train.batch_size=4",
                "grpo.num_generations=2",
                "grpo.max_completion_length=6",
                "grpo.eval_prompts=2",
                "train.eval_interval=2",
                "train.save_interval=0",
                "run.plots=false",
                f"run.dir={run}",
            ],
        )
        assert summary["status"] == "completed" and summary["steps"] == 2
        samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
        assert all({"secret", "past_guess_history"} <= set(s) for s in samples)
        report = api.wordle_games(str(run), 2, max_turns=2, max_new_tokens=6, device="cpu")
        assert report["prompts"] == ("chat" if chat else "text") and report["games"] == 2
