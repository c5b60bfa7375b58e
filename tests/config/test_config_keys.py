"""Every config key is honoured or refused: each key of a command's schema is read when that
command runs, and each key another command reads is refused by this one with its reason.

Reads are recorded by replacing `Section.__getattribute__` while micro runs of every command
go through the real CLI in-process; sections are mapped to dotted paths from the resolved
config, so a read of `cfg.train.max_steps` counts for `train.max_steps`. Recording starts after
the config is validated (the rules across keys read fields too, and that is not honouring them).
`model_dump` (hence `to_dict` and the data directory's fingerprint) reads no field through
`__getattribute__`, so writing a key down never counts as reading it.
"""

from __future__ import annotations

import contextlib
import json
import typing

import pytest

from smollab.cli import main
from smollab.config import SCHEMAS, Section
from smollab.config import load as config
from smollab.config.load import set_dotted, to_dict, validate
from smollab.config.not_read import NOT_READ, not_read
from smollab.errors import UserError

# Keys that only a path these tests cannot take reads, and why.
UNREACHABLE = {
    "data.max_stories": "only a hub source (simplestories, tinystories) reads it: a download",
}


def leaf_keys(schema: type[Section], prefix: str = "") -> set[str]:
    """Every dotted key that holds a value; a list of sections (reward) counts its items' keys."""
    out: set[str] = set()
    for name, field in schema.model_fields.items():
        ann = field.annotation
        item = typing.get_args(ann)[0] if typing.get_origin(ann) is list else None
        sub = ann if isinstance(ann, type) and issubclass(ann, Section) else None
        sub = sub or (item if isinstance(item, type) and issubclass(item, Section) else None)
        out |= leaf_keys(sub, f"{prefix}{name}.") if sub else {prefix + name}
    return out


def section_paths(cfg: Section, prefix: str = "") -> dict[int, str]:
    """id(section object) -> its dotted prefix in the resolved config."""
    out = {id(cfg): prefix}
    for name in type(cfg).model_fields:
        value = cfg.__dict__[name]
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, Section):
                out |= section_paths(v, f"{prefix}{name}.")
    return out


class Recorder:
    """Notes (id(section), field) for each field read while `active`."""

    def __init__(self) -> None:
        self.reads: set[tuple[int, str]] = set()
        self.configs: list[Section] = []
        self.active = False

    def keys(self) -> set[str]:
        paths: dict[int, str] = {}
        for cfg in self.configs:
            paths |= section_paths(cfg)
        return {paths[i] + name for i, name in self.reads if i in paths}


@contextlib.contextmanager
def recording(monkeypatch):
    rec = Recorder()
    real_load = config.load_config

    def spy(self, name):
        if rec.active and name in type(self).model_fields:
            rec.reads.add((id(self), name))
        return object.__getattribute__(self, name)

    def load_config(*a, **k):  # the CLI imports it at call time: this is what it gets
        cfg = real_load(*a, **k)
        rec.configs.append(cfg)
        rec.active = True
        return cfg

    monkeypatch.setattr(Section, "__getattribute__", spy)
    monkeypatch.setattr(config, "load_config", load_config)
    try:
        yield rec
    finally:
        rec.active = False
        monkeypatch.undo()


def _story_files(tmp_path) -> list[str]:
    """A .jsonl corpus (texts under the default text_key, `story`) and a .txt one."""
    from smollab.data.stories import generate_stories

    stories = generate_stories(300, seed=1)
    jl, txt = tmp_path / "stories.jsonl", tmp_path / "more.txt"
    jl.write_text("".join(json.dumps({"story": s}) + "\n" for s in stories[:200]))
    txt.write_text("\n\n".join(stories[200:]))
    return [str(jl), str(txt)]


