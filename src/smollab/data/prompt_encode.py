"""Prompts to token ids, as the model will read them.

- A text prompt is `[EOS] + its tokens`: smollab's small models learnt text after a document
  break, so a prompt starts where a document would.
- Chat messages (a conversational prompt, or a text prompt under a system prompt) go through the
  tokenizer's chat template with the generation prompt (`add_generation_prompt=True`), or, when
  the last message is the assistant's, continuing that message (TRL's prefill rule); the
  template's text is tokenized without adding special tokens, since it holds its own, as TRL
  does. A model without a chat template is refused in one line naming the column and the model.

Each prompt also comes back as the text the model reads (the template's rendering for chat),
which RFT's kept records store as their prompt, so a round's SFT sees what generation saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from smollab.data.prompt_rows import PromptRows
from smollab.errors import UserError


@dataclass
class Encoded:
    """Token ids of each prompt and the text they encode."""

    ids: list[list[int]]
    texts: list[str]


def text_ids(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Each text's tokens after a document break (EOS)."""
    eos = tokenizer.eos_token_id
    enc = tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    return [[eos, *ids] for ids in enc]


def chat_text(tokenizer, messages: list[dict[str, Any]]) -> str:
    """The chat template's text for `messages`, ready for the assistant's turn."""
    prefill = messages[-1]["role"] == "assistant"
    return tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        add_generation_prompt=not prefill,
        continue_final_message=prefill,
    )


def encode_rows(
    rows: PromptRows,
    tokenizer,
    model: str,
    system_prompt: str | None = None,
    system_key: str = "grpo.system_prompt",
) -> Encoded:
    """`rows`' prompts as ids (see the module docstring); `model` names the model and
    `system_key` the system prompt's config key in a refusal."""
    if not rows.conversational and system_prompt is None:
        return Encoded(text_ids(tokenizer, rows.prompts), list(rows.prompts))
    if not getattr(tokenizer, "chat_template", None):
        what = (
            f"the {rows.field} column of {rows.source} holds chat messages"
            if rows.conversational
            else f"{system_key} makes each prompt chat messages"
        )
        raise UserError(
            f"{what}, and model {model} has no chat template (its tokenizer_config.json "
            "names none): give text prompts, or a chat model"
        )
    if rows.conversational and system_prompt is not None:
        raise UserError(
            f"{system_key} goes before text prompts, and the {rows.field} column of {rows.source} holds chat messages: put "
            "a system message in them instead"
        )
    chats = rows.prompts
    if system_prompt is not None:
        chats = [
            [{"role": "system", "content": system_prompt}, {"role": "user", "content": p}]
            for p in rows.prompts
        ]
    texts = [chat_text(tokenizer, m) for m in chats]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return Encoded([list(x) for x in ids], texts)
