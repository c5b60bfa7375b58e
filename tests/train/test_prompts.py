import json

import pytest

from smollab.data.tokenizer import load_tokenizer
from smollab.errors import UserError
from smollab.train.prompts import file_prompts, story_prompts


def test_story_prompts_start_with_a_document_break(micro_data):
    tok = load_tokenizer(micro_data / "tokenizer")
    prompts = story_prompts(micro_data, "test", tok, 8, limit=5)
    assert len(prompts) == 5
    assert all(p[0] == tok.eos_token_id and len(p) == 9 for p in prompts)


def test_file_prompts_and_errors(micro_data, tmp_path):
    tok = load_tokenizer(micro_data / "tokenizer")
    f = tmp_path / "p.txt"
    f.write_text("once upon a time\n\none day\n")
    prompts = file_prompts(f, tok)
    assert len(prompts) == 2 and prompts[0][0] == tok.eos_token_id
    with pytest.raises(UserError, match="no such file"):
        file_prompts(tmp_path / "nope.txt", tok)
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(UserError, match="holds no prompts"):
        file_prompts(tmp_path / "empty.txt", tok)
    with pytest.raises(UserError, match="no test.jsonl"):
        story_prompts(tmp_path, "test", tok, 8)


def test_eval_prompts_come_from_the_held_out_file_when_one_is_named(micro_data, tmp_path):
    from smollab.config import GRPOSection
    from smollab.train.prompts import grpo_prompts

    tok = load_tokenizer(micro_data / "tokenizer")
    (tmp_path / "train.txt").write_text("once upon a time\none day\nthe cat\n")
    (tmp_path / "held.txt").write_text("a little bird\nthe sun\n")
    g = GRPOSection(prompts_file=str(tmp_path / "train.txt"), eval_prompts=2)
    train, evals = grpo_prompts(g, micro_data, tok)
    assert evals == train[:2]  # without a held-out file: the first of the training prompts
    g = GRPOSection(prompts_file=str(tmp_path / "train.txt"), eval_prompts=2,
                    eval_prompts_file=str(tmp_path / "held.txt"))  # fmt: skip
    train, evals = grpo_prompts(g, micro_data, tok)
    assert len(train) == 3 and evals == file_prompts(tmp_path / "held.txt", tok)
    assert not set(map(tuple, evals)) & set(map(tuple, train))
    g = GRPOSection(eval_prompts=2, eval_prompts_file=str(tmp_path / "nope.txt"))
    with pytest.raises(UserError, match=r"grpo\.eval_prompts_file: no such file"):
        grpo_prompts(g, micro_data, tok)


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_story_prompts_tokenize_only_the_first_words_and_get_the_same_prompts(micro_data, kind,
                                                                               monkeypatch):  # fmt: skip
    """Both tokenizer kinds split at whitespace, so tokenizing a story's first words gives the
    prompt the whole story gives; a pre-tokenizer that does not split there keeps whole texts."""
    from tokenizers import pre_tokenizers

    from smollab.data.tokenizer import build_tokenizer, wrap
    from smollab.train import prompts as pr

    lines = (micro_data / "train.jsonl").read_text().splitlines()[:200]
    tok = wrap(build_tokenizer([json.loads(x)["text"] for x in lines], kind, 300), kind)
    assert pr._splits_at_whitespace(tok)
    for n in (1, 8, 40):
        heads = pr.story_prompts(micro_data, "test", tok, n)
        monkeypatch.setattr(pr, "_splits_at_whitespace", lambda t: False)
        assert heads == pr.story_prompts(micro_data, "test", tok, n)
        monkeypatch.undo()
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(use_regex=False)
    assert not pr._splits_at_whitespace(tok)
