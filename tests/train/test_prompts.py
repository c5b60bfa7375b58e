import json

import pytest

from smollab.data.prompt_encode import encode_rows
from smollab.data.prompt_rows import text_rows
from smollab.data.tokenizer import load_tokenizer
from smollab.errors import UserError
from smollab.train.prompts import story_prompts


def test_story_prompts_start_with_a_document_break(micro_data):
    tok = load_tokenizer(micro_data / "tokenizer")
    prompts = story_prompts(micro_data, "test", tok, 8, limit=5)
    assert len(prompts) == 5
    assert all(p[0] == tok.eos_token_id and len(p) == 9 for p in prompts)


def test_text_prompts_start_with_a_document_break_and_errors(micro_data, tmp_path):
    tok = load_tokenizer(micro_data / "tokenizer")
    f = tmp_path / "p.txt"
    f.write_text("once upon a time\n\none day\n")
    rows = text_rows(f, "grpo.prompts_file")
    assert rows.prompts == ["once upon a time", "one day"] and rows.columns == {}
    ids = encode_rows(rows, tok, "micro").ids
    assert len(ids) == 2 and all(p[0] == tok.eos_token_id for p in ids)
    with pytest.raises(UserError, match="no such file"):
        text_rows(tmp_path / "nope.txt", "grpo.prompts_file")
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(UserError, match="holds no prompts"):
        text_rows(tmp_path / "empty.txt", "grpo.prompts_file")
    with pytest.raises(UserError, match="no test.jsonl"):
        story_prompts(tmp_path, "test", tok, 8)


def _grpo(micro_data, *overrides):
    from smollab.config.load import load_config

    return load_config("grpo", None, [f"data.dir={micro_data}", *overrides])


def test_eval_prompts_come_from_the_held_out_file_when_one_is_named(micro_data, tmp_path):
    from smollab.train.prompts import grpo_prompts

    tok = load_tokenizer(micro_data / "tokenizer")
    (tmp_path / "train.txt").write_text("once upon a time\none day\nthe cat\n")
    (tmp_path / "held.txt").write_text("a little bird\nthe sun\n")
    cfg = _grpo(micro_data, f"grpo.prompts_file={tmp_path / 'train.txt'}")
    p = grpo_prompts(cfg, tok, 2)
    # without a held-out file: the first of the training prompts
    assert p.held_out.ids == p.train.ids[:2]
    cfg = _grpo(
        micro_data,
        f"grpo.prompts_file={tmp_path / 'train.txt'}",
        f"grpo.eval_prompts_file={tmp_path / 'held.txt'}",
    )
    p = grpo_prompts(cfg, tok, 2)
    held = encode_rows(text_rows(tmp_path / "held.txt", "k"), tok, "micro").ids
    assert len(p.train) == 3 and p.held_out.ids == held
    assert not set(map(tuple, held)) & set(map(tuple, p.train.ids))
    cfg = _grpo(micro_data, f"grpo.eval_prompts_file={tmp_path / 'nope.txt'}")
    with pytest.raises(UserError, match=r"grpo\.eval_prompts_file: no such file"):
        grpo_prompts(cfg, tok, 2)


TRICKY = [
    "Once upon\na time  there\twas a cat.",
    "  two\r\nlines \u00a0nbsp here, and more",
    "the\x1cn went home, then the end",
    "can't won't 's 42 3.5 !! ?? end of it",
    "Émile est là, über alles; 日本語のテキスト too",
    "short",
]


@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "bert", "metaspace"])
def test_story_prompts_tokenize_only_the_first_words_and_get_the_same_prompts(
    tmp_path, micro_data, kind, monkeypatch
):
    """Tokenizers that split at spaces, tabs and newlines (both of smollab's kinds, BERT's) get,
    from a story's first words, the prompt the whole story gives, on micro stories and on texts
    with newlines, tabs, odd spaces and control characters; Metaspace (split at spaces only)
    keeps whole texts."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from smollab.data.tokenizer import build_tokenizer, wrap
    from smollab.train import prompts as pr

    lines = (micro_data / "train.jsonl").read_text().splitlines()[:200]
    texts = [json.loads(x)["text"] for x in lines]
    if kind in ("wordpiece", "bpe"):
        tok = wrap(build_tokenizer(texts + TRICKY, kind, 300), kind)
    else:
        raw = Tokenizer(models.BPE(unk_token="[UNK]"))
        if kind == "bert":
            raw.normalizer = normalizers.BertNormalizer()
            raw.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        else:
            raw.pre_tokenizer = pre_tokenizers.Metaspace()
        raw.train_from_iterator(
            texts + TRICKY,
            trainers.BpeTrainer(
                vocab_size=300, special_tokens=["[UNK]", "[EOS]"], show_progress=False
            ),
        )
        tok = wrap(raw, "wordpiece")
    assert pr._splits_at_whitespace(tok) == (kind != "metaspace")
    data = tmp_path / "d"
    data.mkdir()
    (data / "test.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in TRICKY + texts[:50])
    )
    for n in (1, 2, 3, 8, 40):
        heads = pr.story_prompts(data, "test", tok, n)
        monkeypatch.setattr(pr, "_splits_at_whitespace", lambda t: False)
        assert heads == pr.story_prompts(data, "test", tok, n), n
        monkeypatch.undo()


def test_the_prompt_order_walks_epochs_of_seeded_permutations():
    """Each epoch holds every prompt once; a step may straddle two epochs; the order is a pure
    function of (seed, step), so a resumed run takes what the uninterrupted one took."""
    from smollab.train.prompts import PromptOrder

    order = PromptOrder(5)
    steps = [order.pick(0, s, 2) for s in range(5)]  # 2 epochs of 5 prompts, 2 a step
    flat = [i for s in steps for i in s]
    assert sorted(flat[:5]) == sorted(flat[5:]) == list(range(5))
    assert flat[:5] != flat[5:]  # each epoch its own permutation
    assert PromptOrder(5).pick(0, 2, 2) == steps[2]  # a fresh order, mid-walk: the same
    assert order.pick(1, 0, 5) != order.pick(0, 0, 5)  # another seed, another order
    assert order.steps(2, 2) == 5 and order.steps(0.5, 2) == 2 and order.steps(0.01, 2) == 1