def _sft_runs(tmp, micro_model) -> list[list[str]]:
    """Full fine-tuning on a file with a carved held-out part, packed, through a loader worker,
    for epochs; LoRA on a `datasets` directory (text records, its test split) and a file pair
    with fields of other names."""
    from smollab.data.stories import generate_stories

    stories = generate_stories(40, seed=2)
    pairs = [{"q": " ".join(s.split()[:6]), "a": " " + " ".join(s.split()[6:14])} for s in stories]
    jl, ev, ds = tmp / "sft.jsonl", tmp / "sft_eval.jsonl", tmp / "sft_ds"
    jl.write_text(
        "".join(json.dumps({"prompt": p["q"], "completion": p["a"]}) + "\n" for p in pairs)
    )
    ds.mkdir()
    for name, part in (("train", stories[:30]), ("test", stories[30:])):
        (ds / f"{name}.jsonl").write_text("".join(json.dumps({"story": t}) + "\n" for t in part))
    (tmp / "sft_q.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs[:30]))
    ev.write_text("".join(json.dumps(p) + "\n" for p in pairs[30:]))
    common = [
        f"model.path={micro_model}",
        "train.batch_size=4",
        "train.seq_len=32",
        "train.eval_interval=2",
        "train.save_interval=2",
        "train.keep_last=1",
        "train.log_interval=1",
        "optim.warmup_steps=1",
    ]
    return [
        [
            "sft",
            *common,
            f"data.train_file={jl}",
            "data.eval_fraction=0.2",
            "data.seed=1",
            "sft.packing=true",
            "data.num_workers=1",
            "data.prefetch_factor=2",
            "train.epochs=0.5",
            f"run.dir={tmp / 'sft1'}",
        ],
        [
            "sft",
            *common,
            "train.max_steps=3",
            "model.lora.enabled=true",
            "model.lora.r=2",
            f"data.hf_dataset={ds}",
            "data.split=train",
            "data.eval_split=test",
            "data.text_field=story",
            "sft.completion_only_loss=false",
            "run.name=keys-sft",
        ],
        [
            "sft",
            *common,
            "train.max_steps=3",
            f"data.train_file={tmp / 'sft_q.jsonl'}",
            f"data.eval_file={ev}",
            "data.prompt_field=q",
            "data.completion_field=a",
            "optim.schedule=wsd",
            "optim.decay_fraction=0.5",
            f"run.dir={tmp / 'sft3'}",
        ],
    ]


def _rft_runs(tmp, micro_model) -> list[list[str]]:
    """Full fine-tuning restarted from the base each round, top 2 per prompt, sampled
    evaluation, epochs and packing; LoRA from the last model by steps, a threshold, wsd, the
    default run directory."""
    from smollab.data.stories import generate_stories

    openings = [" ".join(s.split()[:4]) for s in generate_stories(9, seed=4)]
    (tmp / "rft_train.txt").write_text("\n".join(openings[:6]) + "\n")
    (tmp / "rft_eval.txt").write_text("\n".join(openings[6:]) + "\n")
    (tmp / "rft_train.jsonl").write_text(
        "".join(json.dumps({"prompt": p, "topic": i % 2}) + "\n" for i, p in enumerate(openings))
    )
    ds = tmp / "rft_ds"
    ds.mkdir()
    for name, part in (("train", openings[:6]), ("test", openings[6:])):
        (ds / f"{name}.jsonl").write_text("".join(json.dumps({"q": p}) + "\n" for p in part))
    common = [
        "rft",
        f"model.path={micro_model}",
        "rft.rounds=2",
        "rft.oversample=3",
        "rft.max_new_tokens=6",
        "rft.gen_batch_size=4",
        "train.batch_size=4",
        "train.seq_len=32",
        "train.log_interval=1",
        "train.save_interval=2",
        "train.keep_last=1",
        "optim.warmup_steps=1",
    ]
    return [
        [
            *common,
            f"rft.prompts_file={tmp / 'rft_train.jsonl'}",
            "data.eval_fraction=0.3",
            "data.seed=2",
            "rft.restart_from=base",
            "rft.keep.threshold=null",
            "rft.keep.top_k=2",
            "rft.dedup=false",
            "rft.temperature=1.2",
            "rft.top_p=0.9",
            "rft.eval_temperature=1.0",
            "rft.eval_samples=2",
            "rft.accuracy_reward=sentence_length",
            "reward=[{name: sentence_length, weight: 2.0, params: {target: 3}}]",
            "train.epochs=0.5",
            "sft.packing=true",
            "sft.completion_only_loss=false",
            f"run.dir={tmp / 'rft1'}",
        ],
        [
            *common,
            f"data.hf_dataset={ds}",
            "data.split=train",
            "data.eval_split=test",
            "data.prompt_field=q",
            "rft.keep.threshold=-1000",
            "reward=[{name: sentence_length}]",
            "train.epochs=null",
            "train.max_steps=3",
            "train.max_time=600",
            "train.diverge_factor=50",
            "train.grad_accum=2",
            "model.lora.enabled=true",
            "model.lora.r=2",
            "model.lora.alpha=4",
            "model.lora.dropout=0.1",
            "model.lora.targets=[q,v]",
            "optim.schedule=wsd",
            "optim.decay_fraction=0.5",
            "run.name=keys-rft",
        ],
        [
            *common,
            f"rft.prompts_file={tmp / 'rft_train.txt'}",
            f"rft.eval_prompts_file={tmp / 'rft_eval.txt'}",
            "reward=[{name: sentence_length}]",
            "rft.rounds=1",
            "train.epochs=null",
            "train.max_steps=1",
            f"run.dir={tmp / 'rft3'}",
        ],
    ]


def _grpo_data_runs(tmp, micro_model, grpo: list[str]) -> list[list[str]]:
    """Prompts from data: a `datasets` directory with a prompt column of another name and a
    held-out split, for epochs; a .jsonl with a column and a carved held-out part."""
    from smollab.data.stories import generate_stories

    openings = [" ".join(s.split()[:5]) for s in generate_stories(12, seed=5)]
    ds = tmp / "grpo_ds"
    ds.mkdir()
    for name, part in (("train", openings[:8]), ("test", openings[8:])):
        (ds / f"{name}.jsonl").write_text("".join(json.dumps({"q": p}) + "\n" for p in part))
    jl = tmp / "grpo.jsonl"
    jl.write_text("".join(json.dumps({"prompt": p, "k": i}) + "\n" for i, p in enumerate(openings)))
    common = [a for a in grpo if not a.startswith("train.max_steps")]
    return [
        [
            "grpo",
            *common,
            f"model.path={micro_model}",
            f"data.hf_dataset={ds}",
            "data.split=train",
            "data.eval_split=test",
            "data.prompt_field=q",
            "train.epochs=0.5",
            f"run.dir={tmp / 'grpo4'}",
        ],
        [
            "grpo",
            *common,
            "train.max_steps=2",
            f"model.path={micro_model}",
            f"grpo.prompts_file={jl}",
            "data.eval_fraction=0.2",
            "data.seed=3",
            f"run.dir={tmp / 'grpo5'}",
        ],
    ]


MICRO = [
    "data.vocab_size=256",
    "train.max_steps=3",
    "train.eval_interval=2",
    "train.save_interval=2",
    "train.keep_last=1",
    "train.log_interval=1",
    "run.plots=false",
]


@pytest.fixture(scope="module")
def covered(micro_model, tmp_path_factory):
    """The keys each command read, over micro runs that reach every conditional read."""
    tmp = tmp_path_factory.mktemp("keys")
    files = _story_files(tmp)
    files_data = ["data.source=files", f"data.files=[{','.join(files)}]", "data.vocab_size=256"]
    pretrain = [
        "model.preset=micro",
        *MICRO,
        "train.batch_size=2",
        "train.seq_len=16",
        "train.eval_tokens=64",
        "optim.warmup_steps=1",
    ]
    grpo = [
        *MICRO,
        "train.batch_size=8",
        "grpo.num_generations=4",
        "grpo.max_completion_length=8",
        "grpo.eval_prompts=2",
        "optim.schedule=wsd",
        "optim.min_lr=1e-6",
        "optim.lr=1e-4",
    ]
    runs = {
        "data": [
            [
                "data",
                "prepare",
                f"data.dir={tmp / 'd1'}",
                "data.num_stories=100",
                "data.vocab_size=256",
            ],
            ["data", "prepare", f"data.dir={tmp / 'd2'}", *files_data],
        ],
        "pretrain": [  # offline data and cosine; files data, wsd and the default run dir
            [
                "pretrain",
                *pretrain,
                f"data.dir={tmp / 'p1'}",
                "data.num_stories=400",
                f"run.dir={tmp / 'pre1'}",
            ],
            [
                "pretrain",
                *pretrain,
                f"data.dir={tmp / 'p2'}",
                *files_data[:2],
                "optim.schedule=wsd",
                "optim.decay_fraction=0.5",
                "run.name=keys",
            ],
        ],
        "grpo": [  # full fine-tuning with a failure flagged; LoRA on a preset and files data,
            # each batch used twice
            [
                "grpo",
                *grpo,
                f"model.path={micro_model}",
                f"data.dir={tmp / 'g1'}",
                "data.num_stories=400",
                f"run.dir={tmp / 'grpo1'}",
                "failure.max_jaccard=0",
                "failure.patience=1",
                "failure.action=flag",
            ],
            [
                "grpo",
                *grpo,
                "model.preset=micro",
                f"data.dir={tmp / 'g2'}",
                *files_data[:2],
                "model.lora.enabled=true",
                "model.lora.r=2",
                "grpo.export_merged=true",
                "grpo.num_iterations=2",
                "grpo.epsilon_high=0.3",
                "run.name=keys",
            ],
            # gradient routing, every key of grpo.routing set
            [
                "grpo",
                *grpo,
                f"model.path={micro_model}",
                f"data.dir={tmp / 'g1'}",
                "data.num_stories=400",
                f"run.dir={tmp / 'grpo3'}",
                "grpo.routing.enabled=true",
                "grpo.routing.mode=exclusive",
                "grpo.routing.retain_r=2",
                "grpo.routing.retain_alpha=4",
                "grpo.routing.forget_r=1",
                "grpo.routing.forget_alpha=2",
                "grpo.routing.targets=[q,v]",
                "grpo.routing.layer_stride=2",
                "grpo.routing.detector.name=happy_count",
                "grpo.routing.detector.params={}",
                "grpo.routing.detector.threshold=1",
                "grpo.routing.hack_reward=happy_binary",
                "grpo.routing.rh_eligible_frac=0.5",
                "grpo.routing.eligibility=completion",
                "grpo.routing.gate_flags=true",
                "grpo.routing.reward_cap=1.0",
                "grpo.routing.routing_frac=0.5",
                "grpo.routing.label_noise_frac=0.1",
                "grpo.routing.ablated_frac=0.5",
                "grpo.routing.retain_advantage=positive",
                "grpo.routing.eval_interval=2",
                "grpo.routing.eval_prompts=2",
                "grpo.routing.eval_forget_scales=[0.5]",
            ],
            # gradient routing's penalty mode: its own key, read by its two passes
            [
                "grpo",
                *grpo,
                f"model.path={micro_model}",
                f"data.dir={tmp / 'g1'}",
                "data.num_stories=400",
                f"run.dir={tmp / 'grpo_penalty'}",
                "grpo.routing.enabled=true",
                "grpo.routing.retain_r=2",
                "grpo.routing.forget_r=2",
                "grpo.routing.retain_advantage=penalty",
                "grpo.routing.retain_penalty=0.5",
                "grpo.routing.eval_interval=0",
            ],
        ],
    }
    runs["grpo"] += _grpo_data_runs(tmp, micro_model, grpo)
    runs["sft"] = _sft_runs(tmp, micro_model)
    runs["rft"] = _rft_runs(tmp, micro_model)
    out: dict[str, set[str]] = {}
    mp = pytest.MonkeyPatch()
    mp.chdir(tmp)  # run.name without run.dir: runs/<name> under here
    try:
        for command, argvs in runs.items():
            out[command] = set()
            for argv in argvs:
                with recording(pytest.MonkeyPatch()) as rec:
                    assert main(argv) == 0, argv
                out[command] |= rec.keys()
    finally:
        mp.undo()
    return out


@pytest.mark.parametrize("command", sorted(SCHEMAS))
def test_every_key_of_the_schema_is_read(covered, command):
    unread = leaf_keys(SCHEMAS[command]) - covered[command] - set(UNREACHABLE)
    assert not unread, f"{command} accepts keys it never read: {sorted(unread)}"


def _any_value(key: str):
    """A valid value of `key` from a schema that has it (its default)."""
    for schema in SCHEMAS.values():
        if key in leaf_keys(schema):
            tree = to_dict(schema())
            for part in key.split("."):
                tree = tree[0] if isinstance(tree, list) else tree
                tree = tree[part]
            return tree
    raise KeyError(key)


@pytest.mark.parametrize("command", sorted(SCHEMAS))
def test_keys_of_other_commands_are_refused_with_the_reason(command):
    known = leaf_keys(SCHEMAS[command])
    others = set().union(*(leaf_keys(s) for s in SCHEMAS.values())) - known
    assert others  # every command lacks some key another one has
    for key in sorted(others):
        assert not_read(command, key), f"not_read.NOT_READ[{command!r}] lacks {key}"
        tree: dict = {}
        set_dotted(tree, key, _any_value(key))
        with pytest.raises(UserError) as e:
            validate(SCHEMAS[command], tree)
        msg = str(e.value)
        assert msg.startswith(f"config key {key}: {command} does not read it (") and "\n" not in msg


def test_the_table_names_no_key_its_command_reads():
    every = set().union(*(leaf_keys(s) for s in SCHEMAS.values()))
    for command, table in NOT_READ.items():
        known = leaf_keys(SCHEMAS[command])
        for entry in table:
            under = {k for k in every if k == entry or k.startswith(entry + ".")}
            assert under, f"NOT_READ[{command!r}][{entry!r}] names no key of any command"
            assert not under & known, f"{command} reads {sorted(under & known)}"


def test_model_dump_is_no_read_and_a_field_read_is(monkeypatch):
    cfg = config.load_config("grpo", None, ["model.lora.enabled=true"])
    with recording(monkeypatch) as rec:
        rec.configs.append(cfg)
        rec.active = True
        to_dict(cfg)
        cfg.model_dump()
        assert rec.keys() == set()
        assert cfg.model.lora.r == 8 and cfg.reward[0].name == "happy_binary"
        assert rec.keys() & leaf_keys(SCHEMAS["grpo"]) == {"model.lora.r", "reward.name"}


def _without(overrides: list[str], *keys: str) -> list[str]:
    return [o for o in overrides if o.split("=", 1)[0] not in keys]


def test_zero_intervals_turn_evaluation_and_checkpoints_off(micro_pretrain, micro_grpo, tmp_path):
    from smollab.config.load import load_config
    from smollab.rundir.runs import RunView
    from smollab.train import pretrain
    from smollab.train.grpo import run as grpo

    off = ["train.eval_interval=0", "train.save_interval=0"]
    s = pretrain.train(
        load_config(
            "pretrain",
            None,
            [*_without(micro_pretrain, "train.eval_tokens"), *off, "train.max_steps=7"],
        )
    )
    run = RunView(tmp_path / "run")
    assert s["status"] == "completed" and s["final_val_loss"] is None and s["best_val_loss"] is None
    assert [int(r["step"]) for r in run.metrics()] == [1, 5, 7]  # the last step is logged
    assert all(r["val_loss"] is None for r in run.metrics())
    assert sorted(p.name for p in run.checkpoints_dir.iterdir()) == ["final"]  # no best/, step_N/
    s = grpo.train(
        load_config(
            "grpo", None, [*_without(micro_grpo, "grpo.eval_prompts"), *off, "train.max_steps=3"]
        )
    )
    run = RunView(tmp_path / "grpo")
    assert s["status"] == "completed" and s["base_eval_reward"] is None
    assert all(r["eval_reward_mean"] is None for r in run.metrics())
    assert sorted(p.name for p in run.checkpoints_dir.iterdir()) == ["final"]


def test_a_rerun_with_another_config_stops_and_never_starts_over(micro_pretrain, tmp_path, capsys):
    args = ["pretrain", *micro_pretrain, "train.max_steps=4"]
    assert main(args) == 0
    capsys.readouterr()
    assert main([*args, "optim.lr=3e-3"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "holds a run with another config (optim.lr 0.01 -> 0.003)" in err
    )
    assert main([*args, "optim.lr=3e-3", "run.resume=never"]) == 0
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text())["optim"]["lr"] == 3e-3
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"
    assert main([*args, "optim.lr=3e-3"]) == 0  # the same config again: its result stands
    assert "already completed; nothing to do" in capsys.readouterr().out


def test_grpo_refuses_data_keys_its_prepared_directory_contradicts(micro_grpo, micro_data, capsys):
    """GRPO uses a prepared data.dir as it is: a data key set to something else is refused."""
    from smollab.config import DataConfig
    from smollab.data.prepare import ensure_prepared

    assert main(["grpo", *micro_grpo, "data.num_stories=1000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"data.num_stories=1000: data.dir {micro_data} was prepared with 400" in err
    # the same values, and keys left at their defaults, are fine
    cfg = DataConfig(dir=str(micro_data), num_stories=400, vocab_size=256)
    assert ensure_prepared(cfg, exact=False)["vocab_size"] == 256
