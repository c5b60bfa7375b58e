"""Model presets as Hugging Face configs: the SimpleStories family, CS336 17M, GPT-2 124M, micro.

A preset is only a config; weights come from `build_model` (random init) or a checkpoint.
The vocabulary follows the tokenizer when one is given, so a preset fits any prepared data.
"""

from __future__ import annotations

from typing import Any

from smollab.errors import UserError

_SIMPLESTORIES = dict(
    arch="llama",
    vocab_size=4096,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=True,
    num_key_value_heads=2,
)

PRESETS: dict[str, dict[str, Any]] = {
    "simplestories-1.25m": dict(
        _SIMPLESTORIES,
        num_hidden_layers=4,
        hidden_size=128,
        num_attention_heads=4,
        intermediate_size=341,
    ),
    "simplestories-5m": dict(
        _SIMPLESTORIES,
        num_hidden_layers=6,
        hidden_size=256,
        num_attention_heads=4,
        intermediate_size=682,
    ),
    "simplestories-11m": dict(
        _SIMPLESTORIES,
        num_hidden_layers=6,
        hidden_size=384,
        num_attention_heads=6,
        intermediate_size=1024,
    ),
    "simplestories-30m": dict(
        _SIMPLESTORIES,
        num_hidden_layers=10,
        hidden_size=512,
        num_attention_heads=8,
        intermediate_size=1365,
    ),
    "simplestories-35m": dict(
        _SIMPLESTORIES,
        num_hidden_layers=12,
        hidden_size=512,
        num_attention_heads=8,
        intermediate_size=1365,
    ),
    # CS336 assignment 1: d_model 512, d_ff 1344, 4 layers, 16 heads, context 256, untied head.
    "cs336-17m": dict(
        arch="llama",
        vocab_size=10000,
        max_position_embeddings=256,
        num_hidden_layers=4,
        hidden_size=512,
        num_attention_heads=16,
        num_key_value_heads=16,
        intermediate_size=1344,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    ),
    "gpt2-124m": dict(
        arch="gpt2",
        vocab_size=50257,
        n_positions=1024,
        n_embd=768,
        n_layer=12,
        n_head=12,
        tie_word_embeddings=True,
    ),
    # A few thousand parameters (with a small vocabulary): for tests and smoke runs.
    "micro": dict(
        arch="llama",
        vocab_size=256,
        max_position_embeddings=256,
        num_hidden_layers=2,
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    ),
}


def preset_config(name: str, vocab_size: int | None = None, **overrides: Any):
    """The HF config of a preset; `vocab_size` (from the tokenizer) replaces the preset's."""
    if name not in PRESETS:
        raise UserError(f"model.preset: unknown preset {name!r} (one of {', '.join(PRESETS)})")
    spec = dict(PRESETS[name], **overrides)
    arch = spec.pop("arch")
    if vocab_size is not None:
        spec["vocab_size"] = vocab_size
    if arch == "gpt2":
        from transformers import GPT2Config

        return GPT2Config(**spec)
    from transformers import LlamaConfig

    return LlamaConfig(**spec)


def count_parameters(model) -> tuple[int, int]:
    """(total, non-embedding) unique parameters; tied weights count once."""
    seen: set[int] = set()
    total = embed = 0
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        if "embed" in name or name.endswith(("wte.weight", "wpe.weight")) or "lm_head" in name:
            embed += p.numel()
    return total, total - embed
