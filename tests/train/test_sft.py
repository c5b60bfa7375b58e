"""`smollab sft`: completion-only loss, packing boundaries, exact resume, the DataLoader path,
bad records in one line, full and LoRA runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from smollab.config.load import load_config
from smollab.data.sft_batches import IGNORE, collate, tokenize
from smollab.data.sft_records import Record, load_records
from smollab.errors import RunFailed, UserError
from smollab.models.loading import load_tokenizer_near, resolve_model_dir
from smollab.rundir.runs import read_metrics
from smollab.train import scaffold, sft


@pytest.fixture(scope="module")
def records_file(tmp_path_factory) -> Path:
    """60 prompt/completion records cut from offline stories (8 prompt words, 10 more)."""
    from smollab.data.stories import generate_stories

    path = tmp_path_factory.mktemp("sft") / "train.jsonl"
    rows = []
    for s in generate_stories(60, seed=5):
        w = s.split()
        rows.append({"prompt": " ".join(w[:8]), "completion": " " + " ".join(w[8:18])})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def micro_sft(micro_model, records_file, tmp_path) -> list[str]:
    return [
        f"model.path={micro_model}",
        f"data.train_file={records_file}",
        "data.eval_fraction=0.1",
        "train.max_steps=8",
        "train.batch_size=4",
        "train.seq_len=64",
        "train.log_interval=1",
        "train.eval_interval=4",
        "train.save_interval=2",
        "optim.lr=3e-3",
        "optim.warmup_steps=2",
        "run.plots=false",
        f"run.dir={tmp_path / 'sft'}",
    ]


def _run(args: list[str]) -> dict:
    return sft.train(load_config("sft", None, args))


@pytest.fixture(scope="module")
def model_and_tokenizer(micro_model):
    from transformers import AutoModelForCausalLM

    where = resolve_model_dir(str(micro_model))
    model = AutoModelForCausalLM.from_pretrained(where).eval()
    return model, load_tokenizer_near(where)


class _RT:  # what label_loss reads of the runtime
    device = torch.device("cpu")

    @staticmethod
    def autocast():
        import contextlib

        return contextlib.nullcontext()


def _loss(model, ids_batch, labels_batch) -> float:
    batch = dict(ids_batch, labels=labels_batch["labels"])
    with torch.no_grad():
        return float(sft.label_loss(model, batch, _RT))


def _batch(tok, records, completion_only=True):
    rows = tokenize(records, tok, 64, completion_only, packing=False).rows
    return collate(rows, tok.eos_token_id), rows


WORDS = [
    "cat",
    "dog",
    "sun",
    "mom",
    "day",
    "boy",
    "girl",
    "tree",
    "ball",
    "park",
    "fish",
    "bird",
    "box",
    "red",
    "big",
]


def _swap_last_word(tok, text: str) -> str:
    """`text` with its last word replaced by one that tokenizes to as many (other) tokens."""
    head, last = text.rsplit(" ", 1)
    n = len(tok(" " + last, add_special_tokens=False)["input_ids"])
    for w in WORDS:
        if w != last and len(tok(" " + w, add_special_tokens=False)["input_ids"]) == n:
            return f"{head} {w}"
    raise AssertionError(f"no word tokenizes like {last!r}")


def test_prompt_tokens_carry_no_loss(model_and_tokenizer):
    model, tok = model_and_tokenizer
    a = Record("once upon a time there was a cat", " who liked to run in the park")
    b = Record(_swap_last_word(tok, a.prompt), a.completion)  # another prompt token
    c = Record(a.prompt, _swap_last_word(tok, a.completion))  # another completion token
    (ba, ra), (bb, rb), (bc, rc) = (_batch(tok, [r]) for r in (a, b, c))
    assert len(ra[0].ids) == len(rb[0].ids) == len(rc[0].ids)
    n_prompt = len(tok(a.prompt, add_special_tokens=False)["input_ids"])
    assert (ba["labels"][0, :n_prompt] == IGNORE).all()
    assert (ba["labels"][0, n_prompt:] == ba["input_ids"][0, n_prompt:]).all()
    # a's inputs with b's targets: only prompt targets differ, so the loss must not change
    assert _loss(model, ba, bb) == pytest.approx(_loss(model, ba, ba), abs=0)
    assert _loss(model, ba, bc) != pytest.approx(_loss(model, ba, ba), abs=1e-4)
    # with the loss on every token, the same prompt change does change it
    (fa, _), (fb, _) = _batch(tok, [a], False), _batch(tok, [b], False)
    assert _loss(model, fa, fb) != pytest.approx(_loss(model, fa, fa), abs=1e-4)
    # the completion ends with EOS, which is a target
    assert ra[0].ids[-1] == tok.eos_token_id and ra[0].labels[-1] == tok.eos_token_id


def test_packed_examples_do_not_see_each_other(model_and_tokenizer):
    model, tok = model_and_tokenizer
    recs = [
        Record("a cat sat on the mat", " and slept all day"),
        Record(None, "the dog ran to the park and played with a ball"),
        Record("the sun was warm", " so they went outside"),
    ]
    alone = tokenize(recs, tok, 64, True, packing=False).rows
    packed = tokenize(recs, tok, 64, True, packing=True).rows
    assert len(packed) == 1 and packed[0].ids == [t for r in alone for t in r.ids]
    starts = [0]
    for r in alone[:-1]:
        starts.append(starts[-1] + len(r.ids))
    assert all(packed[0].positions[s] == 0 and packed[0].labels[s] == IGNORE for s in starts)
    b = collate(packed, tok.eos_token_id)
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False
        ).logits[0]
        plain = model(input_ids=b["input_ids"]).logits[0]  # one causal sequence, no restarts
        for s, r in zip(starts, alone, strict=True):
            own = model(input_ids=torch.tensor([r.ids])).logits[0]
            torch.testing.assert_close(logits[s : s + len(r.ids)], own, rtol=1e-4, atol=1e-4)
        s, n = starts[1], len(alone[1].ids)
        assert not torch.allclose(plain[s : s + n], logits[s : s + n], atol=1e-3)
    # the packed row's loss is the sum of its examples' losses
    whole = _loss(model, b, b)
    parts = sum(_loss(model, *(2 * [collate([r], tok.eos_token_id)])) for r in alone)
    assert whole == pytest.approx(parts, rel=1e-5)


def test_long_examples_are_cut_and_counted(model_and_tokenizer):
    _, tok = model_and_tokenizer
    recs = [
        Record("one two three four five six seven eight", " nine ten"),
        Record("a b", " c"),
        Record("the cat sat on the mat and then", " slept"),
    ]
    out = tokenize(recs, tok, 8, True, packing=False)
    assert (out.truncated, out.dropped, out.examples) >= (2, 1, 1)
    assert all(len(r.ids) <= 8 for r in out.rows)


def _crash_at_step(monkeypatch, n: int) -> None:
    real, calls = scaffold.optimizer_step, {"n": 0}

    def crash(*a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            raise RuntimeError("simulated crash")
        return real(*a, **k)

    monkeypatch.setattr(scaffold, "optimizer_step", crash)


@pytest.mark.parametrize("packing", [False, True])
def test_resume_mid_run_equals_an_uninterrupted_run(micro_sft, tmp_path, monkeypatch, packing):
    extra = [f"sft.packing={str(packing).lower()}", "train.grad_accum=2"]
    ref = _run([*micro_sft, *extra, f"run.dir={tmp_path / 'ref'}"])
    with monkeypatch.context() as m:
        _crash_at_step(m, 6)
        with pytest.raises(RunFailed, match="simulated crash"):
            _run([*micro_sft, *extra])
    assert _run([*micro_sft, *extra])["status"] == "completed"
    want, got = (
        read_metrics(tmp_path / "ref" / "metrics.csv"),
        read_metrics(tmp_path / "sft" / "metrics.csv"),
    )
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, 9))
    for w, g in zip(want, got, strict=True):
        assert g["train_loss"] == pytest.approx(w["train_loss"], rel=1e-5)
        assert (g["val_loss"] is None) == (w["val_loss"] is None)
    a = load_file(tmp_path / "ref" / "checkpoints" / "final" / "model.safetensors")
    b = load_file(tmp_path / "sft" / "checkpoints" / "final" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)
    assert ref["steps"] == 8 and ref["truncated_examples"] == 0


def test_full_and_lora_both_train(micro_sft, tmp_path):
    full = _run(
        [a for a in micro_sft if not a.startswith("train.max_steps")]
        + ["train.epochs=2", "train.batch_size=8"]
    )
    assert full["status"] == "completed" and full["params_trainable"] == full["params_total"]
    assert full["epochs"] == pytest.approx(2.0, abs=0.25)
    lora = _run(
        [*micro_sft, "model.lora.enabled=true", "model.lora.r=2", f"run.dir={tmp_path / 'lora'}"]
    )
    assert lora["status"] == "completed" and 0 < lora["params_trainable"] < lora["params_total"]
    assert (tmp_path / "lora" / "checkpoints" / "final" / "adapter_model.safetensors").exists()
    rows = read_metrics(tmp_path / "lora" / "metrics.csv")
    assert rows[-1]["val_loss"] is not None and rows[-1]["train_loss"] < rows[0]["train_loss"]


def test_loader_workers_change_nothing_but_speed(micro_sft, tmp_path):
    _run([*micro_sft, "train.max_steps=4", f"run.dir={tmp_path / 'w0'}"])
    _run(
        [
            *micro_sft,
            "train.max_steps=4",
            "data.num_workers=1",
            "data.prefetch_factor=3",
            f"run.dir={tmp_path / 'w1'}",
        ]
    )
    a, b = (read_metrics(tmp_path / d / "metrics.csv") for d in ("w0", "w1"))
    assert [r["train_loss"] for r in a] == [r["train_loss"] for r in b]


@pytest.mark.parametrize(
    "content, expected",
    [
        ('{"prompt": "a", "completion": "b"}\nnot json\n', "line 2: not JSON"),
        ('{"prompt": "a", "completion": "b"}\n{"question": "a"}\n', "line 2: needs 'prompt'"),
        ('{"prompt": "a", "completion": 3}\n', "line 1: prompt and completion must be strings"),
        ("\n", "no records"),
    ],
)
def test_a_bad_data_file_is_one_line_naming_it(micro_sft, tmp_path, content, expected):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    with pytest.raises(UserError) as e:
        _run([*micro_sft, f"data.train_file={bad}"])
    assert "\n" not in str(e.value) and str(bad) in str(e.value) and expected in str(e.value)
    assert not (tmp_path / "sft").exists()  # refused before the run directory


@pytest.mark.parametrize(
    "args, expected",
    [
        (["data.prefetch_factor=2"], "data.num_workers=0"),
        (["data.pin_memory=true"], "data.pin_memory"),
        (["train.epochs=1", "train.max_steps=5"], "both set"),
        (["data.split=test"], "data.hf_dataset"),
        (["data.eval_file=x.jsonl", "data.seed=3"], "carves a held-out part"),
        (["data.train_file=null"], "data.train_file or data.hf_dataset"),
        (["model.path=null"], "model.path"),
        (["model.preset=micro"], "sft does not read it"),
        (["train.eval_tokens=64"], "sft does not read it"),
    ],
)
def test_bad_config_is_refused_in_one_line(micro_sft, args, expected):
    with pytest.raises(UserError, match=expected) as e:
        _run([*micro_sft, *args])
    assert "\n" not in str(e.value)


def test_records_through_the_datasets_library(records_file, tmp_path):
    """data.hf_dataset goes through `datasets.load_dataset` (here a local directory of .jsonl
    files, offline): the same records as the file, and the same carve."""
    d = tmp_path / "ds"
    d.mkdir()
    (d / "train.jsonl").write_text(records_file.read_text())
    hub = load_records(load_config("sft", None, [f"data.hf_dataset={d}"]).data)
    local = load_records(load_config("sft", None, [f"data.train_file={records_file}"]).data)
    assert hub.train == local.train and hub.eval == local.eval and len(hub.eval) == 3


def test_python_api(micro_sft):
    import smollab

    summary = smollab.sft(None, micro_sft, **{"train.max_steps": 2, "train.eval_interval": 2})
    assert summary["status"] == "completed" and summary["steps"] == 2


def test_sweeps_probes_and_bench_take_sft(micro_sft, tmp_path):
    """`command: sft` in a sweep (its metrics are the loop's columns), an sft workload in a probe
    and in the bench, whose plan has the DataLoader knobs (pinned memory: CUDA only)."""
    import yaml

    from smollab.lab.bench.knobs import plan, select
    from smollab.lab.probe.spec import load_probe
    from smollab.lab.sweep.command_names import metric_names
    from smollab.lab.sweep.spec_load import load_spec

    overrides = dict(a.split("=", 1) for a in micro_sft if not a.startswith(("run.", "optim.lr")))
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "command": "sft",
                "overrides": overrides,
                "space": {"optim.lr": [1e-3, 3e-3]},
                "sampler": "grid",
                "metric": {"name": "val_loss", "goal": "min"},
                "dir": str(tmp_path / "sw"),
            }
        )
    )
    spec = load_spec(str(spec_file), [])
    assert spec.command == "sft" and len(spec.grid_points()) == 2
    assert metric_names("sft") == sft.COLUMNS
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(yaml.safe_dump({"data": {"train_file": overrides["data.train_file"]}}))
    probe, _ = load_probe(str(recipe), [f"model.path={overrides['model.path']}"])
    assert probe.command == "sft"
    cfg = load_config("sft", recipe, [f"model.path={overrides['model.path']}"])
    names = select(None, "sft")
    assert {"workers", "prefetch", "pin_memory", "compile", "grad_accum"} <= set(names)
    assert "reward_workers" not in names
    runs, skipped = plan(names, "sft", cfg, "cpu")
    assert dict(runs)["prefetch"] == {"data.num_workers": 2, "data.prefetch_factor": 8}
    assert "pin_memory" in dict(skipped)


def test_story_pairs_are_deterministic_records(tmp_path):
    from smollab.data.story_pairs import main, story_pairs

    pairs = story_pairs(20, seed=1)
    assert pairs == story_pairs(20, seed=1) != story_pairs(20, seed=2)
    assert all(p["completion"].startswith(" ") and p["prompt"][-1] in '.!?"' for p in pairs)
    main([str(tmp_path / "d" / "p.jsonl"), "--n", "20"])
    cfg = load_config("sft", None, [f"data.train_file={tmp_path / 'd' / 'p.jsonl'}"])
    assert [(r.prompt, r.completion) for r in load_records(cfg.data).train][:3] == [
        (p["prompt"], p["completion"]) for p in pairs[:3]
    ]
