"""The seed of one stream of seeded draws, from integers only.

Python's `hash` of a tuple of ints is the same in every process (only strings are salted by
PYTHONHASHSEED), so a resumed run draws what the uninterrupted one drew. Changing this function
changes every run's draws: resumed runs would no longer replay their first part.
"""

from __future__ import annotations


def stream_seed(*parts: int) -> int:
    """A non-negative 47-bit seed of `parts` (e.g. run seed, step, salt)."""
    return hash(parts) & 0x7FFF_FFFF_FFFF
