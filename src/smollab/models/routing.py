"""Gradient routing's model: a retain and a forget LoRA adapter on one PEFT model, per-completion
gradient masks, adapter modes, and the saved layout (each adapter a standard PEFT directory).

Routing (Cloud et al. 2024) makes chosen parameters learn from chosen data. Here each completion
`i` carries a mask per adapter: adapter `a` learns from `sum_i m_a,i * L_i`, in ONE forward and
backward. Each LoRA matmul of a masked adapter is rewritten per row as
`m * f(x; W) + (1 - m) * f(x; W.detach())`: the value and the gradient that flows on to `x`
are unchanged (both terms are the same number), only `W`'s gradient keeps masked rows alone.
Masking `x`'s gradient instead would also cut what the other adapter and the earlier layers
learn from that completion, which the separate-pass definition does not do.

Modes (`adapter_mode`): both (retain and forget on), retain_only, forget_only. Rank 0 means the
adapter is absent; a mode with no adapter left is the base model.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from smollab.config import RoutingConfig
from smollab.errors import UserError
from smollab.models.loading import lora_target_names, peft_wrapping

__all__ = [
    "ADAPTERS",
    "MODES",
    "adapter_mode",
    "apply_routing",
    "forget_scale",
    "load_routed",
    "load_routed_dir",
    "masks_for",
    "routed_adapters",
    "routing_masks",
    "saved_adapters",
]

ADAPTERS = ("retain", "forget")
MODES = {"both": ("retain", "forget"), "retain_only": ("retain",), "forget_only": ("forget",)}


def apply_routing(model: nn.Module, cfg: RoutingConfig):
    """Wrap `model` in a PEFT model with the "retain" and "forget" adapters (rank 0: absent),
    both active and trainable, on `cfg.targets` of every `cfg.layer_stride`-th layer."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    names, fan_in_fan_out = lora_target_names(model, cfg.targets, "grpo.routing.targets")
    n_layers = model.config.num_hidden_layers
    layers = list(range(0, n_layers, cfg.layer_stride)) if cfg.layer_stride > 1 else None
    peft = None
    for name, r, alpha in (
        ("retain", cfg.retain_r, cfg.retain_alpha),
        ("forget", cfg.forget_r, cfg.forget_alpha),
    ):
        if r == 0:
            continue
        pc = PeftLoraConfig(
            r=r,
            lora_alpha=alpha,
            lora_dropout=0.0,
            target_modules=names,
            layers_to_transform=layers,
            fan_in_fan_out=fan_in_fan_out,
            task_type="CAUSAL_LM",
        )
        if peft is None:
            with peft_wrapping():
                peft = get_peft_model(model, pc, adapter_name=name)
        else:
            peft.add_adapter(name, pc)
    peft.base_model.set_adapter(routed_adapters(peft))  # both active, both trainable
    return peft


@contextlib.contextmanager
def forget_scale(model: nn.Module, scale: float) -> Iterator[nn.Module]:
    """The forget adapter's contribution times `scale` in [0, 1] inside (0: retain_only's
    weights, 1: both's), for evaluating how much of the hack each fraction of forget carries.
    It scales PEFT's per-adapter `scaling`, which the forward, `merge_and_unload` and
    `effective_weight` (the lean sampler's copy) all read."""
    if isinstance(scale, bool) or not 0.0 <= float(scale) <= 1.0:
        raise UserError(f"the forget scale must be in [0, 1], got {scale!r}")
    layers = [  # PEFT's LoRA layers (attention modules have a float `scaling` of their own)
        m
        for m in model.modules()
        if isinstance(getattr(m, "scaling", None), dict) and "forget" in m.scaling
    ]
    before = [m.scaling["forget"] for m in layers]
    try:
        for m, value in zip(layers, before, strict=True):
            m.scaling["forget"] = value * float(scale)
        yield model
    finally:
        for m, value in zip(layers, before, strict=True):
            m.scaling["forget"] = value


def routed_adapters(model: nn.Module) -> list[str]:
    """The routing adapters `model` has, in ADAPTERS order."""
    return [a for a in ADAPTERS if a in getattr(model, "peft_config", {})]


@contextlib.contextmanager
def adapter_mode(model: nn.Module, mode: str) -> Iterator[nn.Module]:
    """Only the mode's adapters active inside (forward, `effective_weight`, the lean sampler's
    copy); on exit the previous active set, and every parameter's requires_grad, come back."""
    if mode not in MODES:
        raise ValueError(f"adapter mode must be one of {', '.join(MODES)}, not {mode!r}")
    wanted = [a for a in MODES[mode] if a in routed_adapters(model)]
    before = list(model.base_model.active_adapters)
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        if wanted:
            model.base_model.set_adapter(wanted)
        with contextlib.nullcontext() if wanted else model.disable_adapter():
            yield model
    finally:
        model.base_model.set_adapter(before)
        for p, flag in flags:
            p.requires_grad_(flag)


