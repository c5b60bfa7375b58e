"""smollab: fast, systematic experiments on small language models."""

__version__ = "0.1.0"
