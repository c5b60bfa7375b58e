"""Prompts to token ids: text after a document break, chat messages through each family's
published chat template (the offline replicas), and the refusals."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from smollab.data.prompt_encode import encode_rows, text_ids
from smollab.data.prompt_rows import PromptRows
from smollab.errors import UserError
from tests.replicas import FAMILIES

CHAT = [
    [{"role": "system", "content": "answer in one word"}, {"role": "user", "content": "sky?"}],
    [{"role": "user", "content": "two plus two"}],
]


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_prompts_are_the_family_template_ready_for_the_assistant(replica_dir, family):
    tok = AutoTokenizer.from_pretrained(replica_dir)
    enc = encode_rows(PromptRows(CHAT, {}, "src"), tok, family)
    for messages, ids, text in zip(CHAT, enc.ids, enc.texts, strict=True):
        want = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert text == want
        assert ids == tok(want, add_special_tokens=False)["input_ids"]
        assert ids[0] != tok.eos_token_id or want.startswith(tok.eos_token)  # no EOS prefix
        assert tok.decode(ids).endswith(want[-12:])
    # a system prompt before text prompts: the same as writing the messages out
    enc_sys = encode_rows(PromptRows(["sky?"], {}, "src"), tok, family, "answer in one word")
    assert enc_sys.ids[0] == enc.ids[0]
    # the assistant's message last: continued, not a new turn (TRL's prefill)
    prefill = [*CHAT[1], {"role": "assistant", "content": "The answer is"}]
    (text,) = encode_rows(PromptRows([prefill], {}, "src"), tok, family).texts
    assert text.rstrip().endswith("The answer is")


def test_text_prompts_start_after_a_document_break(micro_model):
    tok = AutoTokenizer.from_pretrained(micro_model / "checkpoints" / "final")
    enc = encode_rows(PromptRows(["once upon a time"], {}, "src"), tok, "micro")
    assert enc.ids == text_ids(tok, ["once upon a time"]) and enc.ids[0][0] == tok.eos_token_id
    assert enc.texts == ["once upon a time"]


def test_chat_without_a_template_and_a_system_prompt_on_chats_are_refused(micro_model, replicas):
    tok = AutoTokenizer.from_pretrained(micro_model / "checkpoints" / "final")
    with pytest.raises(
        UserError,
        match=r"the prompt column of src holds chat messages, and "
        r"model m has no chat template",
    ) as e:
        encode_rows(PromptRows(CHAT, {}, "src"), tok, "m")
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match=r"rft.system_prompt makes each prompt chat messages"):
        encode_rows(PromptRows(["hi"], {}, "src"), tok, "m", "be brief", "rft.system_prompt")
    chat_tok = AutoTokenizer.from_pretrained(replicas("qwen2.5"))
    with pytest.raises(UserError, match=r"grpo.system_prompt goes before text prompts"):
        encode_rows(PromptRows(CHAT, {}, "src"), chat_tok, "q", "be brief")
