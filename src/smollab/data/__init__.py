"""Data: the offline story generator, corpus loaders (offline, HF hub, files), tokenizers, and
memmapped uint16 token files with batch sampling. `prepare.prepare` runs the whole pipeline."""
