"""The word-problem checker (the offline word-problem task), a reward so grpo and rft share it.

`word_problem_correct` is 1.0 when the completion's final answer equals the prompt's answer,
else 0.0. The answer is the data's `answer` column (prompts.jsonl, heldout.jsonl of
smollab.data.word_problems, or any dataset with one); text prompts without it fall back to
recomputing it from the prompt (smollab.data.word_problems.parse: the template's numbers). The
completion's final answer (`final_answer`) is read from its first non-empty line:

- with an "=" in it (the worked form " 3 + 4 = 7"), the integer right after the first "=";
- without one (the bare form " 7"), the first integer in the line.

An integer may carry a minus sign ("-2" is not 2). No integer where one is due: no answer, 0.0.
Without the column, a prompt that matches no template stops the run with one line naming it.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from smollab.data.word_problems import answer_of
from smollab.errors import UserError
from smollab.rewards.conversation import plain_text

_INT = re.compile(r"-?\d+")
_AFTER_EQ = re.compile(r"\s*(-?\d+)")


def final_answer(completion: str) -> int | None:
    """The completion's final answer (see the module docstring), or None when it gives none."""
    line = next((x for x in completion.splitlines() if x.strip()), "")
    if "=" in line:
        m = _AFTER_EQ.match(line.partition("=")[2])
        return int(m[1]) if m else None
    m = _INT.search(line)
    return int(m[0]) if m else None


@functools.lru_cache(maxsize=65536)
def _truth(prompt: str) -> int:
    return answer_of(prompt)


@plain_text
def word_problem_correct(
    completions: list[str],
    prompts: list[str] | None = None,
    answer: list[Any] | None = None,
    **kwargs: Any,
) -> list[float]:
    """1.0 when the completion's final answer equals the prompt's answer (the `answer` column,
    else recomputed from the prompt), else 0.0."""
    if answer is not None:
        return [
            1.0 if final_answer(c) == _integer(a) else 0.0
            for c, a in zip(completions, answer, strict=True)
        ]
    if prompts is None or len(prompts) != len(completions):
        raise UserError(
            f"word_problem_correct: needs one prompt per completion (got "
            f"{'none' if prompts is None else len(prompts)} for {len(completions)})"
        )
    return [
        1.0 if final_answer(c) == _truth(p) else 0.0
        for c, p in zip(completions, prompts, strict=True)
    ]


def _integer(value: Any) -> int:
    """An `answer` cell as an integer: a number, or text holding one (" 7", "-2")."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise UserError(f"word_problem_correct: answer {value!r} is not an integer")
    try:
        x = float(value)
    except ValueError:
        raise UserError(f"word_problem_correct: answer {value!r} is not an integer") from None
    if not x.is_integer():
        raise UserError(f"word_problem_correct: answer {value!r} is not an integer")
    return int(x)


# validate_specs' dry call: a word problem, since a story prompt is refused.
word_problem_correct.probe = {  # type: ignore[attr-defined]
    "prompts": ["lily has 3 apples. she finds 4 more. how many apples does lily have now? answer:"],
    "completions": [" 3 + 4 = 7"],
    "completion_ids": [[1, 2, 3]],
}
