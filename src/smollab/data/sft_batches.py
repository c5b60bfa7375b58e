"""SFT's token rows and batches: records tokenized with the model's tokenizer, optionally packed,
and served as micro-batches through a torch DataLoader.

- An example is prompt tokens + completion tokens + EOS. Labels are the tokens themselves, and
  -100 on the prompt (`completion_only`) and on each example's first token (nothing precedes it
  to predict it from); the loss shifts them by one, as HF's causal-LM loss does.
- An example longer than `seq_len` is cut to `seq_len` and counted (`truncated`); one with no
  label left after the cut is dropped and counted (`dropped`). Never silent: the loop logs both
  and keeps them in the summary.
- Packing puts consecutive examples into one row while they fit. Position ids restart at 0 at
  each example, and HF's Llama (transformers >= 4.54, `masking_utils.find_packed_sequence_indices`)
  reads restarts in `position_ids` (with no attention mask) as a block-diagonal causal mask, so
  an example never attends to the one before it. Padding continues the last example's positions
  and carries no label, so nothing attends to it.
- Micro-batch `m` of the run is a pure function of (seed, m): epoch e = m // batches_per_epoch
  shuffles the rows with seed (seed, e), so a resumed run starts its loader at the first
  micro-batch it has not trained on and sees exactly what the uninterrupted run saw.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset

from smollab.data.sft_records import Record
from smollab.errors import UserError

IGNORE = -100


@dataclass
class Row:
    ids: list[int]
    labels: list[int]
    positions: list[int]


@dataclass
class Tokenized:
    rows: list[Row]
    examples: int = 0
    truncated: int = 0
    dropped: int = 0
    label_tokens: int = 0


def tokenize(
    records: list[Record], tokenizer, seq_len: int, completion_only: bool, packing: bool
) -> Tokenized:
    """Rows of token ids, labels and positions (see the module docstring)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise UserError("model.path: its tokenizer has no EOS token to end completions with")
    prompts = [r.prompt for r in records if r.prompt is not None]
    enc_p = iter(_encode(tokenizer, prompts))
    enc_c = _encode(tokenizer, [r.completion for r in records])
    out = Tokenized(rows=[])
    examples: list[Row] = []
    for r, comp in zip(records, enc_c, strict=True):
        prompt = next(enc_p) if r.prompt is not None else []
        ids = prompt + comp + [eos]
        labels = ([IGNORE] * len(prompt) if completion_only else list(prompt)) + comp + [eos]
        labels[0] = IGNORE
        if len(ids) > seq_len:
            out.truncated += 1
            ids, labels = ids[:seq_len], labels[:seq_len]
        if all(t == IGNORE for t in labels[1:]) or len(ids) < 2:
            out.dropped += 1
            continue
        examples.append(Row(ids, labels, list(range(len(ids)))))
        out.label_tokens += sum(t != IGNORE for t in labels)
    out.examples = len(examples)
    out.rows = pack(examples, seq_len) if packing else examples
    return out


def _encode(tokenizer, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def pack(examples: list[Row], seq_len: int) -> list[Row]:
    """Consecutive examples into rows of at most `seq_len` tokens, in order (each already fits)."""
    rows: list[Row] = []
    cur = Row([], [], [])
    for ex in examples:
        if cur.ids and len(cur.ids) + len(ex.ids) > seq_len:
            rows.append(cur)
            cur = Row([], [], [])
        cur.ids += ex.ids
        cur.labels += ex.labels
        cur.positions += ex.positions
    if cur.ids:
        rows.append(cur)
    return rows


def collate(rows: list[Row], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors: input_ids, labels (-100 on padding), position_ids (continuing), and
    n_tokens, the tokens that are not padding."""
    width = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long, device="cpu")
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long, device="cpu")
    pos = torch.empty((len(rows), width), dtype=torch.long, device="cpu")
    for i, r in enumerate(rows):
        n = len(r.ids)
        ids[i, :n] = torch.tensor(r.ids, dtype=torch.long, device="cpu")
        labels[i, :n] = torch.tensor(r.labels, dtype=torch.long, device="cpu")
        pos[i, :n] = torch.tensor(r.positions, dtype=torch.long, device="cpu")
        last = r.positions[-1]
        pos[i, n:] = torch.arange(last + 1, last + 1 + width - n, device="cpu")
    n = torch.tensor(sum(len(r.ids) for r in rows), device="cpu")
    return {"input_ids": ids, "labels": labels, "position_ids": pos, "n_tokens": n}


class MicroBatches(Dataset):
    """Item m is micro-batch m of the run, collated: rows shuffled per epoch by the generator
    seed `epoch_seed(epoch)` (picklable, such as a functools.partial: spawned workers get a copy)."""

    def __init__(
        self,
        rows: list[Row],
        batch_size: int,
        epoch_seed: Callable[[int], int],
        pad_id: int,
        total: int,
    ):
        self.rows, self.batch_size, self.pad_id = rows, batch_size, pad_id
        self.epoch_seed = epoch_seed
        self.total = total
        self.per_epoch = math.ceil(len(rows) / batch_size)
        self._perm: tuple[int, list[int]] | None = None

    def __len__(self) -> int:
        return self.total

    def order(self, epoch: int) -> list[int]:
        if self._perm is None or self._perm[0] != epoch:
            g = torch.Generator(device="cpu").manual_seed(self.epoch_seed(epoch))
            self._perm = (epoch, torch.randperm(len(self.rows), generator=g, device="cpu").tolist())
        return self._perm[1]

    def __getitem__(self, m: int) -> dict[str, torch.Tensor]:
        epoch, j = divmod(m, self.per_epoch)
        picked = self.order(epoch)[j * self.batch_size : (j + 1) * self.batch_size]
        return collate([self.rows[i] for i in picked], self.pad_id)


def loader(
    batches: MicroBatches,
    start: int,
    num_workers: int,
    pin_memory: bool,
    prefetch_factor: int | None,
) -> DataLoader:
    """Micro-batches `start`, start + 1, ... in order: each item is a whole batch (no automatic
    batching), so the workers collate, in parallel with the training step when there are any."""
    return DataLoader(
        batches,
        batch_size=None,
        sampler=range(start, len(batches)),
        num_workers=num_workers,
        pin_memory=pin_memory,
        prefetch_factor=prefetch_factor,
    )


def eval_batches(rows: list[Row], batch_size: int, pad_id: int) -> list[dict[str, torch.Tensor]]:
    """The held-out rows in order, collated once."""
    return [collate(rows[i : i + batch_size], pad_id) for i in range(0, len(rows), batch_size)]