def masks_for(flags: torch.Tensor, mode: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(retain mask, forget mask) [B] float for completions flagged as the hack; None = all rows.

    classic: flagged rows train forget only, the others both; exclusive: flagged rows forget
    only, the others retain only; none: every row trains both (the non-routed baseline)."""
    ok = (~flags.bool()).float()
    if mode == "classic":
        return ok, None
    if mode == "exclusive":
        return ok, 1.0 - ok
    if mode == "none":
        return None, None
    raise ValueError(f"routing mode must be classic, exclusive or none, not {mode!r}")


def _masked_linear_hook(mask: torch.Tensor):
    """A forward hook for a LoRA `lora_A`/`lora_B` Linear: its weight learns from masked rows."""

    def hook(module: nn.Linear, args, out: torch.Tensor) -> torch.Tensor:
        x = args[0]
        if x.shape[0] != mask.shape[0]:
            raise RuntimeError(
                f"routing_masks: a batch of {x.shape[0]} rows for {mask.shape[0]} "
                "masks (shared-prompt forwards cannot be routed)"
            )
        bias = None if module.bias is None else module.bias.detach()
        frozen = F.linear(x, module.weight.detach(), bias)
        m = mask.to(out.dtype).view(-1, *([1] * (out.dim() - 1)))
        return frozen + m * (out - frozen)

    return hook


@contextlib.contextmanager
def routing_masks(
    model: nn.Module, retain: torch.Tensor | None, forget: torch.Tensor | None
) -> Iterator[None]:
    """Forwards (and their backward) inside route per completion: adapter a's parameters get
    gradient only from rows whose mask is 1 (None or all ones: every row). Run the backward
    inside too when activation checkpointing recomputes the forward. Each forward must have one
    row per mask (no shared-prompt batches: `token_logprobs.logprobs(share_prompts=False)`)."""
    handles = []
    try:
        for name, mask in (("retain", retain), ("forget", forget)):
            if mask is None or bool((mask == 1).all()):
                continue
            hook = _masked_linear_hook(mask.detach().float())
            for module in model.modules():
                for part in ("lora_A", "lora_B"):
                    d = getattr(module, part, None)
                    linear = d[name] if isinstance(d, nn.ModuleDict) and name in d else None
                    if isinstance(linear, nn.Linear):
                        handles.append(linear.register_forward_hook(hook))
        yield
    finally:
        for h in handles:
            h.remove()


def saved_adapters(directory: str | Path) -> list[str]:
    """The routing adapters saved under `directory` (empty: not a routed checkpoint). The loop
    saves them through `RunDir.save_checkpoint`: PEFT's save_pretrained writes each adapter not
    named "default" to directory/<name>/, a standard PEFT adapter directory."""
    return [a for a in ADAPTERS if (Path(directory) / a / "adapter_config.json").is_file()]


def load_routed(base_model: nn.Module, directory: str | Path, trainable: bool = False):
    """The PEFT model of `base_model` with the adapters saved under `directory`, all active."""
    from peft import PeftModel

    names = saved_adapters(directory)
    if not names:
        raise UserError(f"{directory}: no retain/ or forget/ adapter directory")
    d = Path(directory)
    with peft_wrapping():
        model = PeftModel.from_pretrained(
            base_model, str(d / names[0]), adapter_name=names[0], is_trainable=trainable
        )
    for name in names[1:]:
        model.load_adapter(str(d / name), adapter_name=name, is_trainable=trainable)
    model.base_model.set_adapter(names, inference_mode=not trainable)
    return model


def load_routed_dir(
    directory: Path,
    mode: str = "both",
    attn_implementation: str = "sdpa",
    scale: float | None = None,
):
    """A plain HF model of a routed checkpoint in `mode`: the base its adapters name, the mode's
    adapters merged in (what `build_model` and `smollab sample --mode` use); scale: mode both
    with the forget adapter times it (`forget_scale`; `smollab sample --forget-scale`)."""
    from transformers import AutoModelForCausalLM

    names = saved_adapters(directory)
    base = json.loads((directory / names[0] / "adapter_config.json").read_text())
    base_path = base.get("base_model_name_or_path")
    if not base_path:
        raise UserError(f"{directory}: its adapters name no base model (trained from a preset?)")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            base_path, attn_implementation=attn_implementation
        )
    except OSError as e:
        raise UserError(
            f"{directory}: cannot load its base model {base_path}: {str(e).splitlines()[0]}"
        ) from None
    peft = load_routed(model, directory)
    wanted = [a for a in MODES[mode] if a in names]
    if not wanted:
        return peft.unload()
    peft.base_model.set_adapter(wanted, inference_mode=True)
    with forget_scale(peft, 1.0 if scale is None else scale):
        return peft.merge_and_unload(adapter_names=wanted)
