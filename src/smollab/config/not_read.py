"""The keys a command does not read although another command does, each with the reason
(`config key train.seq_len: grpo does not read it (prompts are grpo.prompt_tokens long, ...)`):
`NOT_READ`, looked up by `not_read`. `load` refuses such a key in one line with the reason;
`smollab bench` skips a knob whose key the workload's command does not read. An entry is a
dotted key or a whole section (`grpo` covers `grpo.beta`). tests/config/test_config_keys.py
checks the table against the schemas both ways.

Apart from the schemas' rules across keys: this is one table, read before any schema validates.
Imports nothing of smollab and no torch: the bench parent reads it.
"""

from __future__ import annotations

_NO_MODEL = "it writes the corpus, tokenizer and token files of data.dir; no model is built"
_RL = "GRPO settings, read by `smollab grpo`"
_NO_COMPILE = "it never compiles; the lean sampler decodes eagerly, which measured faster"

_SFT = "SFT settings, read by `smollab sft`"
_SFT_DATA = (
    "a `smollab sft` data key (prompt/completion records); this command reads a story corpus"
)
# The data keys of sft's records that no corpus reads, and the corpus keys sft does not read.
SFT_DATA_KEYS = (
    "train_file",
    "eval_file",
    "hf_dataset",
    "hf_name",
    "split",
    "eval_split",
    "eval_fraction",
    "prompt_field",
    "completion_field",
    "text_field",
    "num_workers",
    "pin_memory",
    "prefetch_factor",
)
_SFT_ONLY = {f"data.{k}": _SFT_DATA for k in SFT_DATA_KEYS} | {"sft": _SFT}
# The keys of prompts from data (config.sections.PromptSource) that grpo and rft read too.
PROMPT_KEYS = ("hf_dataset", "hf_name", "split", "eval_split", "eval_fraction", "prompt_field")


def _records_only(command: str, files: str) -> dict[str, str]:
    """The sft data keys that a command reading prompts from data does not read."""
    why = (
        f"a `smollab sft` data key (prompt/completion records); {command} reads prompts from "
        f"{files} or data.hf_dataset"
    )
    return {f"data.{k}": why for k in SFT_DATA_KEYS if k not in PROMPT_KEYS} | {"sft": _SFT}


_RFT = "RFT settings, read by `smollab rft`"
_CORPUS_KEYS = (
    "dir",
    "source",
    "files",
    "text_key",
    "num_stories",
    "max_stories",
    "test_fraction",
    "tokenizer",
    "vocab_size",
)
_CORPUS = (
    "it reads prompt/completion records (data.train_file or data.hf_dataset) with the "
    "model's own tokenizer; corpus keys are pretrain's and grpo's"
)

NOT_READ: dict[str, dict[str, str]] = {
    "pretrain": {
        **_SFT_ONLY,
        "train.epochs": "it counts optimizer steps or tokens (train.max_steps, max_tokens)",
        "model.lora": "pretraining trains every weight; LoRA is for `smollab grpo` and `sft`",
        "model.load_in": "pretraining trains every weight, and quantized weights cannot train; "
        "it is for LoRA fine-tuning (`smollab grpo`)",
        "grpo": _RL,
        "rft": _RFT,
        "reward": "pretraining minimizes the next-token loss; rewards are for `smollab grpo`",
        "failure": "the RL failure rules; pretraining stops on divergence (train.diverge_factor)",
    },
    "grpo": {
        **_records_only("grpo", "grpo.prompts_file"),
        "rft": _RFT,
        "train.max_tokens": "it counts optimizer steps, not tokens (train.max_steps, max_time)",
        "train.seq_len": (
            "prompts are grpo.prompt_tokens long, completions grpo.max_completion_length"
        ),
        "train.eval_tokens": "it evaluates on grpo.eval_prompts held-out prompts",
        "train.diverge_factor": "divergence is a KL above failure.max_kl or a non-finite loss",
        "perf.compile": _NO_COMPILE,
        "perf.compile_mode": _NO_COMPILE,
    },
    "sft": {
        "model.preset": (
            "it fine-tunes a trained model and tokenizes with that model's "
            "tokenizer: set model.path"
        ),
        **{f"data.{k}": _CORPUS for k in _CORPUS_KEYS},
        "model.load_in": "it loads full-precision weights; quantized loading (CUDA, LoRA) is "
        "written for `smollab grpo` only",
        "train.max_tokens": "it counts optimizer steps or epochs (train.max_steps, train.epochs)",
        "train.eval_tokens": (
            "it evaluates on the whole held-out split (data.eval_file, "
            "data.eval_split or data.eval_fraction)"
        ),
        "grpo": _RL,
        "rft": _RFT,
        "reward": "SFT minimizes the loss on completions; rewards are for `smollab grpo` and "
        "`smollab rft`",
        "failure": "the RL failure rules; SFT stops on divergence (train.diverge_factor)",
    },
    "data": {
        **_SFT_ONLY,
        "model": _NO_MODEL,
        "optim": _NO_MODEL,
        "train": _NO_MODEL,
        "perf": _NO_MODEL,
        "run": "it writes data.dir, not a run directory",
        "grpo": _RL,
        "rft": _RFT,
        "reward": _RL,
        "failure": _RL,
    },
    "rft": {
        **{
            f"data.{k}": "each round's records are its own kept completions "
            "(rounds/N/data.jsonl), tokenized with the model's tokenizer"
            for k in ("train_file", "eval_file", "completion_field", "text_field")
        },
        **{
            f"data.{k}": "each round's SFT reads its kept completions in the process"
            for k in ("num_workers", "pin_memory", "prefetch_factor")
        },
        **{
            f"data.{k}": "a story-corpus key (pretrain's and grpo's); rft reads prompts from "
            "rft.prompts_file or data.hf_dataset with the model's tokenizer"
            for k in _CORPUS_KEYS
        },
        "model.preset": "it fine-tunes a trained model and samples it with that model's "
        "tokenizer: set model.path",
        "model.load_in": "it loads full-precision weights; quantized loading (CUDA, LoRA) is "
        "written for `smollab grpo` only",
        "train.max_tokens": "each round counts optimizer steps or epochs (train.max_steps, "
        "train.epochs)",
        "train.eval_tokens": "it evaluates held-out accuracy on rft.eval_prompts_file",
        "train.eval_interval": "a round trains on all its kept records; held-out accuracy on "
        "rft.eval_prompts_file is measured after each round",
        "grpo": _RL,
        "failure": "the RL failure rules; a round's SFT stops on divergence "
        "(train.diverge_factor), a round that keeps nothing ends the run stuck",
    },
}


def not_read(command: str, key: str) -> str | None:
    """Why `command` does not read config `key` (the entry of its longest dotted prefix), or
    None when this table has no entry for it."""
    table = NOT_READ.get(command, {})
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        if (why := table.get(".".join(parts[:n]))) is not None:
            return why
    return None
