"""`model.load_in: 8bit|4bit`: the base model's weights quantized as they load (bitsandbytes,
through transformers' BitsAndBytesConfig), for LoRA on a model whose full weights do not fit.

CUDA only: bitsandbytes' quantized matmuls are CUDA kernels (its CPU and Apple backends are
partial and transformers does not load through them on every release), so a run on the CPU or
MPS is refused when its device is known, before any data is prepared, rather than failing (or
silently running in full precision) at load time. The quantized base is frozen: config rules
refuse `load_in` without `model.lora` (nothing else could train) and without `model.path`
(a preset is built fresh, not loaded). 4bit is NF4, QLoRA's data type, computing in the
autocast dtype (fp32 without autocast). The lean forward reads full-precision weights only
(`engine.lean_config.check_lean_compatible`), so a quantized policy samples through HF
`generate` and its KL reference is the base with adapters off.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from smollab.errors import UserError

QUANT_EXTRA = "quant"  # pyproject's extra with bitsandbytes


def check_load_in(load_in: str, device: torch.device) -> None:
    """Refuse `model.load_in` on a device or install that cannot honour it, in one line."""
    if load_in == "none":
        return
    if device.type != "cuda":
        raise UserError(
            f"model.load_in={load_in}: bitsandbytes quantized loading runs on CUDA "
            f"only, and this run's device is {device.type} (perf.device); use "
            "model.load_in=none"
        )
    if importlib.util.find_spec("bitsandbytes") is None:
        raise UserError(
            f"model.load_in={load_in} needs the bitsandbytes package: pip install "
            f"'smollab[{QUANT_EXTRA}]'"
        )


def quantized_load_kwargs(
    load_in: str, device: torch.device, compute_dtype: torch.dtype | None
) -> dict[str, Any]:
    """`from_pretrained` keyword arguments that load the weights quantized onto `device`
    ({} for load_in=none)."""
    if load_in == "none":
        return {}
    check_load_in(load_in, device)
    from transformers import BitsAndBytesConfig

    if load_in == "8bit":
        bnb = BitsAndBytesConfig(load_in_8bit=True)
    else:
        bnb = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=compute_dtype or torch.float32,
        )
    index = device.index if device.index is not None else torch.cuda.current_device()
    return {"quantization_config": bnb, "device_map": {"": index}}
