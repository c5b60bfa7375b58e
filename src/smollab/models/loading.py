"""Build a model from a preset, or load any HF causal LM by directory, run directory or hub id."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from smollab.config import LoraConfig, ModelConfig
from smollab.errors import UserError
from smollab.models import hub
from smollab.rundir.runs import RunView

if TYPE_CHECKING:
    import torch

# Short target names (config) -> module names per architecture.
_LORA_TARGETS = {
    "llama": {
        "q": "q_proj",
        "k": "k_proj",
        "v": "v_proj",
        "o": "o_proj",
        "gate": "gate_proj",
        "up": "up_proj",
        "down": "down_proj",
    },
    "gpt2": {
        "q": "c_attn",
        "k": "c_attn",
        "v": "c_attn",
        "o": "attn.c_proj",
        "up": "mlp.c_fc",
        "down": "mlp.c_proj",
    },
}


@contextlib.contextmanager
def peft_wrapping() -> Iterator[None]:
    """Around PEFT's wrapping of a model (get_peft_model, PeftModel.from_pretrained): PEFT reads
    transformers' deprecated `is_gradient_checkpointing`, a FutureWarning on every run that is
    not ours to fix (smollab reads `is_activation_checkpointing`, token_logprobs.checkpointing)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing.* is deprecated", category=FutureWarning
        )
        yield


def resolve_model_dir(path: str) -> Path | str:
    """A run directory resolves to its final (else latest) checkpoint; other paths pass through.

    A string that is no local path must be a Hub id that the Hub or its cache has (`models.hub`:
    settled in seconds, before anything loads); it is handed to `from_pretrained` as it is, or,
    when the Hub cannot serve it, resolves to its snapshot in the Hub cache.
    """
    p = Path(path).expanduser()
    if not p.exists():
        if hub.looks_local(path):
            raise hub.missing(path, "no such directory")
        found = hub.find_hub_model(path)  # "gpt2", "SimpleStories/SimpleStories-1.25M"
        if isinstance(found, str):
            return found
        p = found  # the Hub cannot serve it: its snapshot in the Hub cache
    view = RunView(p)
    if view.checkpoints_dir.is_dir():
        if (view.checkpoints_dir / "final").is_dir():
            return view.checkpoints_dir / "final"
        steps = view.step_checkpoints()
        if not steps:
            raise UserError(f"model.path: run directory {p} has no checkpoint yet")
        return steps[-1]
    routed = any((p / a / "adapter_config.json").is_file() for a in ("retain", "forget"))
    adapter = (p / "adapter_config.json").is_file()  # a LoRA checkpoint: transformers loads its
    if not (p / "config.json").is_file() and not (routed or adapter):  # base, adapters attached
        raise UserError(f"model.path: {p} is neither a run directory nor an HF model directory")
    return p


def check_model_source(cfg: ModelConfig) -> None:
    """Fail on a model that cannot be found before any data is prepared: a local path that is
    missing or holds no model, a Hub id that neither the Hub (asked with a short time limit) nor
    its cache has, an unknown preset."""
    if cfg.path:
        resolve_model_dir(cfg.path)
    else:
        from smollab.models.presets import PRESETS

        if cfg.preset not in PRESETS:
            raise UserError(
                f"model.preset: unknown preset {cfg.preset!r} (one of {', '.join(PRESETS)})"
            )


# model.dtype -> the dtype the weights are held in (auto: fp32 master weights, whatever is stored)
WEIGHT_DTYPES = {"auto": "float32", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def weights_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, WEIGHT_DTYPES[name])


def stored_dtype(where: Path | str) -> str | None:
    """The dtype a checkpoint's config.json says its weights are stored in (None: not said, or a
    hub id, whose config is read only as it loads)."""
    config = Path(str(where)) / "config.json"
    if not config.is_file():
        return None
    import json

    saved = json.loads(config.read_text())
    return saved.get("dtype") or saved.get("torch_dtype")


