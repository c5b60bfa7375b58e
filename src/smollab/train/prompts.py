"""GRPO prompts: the first `prompt_tokens` tokens of corpus stories, or prompts from data (a
prompts file or a dataset, `data.prompt_rows`), with their held-out set.

A story prompt starts with the EOS token, the document separator of the pretraining token stream,
so the model sees a prompt exactly where it saw story openings in pretraining; prompts from data
are encoded by `data.prompt_encode` (text after EOS, chat messages through the chat template).

A story prompt needs only a story's first tokens, so only its first words are tokenized when the
tokenizer's pre-tokenizer splits at whitespace (then a word's tokens do not depend on the words
after it). The 1.25M recipes' prompts (20,000 training stories, 32 held out) took 0.8 s instead
of 3.1 s on the dev CPU (AVX2 EPYC), the same prompts: a cost every `smollab grpo` start pays,
and so every trial of a sweep.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from smollab.data.prompt_encode import encode_rows
from smollab.data.prompt_rows import PromptRows, file_rows, held_out, load_rows
from smollab.errors import UserError
from smollab.train.seeds import stream_seed


def _read_texts(path: Path, limit: int | None) -> list[str]:
    texts = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                texts.append(json.loads(line)["text"])
            if limit and len(texts) >= limit:
                break
    return texts


# Pre-tokenizers whose pieces never span a space, tab or newline (`tokenizers`' JSON type names),
# with the option that must hold. Not Metaspace: it splits at spaces only. The cut is at these four
# characters only, not at every Unicode space: BERT's normalizer deletes some characters Python
# calls whitespace (\x1c), joining the words around them.
_WORD_LOCAL = {
    "Whitespace": None,
    "WhitespaceSplit": None,
    "BertPreTokenizer": None,
    "ByteLevel": ("use_regex", True),
}
_GAP, _WORD = "[ \t\n\r]", "[^ \t\n\r]+"


def story_prompts(
    data_dir: str | Path, split: str, tokenizer, prompt_tokens: int, limit: int | None = None
) -> list[list[int]]:
    """Token-id prompts from `train.jsonl` or `test.jsonl` (the held-out split) of a data dir."""
    path = Path(data_dir) / f"{split}.jsonl"
    if not path.is_file():
        raise UserError(f"data.dir {data_dir} has no {path.name}: run `smollab data prepare`")
    texts = _read_texts(path, limit)
    if not _splits_at_whitespace(tokenizer):
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        return _prompts(ids, tokenizer.eos_token_id, prompt_tokens)
    n = prompt_tokens - 1  # the first prompt_tokens words: each gives at least one token
    first = re.compile(rf"{_GAP}*{_WORD}(?:{_GAP}+{_WORD}){{{n}}}")
    heads = [m.group(0) if (m := first.match(t)) else t for t in texts]
    ids = tokenizer(heads, add_special_tokens=False)["input_ids"]
    for i, (head, text) in enumerate(zip(heads, texts, strict=True)):
        if len(ids[i]) < prompt_tokens and len(head) < len(text):  # a word gave no token
            ids[i] = tokenizer(text, add_special_tokens=False)["input_ids"]
    return _prompts(ids, tokenizer.eos_token_id, prompt_tokens)


def _splits_at_whitespace(tokenizer) -> bool:
    """Whether `tokenizer` (a fast one) splits text at spaces, tabs and newlines before its model
    runs, so a prefix of a text cut there tokenizes as the start of the whole text."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    pre = json.loads(backend.to_str()).get("pre_tokenizer") if backend is not None else None

    def local(p: dict | None) -> bool:
        if not p:
            return False
        if p.get("type") == "Sequence":  # the others only split further
            return any(local(q) for q in p.get("pretokenizers", []))
        if p.get("type") not in _WORD_LOCAL:
            return False
        need = _WORD_LOCAL[p["type"]]
        return need is None or p.get(need[0], need[1]) == need[1]

    return local(pre)


def _prompts(ids: list[list[int]], eos: int, n: int):
    """[EOS, first n tokens] of each text of at least n tokens."""
    prompts = [[eos, *x[:n]] for x in ids if len(x) >= n]
    if not prompts:
        raise UserError(f"no prompt of at least {n} tokens could be made")
    return prompts


@dataclass
class PromptSet:
    """Prompts as token ids, and as the data holds them with their columns (None for story
    openings, which have no columns: the rewards see their decoded text)."""

    ids: list[list[int]]
    rows: PromptRows | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def head(self, n: int) -> PromptSet:
        return PromptSet(self.ids[:n], None if self.rows is None else self.rows.head(n))

    def data(self, picked: Sequence[int]) -> PromptRows | None:
        """The rows of these prompts (a reward call's `rows`), or None."""
        return None if self.rows is None else self.rows.select(picked)

    @property
    def columns(self) -> list[str]:
        return [] if self.rows is None else list(self.rows.columns)

    @property
    def source(self) -> str:
        return "" if self.rows is None else self.rows.source


