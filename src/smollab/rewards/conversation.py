"""TRL's conversational form, for the rewards written for text.

With chat-message prompts, TRL (and smollab) pass each completion as the assistant's message,
`[{"role": "assistant", "content": text}]`, and each prompt as its messages. The built-in rewards
read text, so `plain_text` gives them the assistant's text and each prompt's contents, one
message a line; a text completion or prompt passes unchanged. So a built-in runs on either form,
in smollab or under TRL.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any


def text_of(value: Any) -> str:
    """A completion or prompt as text: a string as it is, messages as their contents joined by
    newlines (a completion is one message: its content)."""
    if isinstance(value, str):
        return value
    return "\n".join(m["content"] for m in value)


def plain_text(fn: Callable[..., Sequence[float]]) -> Callable[..., Sequence[float]]:
    """`fn` (a reward reading text) reading TRL's conversational completions and prompts too.
    The signature stays `fn`'s (`functools.wraps`), which the registry checks params against."""

    @functools.wraps(fn)
    def reward(completions: list[Any], prompts: list[Any] | None = None, **kwargs: Any):
        texts = [text_of(c) for c in completions]
        return fn(
            texts, prompts=None if prompts is None else [text_of(p) for p in prompts], **kwargs
        )

    return reward
