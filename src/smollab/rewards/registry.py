"""Reward functions by name: built-ins, a user's own `module:function`, spec validation, and the
checked evaluation used inline and inside pool workers.

A reward function follows TRL's convention, so functions written for TRL work unchanged:

    fn(completions: list[str], prompts: list[str] | None = None, **kwargs) -> list[float]

It is called with keywords only: `prompts=`, `completions=`, `completion_ids=` (the generated
token ids, one list of ints per completion), its own params from the spec and, for prompts from
data, every other column of the data, one value per completion (a prompt's value repeated across
its group), exactly as TRL's `GRPOTrainer` passes them. Prompts from data reach the rewards as the
data holds them; a conversational prompt (chat messages) makes each completion
`[{"role": "assistant", "content": text}]`, as in TRL. A function that does not name `prompts`,
`completion_ids` or a column must take `**kwargs`. Its params, however, must be named in its
signature (keyword or keyword-only): they are checked against the signature before any work, so
a misspelt param is an error rather than silently ignored; and `check_columns` tells, before the
run, a parameter no column or param gives a value from a column no parameter takes.

This module imports no torch: pool workers import it and nothing heavier.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import math
import signal
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from smollab.config import RewardSpec
from smollab.config.sections import reward_keys
from smollab.data.prompt_rows import PromptRows
from smollab.errors import UserError
from smollab.rewards.chess_fen import fen_distance, fen_exact, fen_valid
from smollab.rewards.chess_moves import chess_legal_move
from smollab.rewards.hack import contains_words, happy_density
from smollab.rewards.happy import happy_binary, happy_count
from smollab.rewards.length import sentence_length
from smollab.rewards.sentiment import sentiment
from smollab.rewards.word_problems import word_problem_correct
from smollab.rewards.wordle import (
    wordle_feedback_use,
    wordle_format,
    wordle_info_gain,
    wordle_solved,
)

RewardFn = Callable[..., Sequence[float]]

BUILTINS: dict[str, RewardFn] = {
    "happy_binary": happy_binary,
    "happy_count": happy_count,
    "happy_density": happy_density,
    "contains_words": contains_words,
    "sentiment": sentiment,
    "sentence_length": sentence_length,
    "wordle_format": wordle_format,
    "wordle_feedback_use": wordle_feedback_use,
    "wordle_info_gain": wordle_info_gain,
    "wordle_solved": wordle_solved,
    "fen_valid": fen_valid,
    "fen_exact": fen_exact,
    "fen_distance": fen_distance,
    "chess_legal_move": chess_legal_move,
    "word_problem_correct": word_problem_correct,
}

# validate_specs calls each built-in once on this (or its own `probe`) so bad params fail early.
_PROBE = {
    "completions": ["The sun came out. Tom smiled"],
    "prompts": ["Once upon a time"],
    "completion_ids": [[1, 2, 3, 4, 5, 6, 7]],
}

# Passed by the trainer on every call, never set in a spec's params.
CALL_KWARGS = ("prompts", "completions", "completion_ids")


class RewardError(UserError):
    """A reward function failed at run time: raised, or returned a bad value or length."""


@dataclass
class ResolvedReward:
    """A validated spec with its function; `key` names it in metrics (unique within a list)."""

    key: str
    name: str
    fn: RewardFn
    weight: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def get_reward(name: str) -> RewardFn:
    """The function a spec names: a built-in (see BUILTINS) or `module:function` (importable).

    `function` may be a dotted attribute path (`module:Class.method`). Failures are a UserError
    naming the spec.
    """
    if not isinstance(name, str) or not name:
        raise UserError(f"reward name must be a non-empty string, got {name!r}")
    if ":" not in name:
        if name in BUILTINS:
            return BUILTINS[name]
        close = difflib.get_close_matches(name, BUILTINS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UserError(
            f"unknown reward {name!r}; {hint}built-ins: {', '.join(sorted(BUILTINS))}, "
            "or give your own as module:function"
        )
    module_name, _, attr_path = name.partition(":")
    if not module_name or not attr_path:
        raise UserError(f"reward {name!r}: expected module:function")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # any import failure is the user's to fix
        raise UserError(
            f"reward {name!r}: cannot import module {module_name!r} "
            f"({type(e).__name__}: {_one_line(e)})"
        ) from e
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise UserError(
                f"reward {name!r}: {module_name!r} has no attribute {attr_path!r}"
            ) from e
    if not callable(obj):
        raise UserError(f"reward {name!r}: {attr_path!r} is not callable")
    return obj


def _check_signature(spec: RewardSpec, fn: RewardFn) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # some C callables have no signature: nothing to check against
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = {p.name: p for p in sig.parameters.values() if p.kind in kinds}
    var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    missing_call = [k for k in CALL_KWARGS if k not in named and not var_kw]
    if missing_call:
        raise UserError(
            f"reward {spec.name}: must accept keyword argument(s) {', '.join(missing_call)} "
            "(add **kwargs to its signature)"
        )
    own = {k for k in named if k not in CALL_KWARGS}
    for key in spec.params:
        if key in CALL_KWARGS:
            raise UserError(f"reward {spec.name}: param {key!r} is passed by the trainer, not set")
        if key not in own:
            takes = ", ".join(sorted(own)) or "none"
            raise UserError(f"reward {spec.name}: unknown param {key!r} (it takes: {takes})")


def _parameters(fn: RewardFn) -> tuple[dict[str, inspect.Parameter], bool] | None:
    """(its keyword parameters but the call's own, whether it takes **kwargs); None when it has
    no signature to read."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = {
        p.name: p for p in sig.parameters.values() if p.kind in kinds and p.name not in CALL_KWARGS
    }
    return named, any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())


