"""Every training command on every Hub family's offline replica, as a user would start it.

The replicas (tests/replicas.py) are published configs scaled down, bf16 safetensors and the
family's own tokenizer specials and chat template. Each command runs three steps from one: GRPO
full and LoRA (on all seven projections), SFT and RFT. A LoRA adapter GRPO trains must load with
`peft.PeftModel.from_pretrained` on the HF model and reproduce the log-probs the run computed.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from smollab.config.load import load_config
from smollab.train import rft, sft
from smollab.train.grpo.run import train as grpo_train
from tests.replicas import FAMILIES

PROMPTS = [
    "Once upon a time, a little fox",
    "The old boat sailed",
    "Mia found a red ball",
    "In the quiet forest,",
    "A small bird sang",
    "Tom and his dog",
]
ALL_LINEARS = "[q,k,v,o,gate,up,down]"
REWARDS = """
def has_e(completions, **kwargs):
    return [float("e" in c) for c in completions]
"""


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
    """Prompts for GRPO and RFT, prompt/completion records for SFT, and a reward module."""
    d = tmp_path_factory.mktemp("hub-task")
    (d / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    (d / "eval.txt").write_text("\n".join(PROMPTS[:2]) + "\n")
    (d / "records.jsonl").write_text(
        "".join(
            json.dumps({"prompt": p, "completion": " and then it rained."}) + "\n"
            for p in PROMPTS * 4
        )
    )
    (d / "hub_rewards.py").write_text(REWARDS)
    return d


def _log(run) -> str:
    return (run / "training.log").read_text()


def _grpo(model, task, run, extra=()):
    overrides = [
        f"model.path={model}",
        f"grpo.prompts_file={task / 'prompts.txt'}",
        "grpo.eval_prompts=2",
        "grpo.num_generations=4",
        "grpo.max_completion_length=8",
        "train.batch_size=8",
        "train.max_steps=3",
        "train.eval_interval=3",
        "train.save_interval=3",
        "optim.lr=1e-4",
        "run.plots=false",
        f"run.dir={run}",
        *extra,
    ]
    return grpo_train(load_config("grpo", None, overrides))


@pytest.mark.parametrize("family", FAMILIES)
def test_grpo_full_finetunes_three_steps(replica_dir, task_files, tmp_path):
    summary = _grpo(replica_dir, task_files, tmp_path / "grpo")
    assert summary["status"] == "completed" and summary["steps"] == 3
    log = _log(tmp_path / "grpo")
    assert "weights float32 (model.dtype=auto); stored bfloat16" in log
    assert "sampler lean" in log and "policy forward replayed from the decode" in log
    assert (tmp_path / "grpo" / "checkpoints" / "final" / "model.safetensors").exists()


@pytest.mark.parametrize("family", FAMILIES)
def test_grpo_lora_adapter_loads_with_peft_and_reproduces_logprobs(
    replica_dir, task_files, tmp_path
):
    """The adapter a LoRA run saves is PEFT's own format: PeftModel.from_pretrained on the HF
    model gives the log-probs smollab's policy gives (fp32)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from smollab.engine.lean_llama import LeanLlama
    from smollab.engine.token_logprobs import logprobs

    run = tmp_path / "grpo"
    lora = ["model.lora.enabled=true", "model.lora.r=4", f"model.lora.targets={ALL_LINEARS}"]
    lora.append("optim.lr=1e-3")
    summary = _grpo(replica_dir, task_files, run, lora)
    assert summary["status"] == "completed" and summary["steps"] == 3
    final = run / "checkpoints" / "final"
    config = json.loads((final / "adapter_config.json").read_text())
    assert set(config["target_modules"]) == {
        f"{n}_proj" for n in ALL_LINEARS.strip("[]").split(",")
    }

    tok = AutoTokenizer.from_pretrained(replica_dir)
    base = AutoModelForCausalLM.from_pretrained(replica_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, final).eval()
    enc = tok([PROMPTS[0] + " and the sun was warm"], return_tensors="pt")
    P = len(tok(PROMPTS[0]).input_ids)
    with torch.no_grad():
        logits = model(**enc).logits[:, P - 1 : -1].float().log_softmax(-1)
        expected = logits.gather(-1, enc.input_ids[:, P:, None]).squeeze(-1)
        lean = LeanLlama.from_hf(model)
        got = logprobs(lean, enc.input_ids, enc.attention_mask, P)
        with model.disable_adapter():
            untrained = logprobs(model, enc.input_ids, enc.attention_mask, P)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert (untrained - expected).abs().max() > 1e-4  # three steps moved the adapter


def test_a_large_lora_run_uses_its_policy_as_reference(replicas, task_files, tmp_path, monkeypatch):
    """Past the size where a lean copy of the base saves time, the KL reference of a LoRA run is
    the policy with its adapters off; the run log says so, and the run trains."""
    import smollab.engine.reference as reference

    monkeypatch.setattr(reference, "LEAN_COPY_MAX_PARAMS", 0)
    lora = ["model.lora.enabled=true", "model.lora.r=4", "grpo.beta=0.04"]
    summary = _grpo(replicas("qwen2.5"), task_files, tmp_path / "grpo", lora)
    assert summary["status"] == "completed" and summary["steps"] == 3
    log = _log(tmp_path / "grpo")
    assert "KL reference: the policy with its adapters off (over 0 parameters" in log
    assert "policy forward replayed from the decode" in log


@pytest.mark.parametrize("family", FAMILIES)
def test_sft_three_steps(replica_dir, task_files, tmp_path):
    run = tmp_path / "sft"
    overrides = [
        f"model.path={replica_dir}",
        f"data.train_file={task_files / 'records.jsonl'}",
        "data.eval_fraction=0.1",
        "train.max_steps=3",
        "train.batch_size=4",
        "train.seq_len=32",
        "train.log_interval=1",
        "train.eval_interval=3",
        "train.save_interval=3",
        "optim.lr=1e-4",
        "optim.warmup_steps=1",
        "run.plots=false",
        f"run.dir={run}",
    ]
    summary = sft.train(load_config("sft", None, overrides))
    assert summary["status"] == "completed" and summary["steps"] == 3
    assert "stored bfloat16" in _log(run)


@pytest.mark.parametrize("family", FAMILIES)
def test_rft_three_steps(replica_dir, task_files, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(task_files))
    sys.modules.pop("hub_rewards", None)
    run = tmp_path / "rft"
    overrides = [
        f"model.path={replica_dir}",
        f"rft.prompts_file={task_files / 'prompts.txt'}",
        f"rft.eval_prompts_file={task_files / 'eval.txt'}",
        "rft.rounds=1",
        "rft.oversample=2",
        "rft.max_new_tokens=8",
        "rft.gen_batch_size=4",
        "rft.keep.threshold=0.0",
        "reward=[{name: hub_rewards:has_e}]",
        "train.epochs=null",
        "train.max_steps=3",
        "train.batch_size=4",
        "train.seq_len=32",
        "train.log_interval=1",
        "train.save_interval=3",
        "optim.lr=1e-4",
        "optim.warmup_steps=1",
        "run.plots=false",
        f"run.dir={run}",
    ]
    summary = rft.train(load_config("rft", None, overrides))
    assert summary["status"] == "completed", summary
