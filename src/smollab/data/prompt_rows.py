"""Prompts as data, TRL's contract: a `prompt` column (a string, or a list of chat messages) and
every other column, which reaches every reward as a keyword argument, one value per completion.

Sources: a .txt file (one prompt a line, no other column), a .jsonl, .csv or .parquet file, a
`save_to_disk` directory or a hub dataset (`dataset_files`). The held-out prompts come from a
second file or split, or are carved out of the training rows by a seeded fraction, as SFT carves
its records. Every refusal is one line naming the source, and the row where a row is at fault.

Columns follow TRL's `GRPOTrainer`: `prompt`, `completion` and `completion_ids` are not passed
to rewards (the trainer passes the prompt and the completion itself), and a column named like
an argument the trainer passes (`prompts`, `completions`) is refused, since it would collide.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from smollab.data.dataset_files import read_split, read_table
from smollab.errors import UserError

ROLES = ("system", "user", "assistant", "tool")  # TRL's roles of a conversational prompt
CALL_ARGS = ("prompts", "completions", "completion_ids")  # what every reward call passes
NOT_PASSED = ("prompt", "completion", "completion_ids")  # TRL keeps these from the rewards


@dataclass
class PromptRows:
    """Prompts as the data holds them (strings, or lists of `{"role", "content"}` messages) and
    the other columns, row by row; `source` names where they came from in messages."""

    prompts: list[Any]
    columns: dict[str, list[Any]]
    source: str
    field: str = "prompt"  # the prompt column's name (data.prompt_field)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def conversational(self) -> bool:
        return bool(self.prompts) and isinstance(self.prompts[0], list)

    def select(self, rows: Sequence[int]) -> PromptRows:
        """These rows, in this order (repeats allowed: a GRPO group repeats its prompt)."""
        return PromptRows(
            [self.prompts[i] for i in rows],
            {k: [v[i] for i in rows] for k, v in self.columns.items()},
            self.source,
            self.field,
        )

    def head(self, n: int) -> PromptRows:
        return self.select(range(min(n, len(self))))

    def split(self, held: set[int]) -> tuple[PromptRows, PromptRows]:
        """(the rows not in `held`, the rows in it), each in its original order."""
        keep = [i for i in range(len(self)) if i not in held]
        return self.select(keep), self.select(sorted(held))

    def describe(self) -> str:
        """`source (N rows; columns a, b)` for logs and refusals."""
        cols = ", ".join(self.columns) or "none but the prompt"
        return f"{self.source} ({len(self)} rows; columns {cols})"


def text_rows(path: str | Path, key: str) -> PromptRows:
    """One prompt per non-empty line of a UTF-8 text file, stripped; no other column."""
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
    return PromptRows(texts, {}, f"{key} {p}")


def file_rows(path: str | Path, key: str, field: str = "prompt") -> PromptRows:
    """A prompts file by its extension: .txt one prompt a line, else a table (`read_table`)."""
    if Path(path).suffix.lower() == ".txt":
        return text_rows(path, key)
    return table_rows(read_table(path, key), f"{key} {path}", field)


def check_prompt_files(section, name: str, field: str = "prompt") -> None:
    """A `grpo` or `rft` section's prompts files read before the model and data are looked at,
    so a bad file given on the command line is what the one line names."""
    for key in ("prompts_file", "eval_prompts_file"):
        if path := getattr(section, key):
            file_rows(path, f"{name}.{key}", field)


def table_rows(table: Any, source: str, field: str = "prompt") -> PromptRows:
    """A `datasets.Dataset`'s rows as prompts and columns, checked (module docstring)."""
    names = list(table.column_names)
    if len(table) == 0:
        raise UserError(f"{source}: the dataset is empty (no rows)")
    if field not in names:
        raise UserError(
            f"{source}: no {field!r} column (its columns: {', '.join(names) or 'none'}; "
            "data.prompt_field names the prompt column)"
        )
    if clash := [c for c in names if c in CALL_ARGS and c != field]:
        raise UserError(
            f"{source}: column {clash[0]!r} has the name of an argument the trainer passes every "
            f"reward ({', '.join(CALL_ARGS)}): rename it"
        )
    data = table.to_dict()
    prompts = [_prompt(p, i, source, field) for i, p in enumerate(data[field])]
    chat = isinstance(prompts[0], list)
    if (
        odd := next((i for i, p in enumerate(prompts) if isinstance(p, list) != chat), None)
    ) is not None:
        form = "text" if chat else "chat messages"
        raise UserError(
            f"{source} row {odd}: {field} is {form}, and row 0's is not (every row in one form)"
        )
    columns = {c: data[c] for c in names if c != field and c not in NOT_PASSED}
    return PromptRows(prompts, columns, source, field)


