"""Where smollab keeps what it measured about this machine (CPU matmul peaks, probe results).

Its own module, free of torch, so a lab parent can read those caches without `import torch`.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """Where smollab keeps what it measured about this machine (CPU peaks, probe results):
    SMOLLAB_CACHE_DIR, else $XDG_CACHE_HOME/smollab, else ~/.cache/smollab."""
    if os.environ.get("SMOLLAB_CACHE_DIR"):
        return Path(os.environ["SMOLLAB_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "smollab"
