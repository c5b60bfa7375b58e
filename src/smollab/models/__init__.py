"""Models: presets as HF configs, loading by path or hub id, LoRA, HF weight helpers."""