def _prompt(value: Any, row: int, source: str, field: str) -> Any:
    """A text prompt, or a list of messages with known roles and text contents."""
    where = f"{source} row {row}: {field}"
    if isinstance(value, str):
        if not value.strip():
            raise UserError(f"{where} is empty")
        return value
    if not isinstance(value, list) or not value:
        got = "an empty list" if value == [] else type(value).__name__
        raise UserError(f"{where} must be text or a list of chat messages, got {got}")
    out = []
    for j, m in enumerate(value):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise UserError(f"{where} message {j} is not a {{'role', 'content'}} mapping")
        if m["role"] not in ROLES:
            raise UserError(
                f"{where} message {j} has role {m['role']!r}; known roles: {', '.join(ROLES)}"
            )
        if not isinstance(m["content"], str):
            raise UserError(f"{where} message {j}: content must be text")
        out.append({k: v for k, v in m.items() if v is not None})
    return out


class PromptData(Protocol):
    """The data keys of a command that reads prompts from data (`config.sections.PromptSource`)."""

    hf_dataset: str | None
    hf_name: str | None
    split: str
    eval_split: str | None
    eval_fraction: float | None
    prompt_field: str
    seed: int


def load_rows(file: str | None, file_key: str, d: PromptData) -> PromptRows | None:
    """The training prompts: the file under `file_key`, or the split of `data.hf_dataset`; None
    when neither is set (the command's own prompts, e.g. GRPO's story openings)."""
    if file:
        return file_rows(file, file_key, d.prompt_field)
    if d.hf_dataset:
        table = read_split(d.hf_dataset, d.hf_name, d.split, "data.hf_dataset")
        return table_rows(table, f"data.hf_dataset {d.hf_dataset} split {d.split}", d.prompt_field)
    return None


def held_out(
    train: PromptRows, eval_file: str | None, eval_key: str, d: PromptData
) -> tuple[PromptRows, PromptRows | None, str]:
    """(training rows, held-out rows or None, how they were chosen): the file under `eval_key`,
    `data.eval_split`, or `data.eval_fraction` of the training rows by `data.seed` (those rows
    leave the training set); None when none is set."""
    if eval_file:
        return train, file_rows(eval_file, eval_key, d.prompt_field), f"{eval_key} {eval_file}"
    if d.eval_split:
        table = read_split(d.hf_dataset, d.hf_name, d.eval_split, "data.hf_dataset")
        where = f"data.hf_dataset {d.hf_dataset} split {d.eval_split}"
        return train, table_rows(table, where, d.prompt_field), f"split {d.eval_split}"
    if d.eval_fraction is None:
        return train, None, ""
    if len(train) < 2:
        raise UserError(f"{train.source}: 1 row, too few to hold any out (data.eval_fraction)")
    held = held_out_rows(len(train), d.eval_fraction, d.seed)
    kept, out = train.split(held)
    note = (
        f"{len(held)} rows carved out (data.eval_fraction={d.eval_fraction:g}, data.seed={d.seed})"
    )
    return kept, out, note


def held_out_rows(n: int, fraction: float, seed: int) -> set[int]:
    """A seeded choice of ceil(fraction x n) of `n` rows (at least one, and at least one left):
    the same seed always holds out the same ones."""
    k = min(max(1, math.ceil(fraction * n)), n - 1)
    return set(random.Random(seed).sample(range(n), k))