def check_columns(
    rewards: Sequence[ResolvedReward], columns: Sequence[str] = (), source: str = ""
) -> set[str]:
    """Every reward can be called with the data's `columns` (from `source`, which names where
    they come from; empty: prompts without columns): each of its parameters without a default
    has a value (a column or a param), no param shadows a column, and each column has a
    parameter (or **kwargs) to land in, as TRL passes them all. Returns the columns some reward
    names (what samples.jsonl keeps). One UserError, one line, on the first problem."""
    used: set[str] = set()
    listed = ", ".join(columns)
    for r in rewards:
        found = _parameters(r.fn)
        if found is None:
            continue
        named, var_kw = found
        for k, p in named.items():
            if k in r.params and k in columns:
                raise UserError(
                    f"reward {r.key}: param {k!r} is also a column of {source}: rename one "
                    "(every column reaches every reward)"
                )
            if k in columns:
                used.add(k)
            elif p.default is inspect.Parameter.empty and k not in r.params:
                where = (
                    f"{source} has no column {k!r} (its columns: {listed or 'none'})"
                    if source
                    else f"these prompts have no columns (prompts from data: a {k!r} column)"
                )
                raise UserError(
                    f"reward {r.key}: missing required param {k!r}: {where}, and its params "
                    "do not set it"
                )
        if not var_kw and (free := [c for c in columns if c not in named]):
            raise UserError(
                f"reward {r.key} has no parameter for column {free[0]!r} of {source} and no "
                "**kwargs: every column reaches every reward, as in TRL (add **kwargs to its "
                "signature)"
            )
    return used


def validate_specs(
    specs: Sequence[RewardSpec | dict[str, Any]],
    columns: Sequence[str] | None = (),
    source: str = "",
) -> list[ResolvedReward]:
    """Resolve every spec and check its params, before any work; UserError on the first problem.

    Params are checked against the function's signature (unknown or reserved params), then
    against the data's `columns` from `source` (`check_columns`; None: not yet, the data is not
    read). Built-ins are also called once on a tiny input so bad values (`unit: lines`) fail
    here. Keys are the spec names, made unique with `#2`, `#3` when a name repeats.
    """
    if not specs:
        raise UserError("reward: give at least one reward function")
    resolved: list[tuple[RewardSpec, RewardFn]] = []
    for raw in specs:
        if isinstance(raw, RewardSpec):
            spec = raw
        elif isinstance(raw, dict):
            try:
                spec = RewardSpec.model_validate(raw)
            except Exception as e:  # pydantic's message, made one line
                raise UserError(f"reward spec {raw!r}: {_one_line(e)}") from e
        else:
            raise UserError(f"reward spec must be a mapping with name/weight/params, got {raw!r}")
        fn = get_reward(spec.name)
        _check_signature(spec, fn)
        if spec.name in BUILTINS:  # a built-in whose prompts have a form carries its own probe
            fn(**getattr(fn, "probe", _PROBE), **spec.params)
        resolved.append((spec, fn))
    keys = reward_keys(spec.name for spec, _ in resolved)
    out = [
        ResolvedReward(key, spec.name, fn, spec.weight, dict(spec.params))
        for key, (spec, fn) in zip(keys, resolved, strict=True)
    ]
    if columns is not None:
        check_columns(out, columns, source)
    return out


