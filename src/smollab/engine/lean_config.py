"""Which HF Llama configs `LeanLlama` reads, refused in one line each otherwise.

Kept apart from the forward so that the sampler and the reference can ask whether a model goes
through the lean engine (and say why not) without reading the engine's code.
"""

from __future__ import annotations

__all__ = ["check_lean_compatible", "rope_params"]


def check_lean_compatible(config) -> None:
    """Raise NotImplementedError naming what `LeanLlama` does not support in this config."""
    if getattr(config, "quantization_config", None) is not None:  # model.load_in
        raise NotImplementedError("LeanLlama reads full-precision weights; this model is quantized")
    model_type = getattr(config, "model_type", "llama")
    if model_type != "llama":
        raise NotImplementedError(f"LeanLlama supports model_type 'llama' only, not {model_type!r}")
    rope_type = rope_params(config)[0]
    if rope_type != "default":
        raise NotImplementedError(
            f"LeanLlama supports only default RoPE; this config has rope_type={rope_type!r} "
            "(use the HF model for scaled RoPE)"
        )
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise NotImplementedError(f"LeanLlama supports hidden_act 'silu' only, not {act!r}")
    for flag in ("attention_bias", "mlp_bias"):
        if getattr(config, flag, False):
            raise NotImplementedError(f"LeanLlama does not support {flag}=True")


def rope_params(config) -> tuple[str, float]:
    """(rope_type, rope_theta) from a transformers 5 `rope_parameters` or a v4 `rope_scaling`."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    params = dict(params or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return rope_type, float(theta)
