"""Which HF configs the lean engine reads, and what it must do for each; refused in one line else.

Kept apart from the forward so that the sampler and the reference can ask whether a model goes
through the lean engine (and say why not) without reading the engine's code. `lean_spec` is the
one place that decides: `check_lean_compatible` is it without the answer.

The families (transformers 5's modeling files are the reference for each):
- llama (Llama 2/3, SmolLM2, Llama 3.2): biases only with `attention_bias` (q, k, v, o) and
  `mlp_bias` (gate, up, down).
- qwen2 (Qwen2, Qwen2.5): q, k and v always have biases, o none; sliding-window layers
  (`use_sliding_window` with `max_window_layers`, as `config.layer_types` says) are refused.
- qwen3: a per-head RMSNorm of q and k over head_dim (`q_norm`, `k_norm`) before RoPE, an
  explicit head_dim, biases (q, k, v, o) only with `attention_bias`.
- smollm3: Llama's layers, except that the layers `no_rope_layers` marks 0 (every
  `no_rope_layer_interval`-th, counting from 1) apply no RoPE (NoPE).
RoPE tables come from transformers' own rotary embedding of the family (`ROPE_INIT_FUNCTIONS`
for the scaled types): every type whose frequencies are fixed at init (default, linear, llama3,
yarn, ...) is read, its `attention_scaling` multiplied into cos and sin as HF does; types that
recompute their frequencies from the sequence length as they run (dynamic, longrope) are refused.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

__all__ = ["LeanSpec", "check_lean_compatible", "lean_spec"]

# model_type -> the module and class of its rotary embedding (the RoPE tables' reference)
_ROTARY = {
    "llama": ("llama", "LlamaRotaryEmbedding"),
    "qwen2": ("qwen2", "Qwen2RotaryEmbedding"),
    "qwen3": ("qwen3", "Qwen3RotaryEmbedding"),
    "smollm3": ("smollm3", "SmolLM3RotaryEmbedding"),
}


@dataclass(frozen=True)
class LeanSpec:
    """What the lean forward does for one config beyond plain Llama's arithmetic.

    qkv_bias, o_bias, mlp_bias: which linears add a bias (gate, up and down share mlp_bias).
    qk_norm: q and k go through a per-head RMSNorm (weights `q_norm`, `k_norm`) before RoPE.
    rope_layers: per layer, whether it applies RoPE (False: a NoPE layer).
    inv_freq [head_dim / 2] float32 and attention_scaling: the RoPE frequencies and the factor
    on cos and sin, as transformers' rotary embedding computes them.
    """

    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    rope_layers: tuple[bool, ...]
    inv_freq: torch.Tensor
    attention_scaling: float

    @property
    def plain(self) -> bool:
        """Plain Llama arithmetic: no biases, no q/k norms, RoPE in every layer."""
        extras = (self.qkv_bias, self.o_bias, self.mlp_bias, self.qk_norm)
        return not any(extras) and all(self.rope_layers)


def lean_spec(config) -> LeanSpec:
    """The `LeanSpec` of an HF config; NotImplementedError, in one line, naming what the lean
    engine does not implement in it."""
    if getattr(config, "quantization_config", None) is not None:  # model.load_in
        raise NotImplementedError("LeanLlama reads full-precision weights; this model is quantized")
    model_type = getattr(config, "model_type", "llama")
    if model_type not in _ROTARY:
        raise NotImplementedError(
            f"LeanLlama reads model_type {', '.join(map(repr, _ROTARY))}, not {model_type!r}"
        )
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise NotImplementedError(f"LeanLlama supports hidden_act 'silu' only, not {act!r}")
    L = config.num_hidden_layers
    sliding = [
        i for i, t in enumerate(getattr(config, "layer_types", None) or []) if t != "full_attention"
    ]
    if sliding:
        raise NotImplementedError(
            f"LeanLlama implements full attention only; layers {sliding} are "
            f"{config.layer_types[sliding[0]]!r} (sliding_window={config.sliding_window})"
        )
    attention_bias = bool(getattr(config, "attention_bias", False))
    mlp_bias = bool(getattr(config, "mlp_bias", False))
    rope_layers = (True,) * L
    if model_type == "qwen2":  # q, k, v biases in the architecture, no config key
        qkv_bias, o_bias, mlp_bias = True, False, False
    elif model_type == "qwen3":
        qkv_bias = o_bias = attention_bias
        mlp_bias = False
    else:
        qkv_bias = o_bias = attention_bias
    if model_type == "smollm3":
        rope_layers = tuple(bool(config.no_rope_layers[i]) for i in range(L))
    inv_freq, scaling = _rope_init(config, model_type)
    return LeanSpec(
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        qk_norm=model_type == "qwen3",
        rope_layers=rope_layers,
        inv_freq=inv_freq,
        attention_scaling=scaling,
    )


def check_lean_compatible(config) -> None:
    """Raise NotImplementedError naming what the lean engine does not support in this config."""
    lean_spec(config)


def _rope_init(config, model_type: str) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention_scaling) from the family's own rotary embedding, refusing the RoPE
    types whose frequencies change as the model runs and partial rotary embeddings."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if any(isinstance(v, dict) for v in params.values()):
        raise NotImplementedError("LeanLlama reads one RoPE for all layers, not one per layer type")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if "dynamic" in rope_type or rope_type == "longrope":
        raise NotImplementedError(
            f"LeanLlama does not implement rope_type={rope_type!r} (its frequencies change "
            "with the sequence length as the model runs)"
        )
    module, name = _ROTARY[model_type]
    rotary = getattr(
        importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name
    )
    try:
        with torch.device("cpu"):
            emb = rotary(config)
    except KeyError:
        raise NotImplementedError(f"transformers has no rope_type={rope_type!r}") from None
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if emb.inv_freq.numel() * 2 != head_dim:
        raise NotImplementedError(
            f"LeanLlama rotates whole heads; this RoPE covers {2 * emb.inv_freq.numel()} of "
            f"head_dim {head_dim} (partial_rotary_factor)"
        )
    return emb.inv_freq.float(), float(emb.attention_scaling)