class _TimedOut(BaseException):
    """Raised into a reward function by SIGALRM: not an Exception, so the function's own
    `except Exception` cannot swallow it."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise _TimedOut in the body after `seconds` (SIGALRM). A limit needs the main thread (only
    it receives signals) and a free interval timer; without them, or with `seconds` 0, none."""
    if (
        seconds <= 0
        or not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
        or signal.getitimer(signal.ITIMER_REAL)[0] > 0
    ):
        yield
        return

    def alarm(signum: int, frame: Any) -> None:
        raise _TimedOut

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def compute_rewards(
    rewards: Sequence[ResolvedReward],
    prompts: list[str] | None,
    completions: list[str],
    completion_ids: list[list[int]] | None = None,
    offset: int = 0,
    timeout_s: float = 0.0,
    rows: PromptRows | None = None,
) -> dict[str, list[float]]:
    """Each function's raw (unweighted) values, checked: RewardError names the function and the
    exception, wrong length, non-finite value, or a call longer than `timeout_s` (0: no limit;
    see `time_limit`). `offset` makes indices global for a chunk. rows: the completions' prompts
    as the data holds them (passed as `prompts` instead of the decoded texts) and their columns
    (module docstring)."""
    n = len(completions)
    data: dict[str, Any] = {"prompts": prompts, "completions": completions}
    if rows is not None:
        if len(rows) != n:
            raise ValueError(f"compute_rewards: {len(rows)} rows for {n} completions")
        data = {"prompts": rows.prompts, "completions": completions, **rows.columns}
        if rows.conversational:  # TRL's form: the assistant's message
            data["completions"] = [[{"role": "assistant", "content": c}] for c in completions]
    out: dict[str, list[float]] = {}
    for r in rewards:
        try:
            with time_limit(timeout_s):
                values = r.fn(completion_ids=completion_ids, **data, **r.params)
        except _TimedOut:
            raise RewardError(
                f"reward {r.key} took longer than {timeout_s:g} s (grpo.reward_timeout_s)"
            ) from None
        except UserError as e:
            msg = _one_line(e)
            raise RewardError(msg if msg.startswith(r.name) else f"reward {r.key}: {msg}") from e
        except Exception as e:  # a user's function may raise anything
            raise RewardError(_raised(r, e, rows)) from e
        if isinstance(values, str | bytes | dict) or not hasattr(values, "__len__"):
            raise RewardError(
                f"reward {r.key} returned {type(values).__name__}, expected a list of {n} numbers"
            )
        if len(values) != n:
            raise RewardError(f"reward {r.key} returned {len(values)} values for {n} completions")
        floats = []
        for i, v in enumerate(values):
            try:
                x = float(v)
            except (TypeError, ValueError):
                x = None
            if x is None or isinstance(v, str) or not math.isfinite(x):
                raise RewardError(
                    f"reward {r.key} returned {_one_line(repr(v), 60)} for completion "
                    f"{offset + i} ({_one_line(repr(completions[i]), 60)})"
                )
            floats.append(x)
        out[r.key] = floats
    return out


def _raised(r: ResolvedReward, e: Exception, rows: PromptRows | None) -> str:
    """A reward's exception in one line; a KeyError for a column the data lacks (a TRL reward
    reading `kwargs["solution"]`) says so."""
    line = f"reward {r.key} raised {type(e).__name__}: {_one_line(e)}"
    key = e.args[0] if isinstance(e, KeyError) and e.args else None
    if rows is not None and isinstance(key, str) and key not in rows.columns:
        cols = ", ".join(rows.columns) or "none"
        return f"{line}: {rows.source} has no column {key!r} (its columns: {cols})"
    return line


# Pool workers: the rewards are resolved once per worker process, at start.
_WORKER_REWARDS: list[ResolvedReward] = []


def _worker_init(specs: list[dict[str, Any]]) -> None:
    global _WORKER_REWARDS
    _WORKER_REWARDS = validate_specs(specs, columns=None)  # the parent checked the columns


def _worker_ping() -> int:
    return len(_WORKER_REWARDS)


def _worker_run(
    prompts: list[str] | None,
    completions: list[str],
    completion_ids: list[list[int]] | None,
    offset: int,
    timeout_s: float = 0.0,
    rows: PromptRows | None = None,
) -> dict[str, list[float]]:
    return compute_rewards(
        _WORKER_REWARDS, prompts, completions, completion_ids, offset, timeout_s, rows
    )
