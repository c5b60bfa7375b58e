"""Models: presets as HF configs, loading by path or hub id, LoRA, and a lean Llama forward."""
