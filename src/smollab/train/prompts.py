"""GRPO prompts: the first `prompt_tokens` tokens of corpus stories, or lines of a prompts file.

Each prompt starts with the EOS token, the document separator of the pretraining token stream,
so the model sees a prompt exactly where it saw story openings in pretraining.
"""

from __future__ import annotations

import json
from pathlib import Path

from smollab.errors import UserError


def _read_texts(path: Path, limit: int | None) -> list[str]:
    texts = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                texts.append(json.loads(line)["text"])
            if limit and len(texts) >= limit:
                break
    return texts


def story_prompts(data_dir: str | Path, split: str, tokenizer, prompt_tokens: int,
                  limit: int | None = None) -> list[list[int]]:  # fmt: skip
    """Token-id prompts from `train.jsonl` or `test.jsonl` (the held-out split) of a data dir."""
    path = Path(data_dir) / f"{split}.jsonl"
    if not path.is_file():
        raise UserError(f"data.dir {data_dir} has no {path.name}: run `smollab data prepare`")
    texts = _read_texts(path, limit)
    return _encode(texts, tokenizer, prompt_tokens, truncate=True)


def file_prompts(path: str | Path, tokenizer, key: str = "grpo.prompts_file") -> list[list[int]]:
    """One prompt per non-empty line of a text file, used whole; errors name `key`."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{key}: no such file {p}")
    try:
        content = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{key}: {p} is not UTF-8 text ({e.reason})") from None
    texts = [line.strip() for line in content.splitlines() if line.strip()]
    if not texts:
        raise UserError(f"{key}: {p} holds no prompts")
    return _encode(texts, tokenizer, None, truncate=False)


def _encode(texts, tokenizer, n: int | None, truncate: bool) -> list[list[int]]:
    eos = tokenizer.eos_token_id
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    prompts = [[eos, *x[:n]] if truncate else [eos, *x] for x in ids if len(x) >= (n or 1)]
    if not prompts:
        raise UserError(f"no prompt of at least {n} tokens could be made")
    return prompts


def eval_prompts(g, data_dir: str | Path, tokenizer, n: int) -> list[list[int]]:
    """The first `n` evaluation prompts: grpo.eval_prompts_file's, else the first of
    grpo.prompts_file (which training draws too), else stories of the test split."""
    if g.eval_prompts_file:
        return file_prompts(g.eval_prompts_file, tokenizer, "grpo.eval_prompts_file")[:n]
    if g.prompts_file:
        return file_prompts(g.prompts_file, tokenizer)[:n]
    return story_prompts(data_dir, "test", tokenizer, g.prompt_tokens, n)[:n]


def grpo_prompts(g, data_dir: str | Path, tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """(training prompts, evaluation prompts) for the `grpo` section `g`."""
    if g.prompts_file:
        train = file_prompts(g.prompts_file, tokenizer)
    else:
        train = story_prompts(data_dir, "train", tokenizer, g.prompt_tokens, 20_000)
    return train, eval_prompts(g, data_dir, tokenizer, g.eval_prompts)
