"""Whole Wordle games played by a smollab model (`smollab sample RUN --wordle-games N`).

`play_games` (data layer) knows the game and wants a callable from prompts to completion texts;
a model with a chat template gets each position as chat messages (`build_chat`, as the chat
recipe trains it), any other as one line of text (`build_prompt`). This module turns a run directory or checkpoint into that callable, through the same
loading and sampler as `smollab sample`, and writes the result beside the model as JSON. Every
unfinished game advances together, one batched sampler call a turn (split into chunks of
`batch_size` prompts, so a thousand games do not become one batch of a thousand rows).

Secrets come from `sample_secrets(games, seed)` over the shipped list, the same draw the
solver's transcripts use: the list is small (data/wordle_words.py), so a model pretrained on
thousands of transcripts has seen games of every secret; the figure measures play, not recall
of unseen words.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch

from smollab.data.prompt_encode import encode_rows
from smollab.data.prompt_rows import PromptRows
from smollab.data.wordle import build_chat, build_prompt
from smollab.data.wordle_games import GenerateFn, play_games, sample_secrets
from smollab.engine.sample_texts import load_sampler
from smollab.engine.sampler import Sampler
from smollab.errors import UserError
from smollab.rundir.atomic import atomic_write_json
from smollab.rundir.runs import WORDLE_GAMES


def sampler_generate_fn(
    sampler: Sampler,
    tokenizer,
    *,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    batch_size: int = 256,
) -> GenerateFn:
    """`play_games`' generate_fn over `sampler`: prompts (text, or chat messages through the
    chat template) -> completion texts, greedy at temperature 0. One generator seeded once, so each turn draws fresh numbers and the whole
    evaluation is reproducible from `seed`."""
    gen = torch.Generator(device=sampler.device).manual_seed(int(seed))

    def generate(prompts: list[Any]) -> list[str]:
        out: list[str] = []
        for i in range(0, len(prompts), batch_size):
            rows = PromptRows(prompts[i : i + batch_size], {}, "wordle games")
            ids = encode_rows(rows, tokenizer, "wordle games").ids
            r = sampler.generate(
                ids,
                max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                generator=gen,
            )
            out.extend(r.completion_texts(tokenizer))
        return out

    return generate


def report_path(path: str, out: str | Path | None) -> Path:
    """Where the report goes: `out`, else `wordle_games.json` in the run or model directory
    `path` (a run directory, not the checkpoint it resolves to: the report says which)."""
    if out is not None:
        return Path(out)
    if not Path(path).is_dir():
        raise UserError(
            f"--wordle-out: {path} is no local directory to write "
            f"{WORDLE_GAMES} beside; name the file"
        )
    return Path(path) / WORDLE_GAMES


def play_wordle(
    path: str,
    games: int,
    *,
    max_turns: int = 6,
    seed: int = 0,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_new_tokens: int = 64,
    batch_size: int = 256,
    device: str = "auto",
    mode: str | None = None,
    out: str | Path | None = None,
) -> dict[str, Any]:
    """Play `games` games with the model at `path`; write and return the report: play_games'
    counts and rates (mean_guesses null when no game is solved), the checkpoint loaded, the
    sampling settings and the wall time."""
    dest = report_path(path, out)  # before the model loads: a bad destination fails first
    sampler, tokenizer, where = load_sampler(path, device, mode)
    fn = sampler_generate_fn(
        sampler,
        tokenizer,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=seed,
        batch_size=batch_size,
    )
    chat = bool(getattr(tokenizer, "chat_template", None))  # as the recipes train each kind
    t0 = time.perf_counter()
    result = play_games(
        fn, sample_secrets(games, seed), max_turns, build_chat if chat else build_prompt
    )
    wall = time.perf_counter() - t0
    if math.isnan(result["mean_guesses"]):
        result["mean_guesses"] = None  # JSON has no NaN
    report = {
        **result,
        "max_turns": max_turns,
        "prompts": "chat" if chat else "text",
        "model": str(where),
        "mode": mode,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "device": sampler.device.type,
        "wall_s": round(wall, 3),
    }
    atomic_write_json(dest, report)
    return {**report, "path": str(dest)}