def build_model(
    cfg: ModelConfig,
    vocab_size: int | None = None,
    attn_implementation="sdpa",
    device: torch.device | None = None,
    compute_dtype: torch.dtype | None = None,
    notes: list[str] | None = None,
):
    """A model from `cfg.path` (pretrained weights) or `cfg.preset` (fresh init), its weights in
    `model.dtype` (auto: fp32, a bf16 Hub checkpoint upcast as it loads); `notes` gets one line
    saying what was stored and what is held, for the run log. The model's config names the dtype
    held, so its checkpoints say what they store.

    No `low_cpu_mem_usage` key: transformers 5 always builds a loaded model on the meta device
    and reads the weights into it (4.x's low_cpu_mem_usage=True; 5.x drops the argument unread),
    so a path costs about one copy of its weights (benchmarks/grpo_big_lora.py prints it).
    A fine-tuning config's `model.load_in` (8bit, 4bit) loads the weights quantized straight onto
    `device` (CUDA; `models.quantized`), computing in `compute_dtype`."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per load of a 1M-parameter model is noise
    dtype = weights_dtype(cfg.dtype)
    held = f"weights {WEIGHT_DTYPES[cfg.dtype]} (model.dtype={cfg.dtype})"
    load_in = getattr(cfg, "load_in", "none")  # fine-tuning configs only
    if load_in != "none" and device is None:
        raise ValueError("build_model: model.load_in needs the device to load onto")
    if cfg.path:
        where = resolve_model_dir(cfg.path)
        from smollab.models.routing import load_routed_dir, saved_adapters

        if isinstance(where, Path) and saved_adapters(where):
            if load_in != "none":
                raise UserError(
                    f"model.load_in={load_in}: {where} is a gradient-routing "
                    "checkpoint, which loads in full precision only"
                )
            model = load_routed_dir(where, "both", attn_implementation).to(dtype)  # both on
            _note(notes, f"{held}; stored {stored_dtype(where) or 'as its base'}")
            return model
        if isinstance(where, Path):  # absolute: PEFT records it as its adapters' base model,
            where = where.resolve()  # which must load from any working directory
        if load_in != "none" and (Path(str(where)) / "adapter_config.json").is_file():
            raise UserError(
                f"model.load_in={load_in}: {where} holds LoRA adapters, which would "
                "be merged into quantized weights and rounded away; point "
                "model.path at full weights (grpo.export_merged writes them)"
            )
        from smollab.models.quantized import quantized_load_kwargs

        quant = quantized_load_kwargs(load_in, device, compute_dtype) if device else {}
        try:
            model = AutoModelForCausalLM.from_pretrained(
                where,
                attn_implementation=attn_implementation,
                **(quant or {"dtype": dtype}),
            )
        except OSError as e:
            raise UserError(f"model.path: cannot load {where}: {str(e).splitlines()[0]}") from None
        if (Path(str(where)) / "adapter_config.json").is_file():
            model = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model
        stored = stored_dtype(where)
        _note(notes, f"base quantized {load_in}" if quant else f"{held}; stored {stored or '?'}")
    else:
        from smollab.models.presets import preset_config

        config = preset_config(cfg.preset, vocab_size=vocab_size)
        config._attn_implementation = attn_implementation
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=attn_implementation, dtype=dtype
        )
        _note(notes, f"{held}; a fresh {cfg.preset}")
    return model


def _note(notes: list[str] | None, line: str) -> None:
    if notes is not None:
        notes.append(line)


def align_special_tokens(model, tokenizer) -> None:
    """Make the model's config name the tokenizer's EOS and pad ids.

    Preset configs carry the library's default Llama ids (bos 1, eos 2), which in a tokenizer
    trained here are ordinary tokens; tools that read the checkpoint (HF `generate`, TRL) would
    stop completions at the wrong token.
    """
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    bos = getattr(tokenizer, "bos_token_id", None)
    for cfg in (model.config, getattr(model, "generation_config", None)):
        if cfg is not None:
            cfg.eos_token_id, cfg.pad_token_id, cfg.bos_token_id = eos, pad, bos


def lora_target_names(model, targets: list[str], key: str) -> tuple[list[str], bool]:
    """The module names of short `targets` (q, k, ...) in `model`'s architecture, and whether
    its linears are stored transposed (GPT-2's Conv1D: PEFT's fan_in_fan_out)."""
    arch = "gpt2" if model.config.model_type == "gpt2" else "llama"
    names = sorted({_LORA_TARGETS[arch][t] for t in targets if t in _LORA_TARGETS[arch]})
    if not names:
        raise UserError(f"{key}: none of {targets} apply to {arch}")
    return names, arch == "gpt2"


def apply_lora(model, cfg: LoraConfig):
    """Wrap `model` with PEFT LoRA adapters on the configured targets."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    names, fan_in_fan_out = lora_target_names(model, cfg.targets, "model.lora.targets")
    peft_cfg = PeftLoraConfig(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=names,
        fan_in_fan_out=fan_in_fan_out,
        task_type="CAUSAL_LM",
    )
    with peft_wrapping():
        return get_peft_model(model, peft_cfg)


def load_tokenizer_near(path: str | Path):
    """The tokenizer saved beside a model (checkpoint dirs carry one)."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise UserError(f"no tokenizer at {path}: {str(e).splitlines()[0]}") from None