@dataclass
class Prompts:
    """A run's training and held-out prompts, and how they were chosen (for its log)."""

    train: PromptSet
    held_out: PromptSet
    note: str


class PromptOrder:
    """Which prompts each GRPO step takes: the steps walk through the prompts epoch after epoch,
    each epoch a permutation seeded by (run.seed, epoch), and step s takes the next `groups` of
    them (an epoch's last step may reach into the next). A pure function of (seed, step), so a
    resumed run continues mid-epoch exactly, and a lane with its seed takes what its run alone
    takes. `train.epochs` counts passes of this walk."""

    def __init__(self, n: int):
        self.n = n
        self._perms: dict[tuple[int, int], list[int]] = {}

    def _perm(self, seed: int, epoch: int) -> list[int]:
        key = (seed, epoch)
        if key not in self._perms:
            gen = torch.Generator(device="cpu").manual_seed(stream_seed(seed, epoch, 0))
            self._perms[key] = torch.randperm(self.n, generator=gen, device="cpu").tolist()
        return self._perms[key]

    def pick(self, seed: int, step: int, groups: int, steps: int = 1) -> list[int]:
        """The indices of the prompts of `steps` steps from `step` (0-based), `groups` a step."""
        return [
            self._perm(seed, pos // self.n)[pos % self.n]
            for pos in range(step * groups, (step + steps) * groups)
        ]

    def steps(self, epochs: float, groups: int) -> int:
        """The steps `epochs` passes over the prompts take, `groups` prompts a step."""
        return max(1, math.ceil(epochs * self.n / groups))


def encode(rows: PromptRows, tokenizer, model: str, system_prompt: str | None, key: str):
    return PromptSet(encode_rows(rows, tokenizer, model, system_prompt, key).ids, rows)


def same_form(train: PromptRows | None, held: PromptRows | None, key: str) -> None:
    """Training and held-out prompts in one form, with the same columns: every column reaches
    every reward, on the held-out prompts too."""
    if held is None:
        return
    if train is not None and train.conversational != held.conversational:
        forms = ("chat messages", "text") if held.conversational else ("text", "chat messages")
        raise UserError(
            f"{key}: the held-out prompts ({held.source}) are {forms[0]} and the training ones "
            f"{forms[1]}: give both in one form"
        )
    mine = [] if train is None else list(train.columns)
    if sorted(mine) != sorted(held.columns):
        raise UserError(
            f"{key}: the held-out prompts ({held.source}) have columns "
            f"{', '.join(held.columns) or 'none'} and the training ones "
            f"{', '.join(mine) or 'none'}: the rewards read the same columns on both"
        )


def grpo_prompts(cfg, tokenizer, n_eval: int) -> Prompts:
    """The training and held-out prompts of a GRPO config (grpo.prompts_file, data.hf_dataset or
    the data dir's stories; the held-out ones from grpo.eval_prompts_file, data.eval_split,
    data.eval_fraction, the test split's stories, else the first `n_eval` training prompts)."""
    g, d = cfg.grpo, cfg.data
    model = str(cfg.model.path or cfg.model.preset)
    rows = load_rows(g.prompts_file, "grpo.prompts_file", d)
    key = "grpo.eval_prompts_file"
    if rows is None:  # story openings; held out: a file, else the test split's stories
        held = file_rows(g.eval_prompts_file, key) if g.eval_prompts_file else None
        same_form(None, held, key)
        train = PromptSet(story_prompts(d.dir, "train", tokenizer, g.prompt_tokens, 20_000))
        if held is not None:
            note = f"stories of {d.dir}; held out: {held.describe()}"
            return Prompts(train, encode(held, tokenizer, model, None, ""), note)
        test = story_prompts(d.dir, "test", tokenizer, g.prompt_tokens, n_eval)[:n_eval]
        return Prompts(train, PromptSet(test), f"stories of {d.dir} (the test split held out)")
    rows, held, how = held_out(rows, g.eval_prompts_file, key, d)
    same_form(rows, held, key)
    train = encode(rows, tokenizer, model, g.system_prompt, "grpo.system_prompt")
    note = f"prompts: {rows.describe()}; held out: "
    if held is None:
        return Prompts(train, train.head(n_eval), note + "none (the first training prompts)")
    return Prompts(
        train, encode(held, tokenizer, model, g.system_prompt, "grpo.system_prompt"), note + how
    )
