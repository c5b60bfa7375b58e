"""The bad-input suite: every command, given a bad config, override, recipe, spec, setting, file,
model, or reward, stops with one line naming the culprit and a non-zero exit, and leaves nothing
behind (no run directory, no partial file).

Each case runs `smollab` in-process from an empty working directory and compares the files under
it before and after. A few pure-config cases, and a missing model or prompts file, also run as
a process, to show they stop before torch is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from smollab.cli import main
from tests.conftest import MICRO_DATA

BAD_REWARDS = """
import time

def boom(completions, **kwargs):
    raise ZeroDivisionError("division by zero")

def nan(completions, **kwargs):
    return [float("nan")] * len(completions)

def short(completions, **kwargs):
    return [1.0]

def text(completions, **kwargs):
    return ["good"] * len(completions)

def hang(completions, **kwargs):
    time.sleep(3600)

def needs(completions, level, **kwargs):
    return [0.0] * len(completions)

def strict(completions, prompts, completion_ids):
    return [0.0] * len(completions)
"""

# A valid sweep spec; each bad one changes one thing.
SPEC = (
    b"command: pretrain\nbase: ok.yaml\nmetric: {name: val_loss, goal: min}\n"
    b"space: {optim.lr: [0.1, 0.2]}\n"
)

# Files each case may name, written into the working directory before it runs.
FILES: dict[str, bytes] = {
    "broken.yaml": b"optim: [1, 2\n",
    "list.yaml": b"- optim\n- train\n",
    "ok.yaml": b"optim:\n  lr: 0.001\n",
    "latin1.txt": "Caf\xe9 stories\n".encode("latin-1"),
    "empty.txt": b"\n\n",
    "stories.jsonl": b'{"text": "Once upon a time."}\n',
    "badjson.jsonl": b'{"story": "Once upon a time."\n',
    "notes.md": b"# not a corpus\n",
    "spec_overrides_list.yaml": SPEC + b"overrides: [optim.lr=1]\n",
    "spec_storage.yaml": SPEC + b"storage: mongodb://x/y\n",
    "spec_space.yaml": SPEC.replace(b"[0.1, 0.2]", b"0.1"),
    "spec_base.yaml": SPEC.replace(b"ok.yaml", b"nope.yaml"),
    "spec_key.yaml": SPEC.replace(b"optim.lr:", b"optim.lrr:"),
    "spec_metric.yaml": SPEC.replace(b"goal: min", b"goal: up"),
    "nomodel/readme.txt": b"no config.json here\n",
    "prompts.txt": b"Once upon a time\n",
    "ok_spec.yaml": SPEC,
    "spec_pg.yaml": SPEC + b"storage: postgresql://smol@127.0.0.1:1/nodb\n",
    "spec_min_lr.yaml": SPEC + b"overrides: {optim.min_lr: 0.15}\n",
    "spec_pbt.yaml": SPEC
    + b"sampler: pbt\npbt: {population: 2, interval: 5, budget: 10, perturb: {optim.lr: [2]}}\n",
    "spec_grpo.yaml": (
        b"command: grpo\nbase: happy\nmetric: {name: reward_mean, goal: max}\n"
        b"space: {optim.lr: [0.1, 0.2]}\n"
    ),
    "task.jsonl": b'{"prompt": "once upon a time", "solution": "a"}\n'
    b'{"prompt": "one day", "solution": "b"}\n',
    "noprompt.jsonl": b'{"question": "once upon a time", "solution": "a"}\n',
    "nothing.jsonl": b"",
    "roles.jsonl": b'{"prompt": [{"role": "narrator", "content": "once"}]}\n',
    "chat.jsonl": b'{"prompt": [{"role": "user", "content": "once upon a time"}]}\n',
    "dsdir/train.jsonl": b'{"prompt": "once upon a time"}\n{"prompt": "one day"}\n',
}

# (name, argv, the text the error line must contain); {model} {data} are the micro fixtures'.
CASES: list[tuple[str, list[str], str]] = [
    # ---- configs and recipes
    ("missing recipe", ["pretrain", "nope.yaml"], "nope.yaml"),
    ("invalid YAML", ["pretrain", "broken.yaml"], "broken.yaml"),
    ("recipe not a mapping", ["pretrain", "list.yaml"], "list.yaml"),
    ("unknown key", ["pretrain", "optim.lrr=1e-3"], "optim.lrr"),
    ("wrong type", ["pretrain", "train.max_steps=many"], "train.max_steps"),
    ("out of range", ["pretrain", "optim.lr=-1"], "optim.lr"),
    ("unknown choice", ["pretrain", "perf.precision=fp8"], "perf.precision"),
    ("min_lr above lr", ["pretrain", "optim.lr=1e-3", "optim.min_lr=1e-2"], "optim.min_lr"),
    ("lr infinite", ["pretrain", "optim.lr=inf"], "optim.lr"),
    ("float key NaN", ["grpo", "grpo.beta=.nan"], "grpo.beta"),
    ("time limit infinite", ["grpo", "train.max_time=.inf"], "train.max_time"),
    (
        "min_lr beside min_lr_ratio",
        ["pretrain", "optim.min_lr=1e-5", "optim.min_lr_ratio=0.1"],
        "optim.min_lr_ratio",
    ),
    ("key grpo does not read", ["grpo", "train.seq_len=64"], "train.seq_len"),
    ("grad_accum splits a group", ["grpo", "train.grad_accum=3"], "train.grad_accum=3"),
    ("key pretrain does not read", ["pretrain", "model.lora.enabled=true"], "model.lora"),
    ("set but unused", ["grpo", "model.lora.r=16"], "model.lora"),
    ("batch not a multiple of groups", ["grpo", "train.batch_size=6"], "grpo.num_generations"),
    ("data key in pretrain's sibling", ["data", "prepare", "optim.lr=1"], "optim"),
    # ---- overrides
    ("override without =", ["pretrain", "ok.yaml", "optim.lr"], "optim.lr"),
    ("override into a value", ["pretrain", "optim=3", "optim.lr=1"], "optim"),
    ("override with a space", ["pretrain", "optim. lr=1"], "optim. lr"),
    ("unknown schema for config show", ["config", "show", "--command", "nope"], "--command"),
    # ---- data files
    ("files without files", ["data", "prepare", "data.dir=d", "data.source=files"], "data.files"),
    (
        "missing data file",
        ["data", "prepare", "data.dir=d", "data.source=files", "data.files=[gone.txt]"],
        "gone.txt",
    ),
    (
        "data file not UTF-8",
        ["data", "prepare", "data.dir=d", "data.source=files", "data.files=[latin1.txt]"],
        "latin1.txt",
    ),
    (
        "data file of no stories",
        ["data", "prepare", "data.dir=d", "data.source=files", "data.files=[empty.txt]"],
        "empty.txt",
    ),
    (
        "data file of another kind",
        ["data", "prepare", "data.dir=d", "data.source=files", "data.files=[notes.md]"],
        "notes.md",
    ),
    (
        "jsonl without the text key",
        ["data", "prepare", "data.dir=d", "data.source=files", "data.files=[stories.jsonl]"],
        "story",
    ),
    (
        "jsonl that does not parse",
        ["data", "prepare", "data.dir=d", "data.source=files", "data.files=[badjson.jsonl]"],
        "badjson.jsonl",
    ),
    (
        "vocabulary too small",
        ["data", "prepare", "data.dir=d", "data.vocab_size=8"],
        "data.vocab_size",
    ),
    # ---- models
    ("model path that does not exist", ["grpo", "model.path=./gone", "data.dir={data}"], "gone"),
    ("model dir without a model", ["grpo", "model.path=nomodel", "data.dir={data}"], "nomodel"),
    ("unknown preset", ["pretrain", "model.preset=gpt5"], "gpt5"),
    # a model not made yet, or not on a Hub that does not answer: one line naming model.path
    # and what makes it, before anything is written (for every command that loads one)
    ("grpo before its base is pretrained", ["grpo", "happy"], "smollab pretrain configs/"),
    ("grpo on a Hub id no one serves", ["grpo", "model.path=nobody/nothing"], "nobody/nothing"),
    (
        "sft before its base is pretrained",
        ["sft", "story-continuation"],
        "smollab pretrain configs/pretrain/simplestories-1.25m.yaml",
    ),
    (
        "rft on a missing model",
        [
            "rft",
            "model.path=runs/simplestories-1.25m",
            "rft.prompts_file=prompts.txt",
            "rft.eval_prompts_file=prompts.txt",
            "reward=[{name: happy_binary}]",
        ],
        "model.path runs/simplestories-1.25m",
    ),
    (
        "lanes before their base is pretrained",
        ["lanes", "grpo", "happy", "--lane", "optim.lr=1e-4"],
        "model.path runs/simplestories-1.25m",
    ),
    (
        "sample of a run not made",
        ["sample", "runs/simplestories-1.25m", "--prompt", "x"],
        "make it with: smollab pretrain configs/pretrain/simplestories-1.25m.yaml",
    ),
    ("sweep whose trials lack their base", ["sweep", "spec_grpo.yaml", "dir=s"], "model.path"),
    ("probe whose runs lack their base", ["probe", "grpo-1.25m-full", "dir=p"], "model.path"),
    ("bench whose variants lack their base", ["bench", "happy", "--out", "b"], "model.path"),
    (
        "context too short",
        [
            "pretrain",
            "model.preset=micro",
            "data.dir={data}",
            *MICRO_DATA,
            "train.seq_len=100000",
            "run.dir=r",
        ],
        "train.seq_len",
    ),
    # ---- prompts files
    (
        "prompts file missing",
        ["grpo", "model.path={model}", "data.dir={data}", "grpo.prompts_file=gone.txt"],
        "gone.txt",
    ),
    (
        "prompts file missing, and the model too",
        ["grpo", "sentence-length-10", "grpo.prompts_file=gone.txt"],
        "grpo.prompts_file: no such file gone.txt",
    ),
    (
        "prompts file not UTF-8",
        ["grpo", "model.path={model}", "data.dir={data}", "grpo.prompts_file=latin1.txt"],
        "latin1.txt",
    ),
    (
        "prompts file empty",
        ["grpo", "model.path={model}", "data.dir={data}", "grpo.prompts_file=empty.txt"],
        "empty.txt",
    ),
    # ---- prompts from data
    (
        "prompts without a prompt column",
        ["grpo", "model.path={model}", "data.dir={data}", "grpo.prompts_file=noprompt.jsonl"],
        "'prompt' column",
    ),
    (
        "prompts table empty",
        ["grpo", "model.path={model}", "data.dir={data}", "grpo.prompts_file=nothing.jsonl"],
        "empty",
    ),
    (
        "a message of an unknown role",
        ["grpo", "model.path={model}", "data.dir={data}", "grpo.prompts_file=roles.jsonl"],
        "narrator",
    ),
    (
        "chat prompts on a model without a chat template",
        ["grpo", "model.path={model}", "data.dir={data}", "grpo.prompts_file=chat.jsonl"],
        "no chat template",
    ),
    (
        "chat prompts on a model without a chat template (rft)",
        [
            "rft",
            "model.path={model}",
            "rft.prompts_file=chat.jsonl",
            "rft.eval_prompts_file=chat.jsonl",
            "reward=[{name: happy_binary}]",
        ],
        "no chat template",
    ),
    (
        "a split the dataset does not have",
        ["grpo", "model.path={model}", "data.dir={data}", "data.hf_dataset=dsdir", "data.split=x"],
        "split",
    ),
    (
        "a reward parameter no column gives",
        [
            "grpo",
            "model.path={model}",
            "data.dir={data}",
            "grpo.prompts_file=task.jsonl",
            "reward=[{name: bad_rewards:needs}]",
        ],
        "no column 'level'",
    ),
    (
        "a column no reward parameter takes",
        [
            "grpo",
            "model.path={model}",
            "data.dir={data}",
            "grpo.prompts_file=task.jsonl",
            "reward=[{name: bad_rewards:strict}]",
        ],
        "no parameter for column 'solution'",
    ),
    # ---- rewards
    ("unknown reward", ["grpo", "reward=[{name: hapy_binary}]"], "hapy_binary"),
    ("reward module missing", ["grpo", "reward=[{name: no_such_mod:f}]"], "no_such_mod"),
    ("reward function missing", ["grpo", "reward=[{name: bad_rewards:gone}]"], "gone"),
    ("reward param unknown", ["grpo", "reward=[{name: happy_binary, params: {x: 1}}]"], "x"),
    ("reward param missing", ["grpo", "reward=[{name: bad_rewards:needs}]"], "level"),
    (
        "reward weight not finite",
        ["grpo", "reward=[{name: happy_binary, weight: .nan}]"],
        "weight",
    ),
    (
        "reward that raises",
        ["grpo", "model.path={model}", "data.dir={data}", "reward=[{name: bad_rewards:boom}]"],
        "ZeroDivisionError",
    ),
    (
        "reward of NaN",
        ["grpo", "model.path={model}", "data.dir={data}", "reward=[{name: bad_rewards:nan}]"],
        "nan",
    ),
    (
        "reward of the wrong length",
        ["grpo", "model.path={model}", "data.dir={data}", "reward=[{name: bad_rewards:short}]"],
        "1 values",
    ),
    (
        "reward of text",
        ["grpo", "model.path={model}", "data.dir={data}", "reward=[{name: bad_rewards:text}]"],
        "bad_rewards:text",
    ),
    (
        "reward that hangs",
        [
            "grpo",
            "model.path={model}",
            "data.dir={data}",
            "grpo.reward_timeout_s=1",
            "reward=[{name: bad_rewards:hang}]",
        ],
        "grpo.reward_timeout_s",
    ),
    # ---- quantized loading (bitsandbytes, CUDA with LoRA only): before any data is prepared
    (
        "8-bit loading on the CPU",
        [
            "grpo",
            "model.path={model}",
            "data.dir=fresh",
            "model.lora.enabled=true",
            "model.load_in=8bit",
            "perf.device=cpu",
        ],
        "model.load_in=8bit",
    ),
    (
        "4-bit loading without LoRA",
        ["grpo", "model.path={model}", "model.load_in=4bit"],
        "model.lora.enabled",
    ),
    (
        "quantized loading of a preset",
        ["grpo", "model.lora.enabled=true", "model.load_in=4bit"],
        "model.preset",
    ),
    ("quantized pretraining", ["pretrain", "model.load_in=4bit"], "model.load_in"),
    # ---- sweep specs
    ("sweep spec missing", ["sweep", "nope.yaml"], "nope.yaml"),
    ("sweep overrides a list", ["sweep", "spec_overrides_list.yaml", "dir=s"], "overrides"),
    ("sweep storage scheme", ["sweep", "spec_storage.yaml", "dir=s"], "mongodb"),
    ("sweep space not a list", ["sweep", "spec_space.yaml", "dir=s"], "optim.lr"),
    ("sweep base missing", ["sweep", "spec_base.yaml", "dir=s"], "nope.yaml"),
    ("sweep key unknown", ["sweep", "spec_key.yaml", "dir=s"], "optim.lrr"),
    ("sweep metric goal", ["sweep", "spec_metric.yaml", "dir=s"], "goal"),
    ("sweep storage nobody answers", ["sweep", "spec_pg.yaml", "dir=s"], "storage"),
    ("sweep timeout infinite", ["sweep", "ok_spec.yaml", "stop_timeout_s=.inf"], "stop_timeout_s"),
    ("sweep grid below its min_lr", ["sweep", "spec_min_lr.yaml", "dir=s"], "optim.min_lr_ratio"),
    (
        "pbt key not a number",
        ["sweep", "spec_pbt.yaml", "pbt.perturb={optim.schedule: [2]}"],
        "not a number",
    ),
    ("pbt factor 0", ["sweep", "spec_pbt.yaml", "pbt.perturb={optim.lr: [0]}"], "factor 0"),
    ("pbt population of 1", ["sweep", "spec_pbt.yaml", "pbt.population=1"], "pbt.population"),
    ("pbt unknown key", ["sweep", "spec_pbt.yaml", "pbt.perturb={optim.lrr: [2]}"], "optim.lrr"),
    # ---- probe, bench, sample, report
    ("probe workload missing", ["probe", "nope.yaml"], "nope.yaml"),
    ("probe setting out of range", ["probe", "ok.yaml", "max_k=0", "dir=p"], "max_k"),
    ("probe start unknown", ["probe", "ok.yaml", "start=hot", "dir=p"], "probe key start"),
    ("bench workload missing", ["bench", "nope.yaml"], "nope.yaml"),
    ("bench unknown knob", ["bench", "ok.yaml", "--knobs", "warp", "--out", "b"], "warp"),
    ("bench start unknown", ["bench", "ok.yaml", "--start", "hot", "--out", "b"], "--start"),
    ("sample from a non-run", ["sample", "nomodel", "--prompt", "Once"], "nomodel"),
    ("sample count zero", ["sample", "{model}", "--prompt", "Once", "--n", "0"], "--n"),
    ("report of no directory", ["report", "nope"], "nope"),
    ("compare level out of range", ["compare", "nope", "--level", "1.5"], "level"),
    ("compare runs without a metric", ["compare", "nope"], "--metric"),
    ("compare a non-run", ["compare", "nope", "--metric", "reward"], "nope"),
]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every file and directory under `root` with its size and modification time."""
    out = {}
    for p in root.rglob("*"):
        st = p.stat()
        out[str(p.relative_to(root))] = (st.st_size if p.is_file() else -1, st.st_mtime_ns)
    return out


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An otherwise empty working directory holding FILES and the bad reward module."""
    for name, content in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    (tmp_path / "bad_rewards.py").write_text(BAD_REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ of bad_rewards.py
    from huggingface_hub import constants

    # no case asks huggingface.co: a Hub id goes to a port nothing listens on, an empty cache
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path.parent / "empty-hub-cache"))
    from smollab.models.hub import find_hub_model

    find_hub_model.cache_clear()
    sys.modules.pop("bad_rewards", None)
    return tmp_path


@pytest.mark.parametrize("argv, culprit", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_naming_the_culprit_and_leaves_nothing(
    argv, culprit, workdir, micro_model, micro_data, capsys
):
    argv = [a.replace("{model}", str(micro_model)).replace("{data}", str(micro_data)) for a in argv]
    before, data_before = _tree(workdir), _tree(micro_data)
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("smollab: error:")]
    assert code != 0, err
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err
    assert culprit.lower() in errors[0].lower(), errors[0]
    assert "Traceback" not in err
    after = _tree(workdir)
    assert after == before, f"files were written: {sorted(set(after) - set(before))}"
    assert _tree(micro_data) == data_before, "the shared data directory changed"


def test_a_changed_config_on_rerun_is_refused_and_the_run_left_as_it_was(
    micro_pretrain, tmp_path, capsys
):
    assert main(["pretrain", *micro_pretrain]) == 0
    run = tmp_path / "run"
    before = _tree(run)
    capsys.readouterr()
    assert main(["pretrain", *micro_pretrain, "optim.lr=3e-3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "optim.lr" in err and "run.resume=never" in err and "\n" not in err
    assert _tree(run) == before


PURE_CONFIG = [
    c
    for c in CASES
    if c[0]
    in (
        "unknown key",
        "min_lr above lr",
        "wrong type",
        "key grpo does not read",
        "sweep overrides a list",
        "grpo before its base is pretrained",  # the inputs are looked at before the loop loads
        "prompts file missing, and the model too",
        "sample of a run not made",
    )
]


@pytest.mark.parametrize(
    "argv, culprit", [c[1:] for c in PURE_CONFIG], ids=[c[0] for c in PURE_CONFIG]
)
def test_a_config_error_stops_before_torch_is_imported(argv, culprit, workdir):
    probe = (
        "import sys; from smollab.cli import main; code = main(sys.argv[1:]); "
        "print('torch' in sys.modules); sys.exit(code)"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), *sys.path])}
    out = subprocess.run(
        [sys.executable, "-c", probe, *argv], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 2, out.stderr
    assert out.stdout.strip() == "False"
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and culprit in lines[0], out.stderr
