"""The weights an HF Llama-family model (or a PEFT model of one) computes with, for the lean forward.

`effective_weight` folds active LoRA adapters into a layer's weight (or reads the bare base with
adapters off), `effective_bias` reads the bias LoRA leaves alone; `unwrap_hf` finds the
`...ForCausalLM` inside a PEFT wrapper. Kept apart from
`lean_llama.py` so the forward reads alone and the LoRA bookkeeping has one home.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["effective_bias", "effective_weight", "unwrap_hf"]


def _is_lora_layer(module) -> bool:
    return hasattr(module, "base_layer") and hasattr(module, "get_delta_weight")


def _lora_names(module) -> set[str]:
    names = set(getattr(module, "lora_A", {}).keys())
    return names | set(getattr(module, "lora_embedding_A", {}).keys())


def _followed(module: nn.Module, adapters: bool) -> nn.Module:
    """A `modules_to_save` wrapper -> the copy it computes with (the active adapter's, or the
    original with adapters off); any other module as it is."""
    while hasattr(module, "original_module") and hasattr(module, "modules_to_save"):
        active = list(module.active_adapters)
        use = adapters and not module.disable_adapters and active
        if use and active[0] in module.modules_to_save:
            module = module.modules_to_save[active[0]]
        else:
            module = module.original_module
    return module


def effective_weight(module: nn.Module, adapters: bool = True) -> torch.Tensor:
    """The weight a (possibly PEFT-wrapped) Linear, Embedding or norm computes with.

    LoRA: base + sum(scaling * B @ A) over the active adapters that this layer has, or the bare
    base weight when `adapters=False` or the adapters are disabled (`with model.disable_adapter()`).
    Adapters already merged into the base weight are accounted for. `modules_to_save` copies are
    followed to the active one (or to the original with adapters off).
    """
    module = _followed(module, adapters)
    if not _is_lora_layer(module):
        if hasattr(module, "base_layer"):
            raise NotImplementedError(
                f"only LoRA adapters are supported, not {type(module).__name__}"
            )
        return module.weight
    names = _lora_names(module)
    merged = [a for a in getattr(module, "merged_adapters", []) if a in names]
    active = []
    if adapters and not module.disable_adapters:
        active = [a for a in module.active_adapters if a in names]
    weight = module.get_base_layer().weight
    if merged == active:
        return weight
    for name in set(merged) | set(active):
        if name in getattr(module, "lora_variant", {}):
            raise NotImplementedError(
                f"LoRA variant (e.g. DoRA) of adapter {name!r} is not supported"
            )
        if getattr(module, "lora_bias", {}).get(name, False):
            raise NotImplementedError(f"lora_bias of adapter {name!r} is not supported")
    weight = weight.detach().clone()
    for name in merged:
        weight -= module.get_delta_weight(name).to(weight.dtype)
    for name in active:
        weight += module.get_delta_weight(name).to(weight.dtype)
    return weight


def effective_bias(module: nn.Module, adapters: bool = True) -> torch.Tensor | None:
    """The bias a (possibly PEFT-wrapped) Linear adds, None without one: the base layer's, since
    LoRA adapts weights only (`effective_weight` refuses adapters with a `lora_bias`).
    `modules_to_save` copies are followed as `effective_weight` follows them."""
    module = _followed(module, adapters)
    if _is_lora_layer(module):
        module = module.get_base_layer()
    return getattr(module, "bias", None)


def unwrap_hf(model: nn.Module) -> nn.Module:
    """A PEFT model -> its (LoRA-injected) HF causal LM; an HF model passes through."""
    if hasattr(model, "get_base_model") and hasattr(model, "peft_config"):
        model = model.get_base_model()
    if not (hasattr(model, "model") and hasattr(model.model, "layers")):
        raise TypeError(
            f"expected an HF Llama-family causal LM (or a PEFT model of one), got {type(model)}"
        )
    return model
