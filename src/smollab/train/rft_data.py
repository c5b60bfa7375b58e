"""RFT's data step: sample completions of prompts in micro-batches, score them with the rewards,
keep the good ones (threshold, top k per prompt, deduplicated), and describe what was kept.

`sample_scored` is also the held-out evaluation (other temperature, other seed), so a round's
accuracy is measured by the same code that made its data. Selection is a pure function of the
scored completions, so a resumed round that regenerates nothing keeps exactly the same records.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from smollab.data.prompt_encode import Encoded
from smollab.data.prompt_rows import PromptRows
from smollab.rewards.registry import ResolvedReward, compute_rewards
from smollab.rundir.atomic import atomic_write, atomic_write_json
from smollab.train.seeds import stream_seed


@dataclass
class Scored:
    """One completion of prompt `prompt_index` with its total (weighted) and per-key rewards."""

    prompt_index: int
    prompt: str
    completion: str
    reward: float
    rewards: dict[str, float] = field(default_factory=dict)


def sample_scored(
    sampler,
    tokenizer,
    prompts: Encoded,
    rows: PromptRows,
    rewards: list[ResolvedReward],
    *,
    n: int,
    batch_prompts: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int,
) -> tuple[list[Scored], float]:
    """`n` completions of each prompt (temperature 0: greedy), `batch_prompts` prompts (x n rows)
    per sampler call, each call seeded by (seed, first prompt); returns them scored, prompt by
    prompt, and the seconds spent sampling (decode only, not scoring). The rewards see each
    prompt as `rows` holds it, with its columns; a Scored keeps the text the model read."""
    out: list[Scored] = []
    gen_s = 0.0
    for start in range(0, len(prompts.ids), batch_prompts):
        chunk = range(start, min(start + batch_prompts, len(prompts.ids)))
        owners = [i for i in chunk for _ in range(n)]
        t0 = time.perf_counter()
        roll = sampler.generate(
            [prompts.ids[i] for i in owners],
            max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=stream_seed(seed, start),
        )
        gen_s += time.perf_counter() - t0
        texts = roll.completion_texts(tokenizer)
        values = compute_rewards(
            rewards,
            [prompts.texts[i] for i in owners],
            texts,
            roll.completion_rows(),
            offset=len(out),
            rows=rows.select(owners),
        )
        for j, (i, text) in enumerate(zip(owners, texts, strict=True)):
            per = {r.key: values[r.key][j] for r in rewards}
            total = sum(r.weight * per[r.key] for r in rewards)
            out.append(Scored(i, prompts.texts[i], text, total, per))
    return out, gen_s


def normalise(text: str) -> str:
    """What deduplication compares: the text with runs of whitespace made one space, trimmed."""
    return " ".join(text.split())


def select(
    scored: list[Scored], threshold: float | None, top_k: int | None, dedup: bool
) -> list[Scored]:
    """The completions a round trains on, prompt by prompt in prompt order: those with a total
    reward >= `threshold` (None: any), without repeats of a normalised text (`dedup`: the first
    of equal texts stays), then the `top_k` best (None: all; ties keep sampling order)."""
    by_prompt: dict[int, list[Scored]] = {}
    for s in scored:
        by_prompt.setdefault(s.prompt_index, []).append(s)
    kept: list[Scored] = []
    for i in sorted(by_prompt):
        group = [s for s in by_prompt[i] if threshold is None or s.reward >= threshold]
        if dedup:
            seen: set[str] = set()
            unique = []
            for s in group:
                if (key := normalise(s.completion)) not in seen:
                    seen.add(key)
                    unique.append(s)
            group = unique
        if top_k is not None:
            group = sorted(group, key=lambda s: -s.reward)[:top_k]
        kept += group
    return kept


def histogram(values: list[float], bins: int = 10) -> dict[str, int]:
    """Counts of reward values: each distinct value when there are few (a checker's 0 and 1),
    else `bins` equal-width bins labelled `lo..hi`."""
    distinct = sorted(set(values))
    if len(distinct) <= bins:
        counts = Counter(values)
        return {f"{v:g}": counts[v] for v in distinct}
    lo, hi = distinct[0], distinct[-1]
    width = (hi - lo) / bins
    counts = Counter(min(int((v - lo) / width), bins - 1) for v in values)
    return {f"{lo + b * width:.4g}..{lo + (b + 1) * width:.4g}": counts[b] for b in range(bins)}


def round_stats(scored: list[Scored], kept: list[Scored], n_prompts: int, gen_s: float) -> dict:
    """stats.json of a round: what was generated and kept, per prompt and overall."""
    per_prompt = Counter(s.prompt_index for s in kept)
    generated = Counter(s.prompt_index for s in scored)
    fractions = sorted(per_prompt[i] / generated[i] for i in generated)
    rewards = [s.reward for s in scored]

    def q(p: float) -> float:
        return fractions[min(int(p * len(fractions)), len(fractions) - 1)]

    return dict(
        prompts=n_prompts,
        generated=len(scored),
        kept=len(kept),
        kept_fraction=len(kept) / len(scored) if scored else 0.0,
        prompts_with_kept=sum(1 for i in generated if per_prompt[i] > 0),
        kept_fraction_per_prompt=dict(
            mean=sum(fractions) / len(fractions), min=fractions[0], median=q(0.5), max=fractions[-1]
        )
        if fractions
        else None,
        reward_mean=sum(rewards) / len(rewards) if rewards else None,
        reward_max=max(rewards) if rewards else None,
        reward_histogram=histogram(rewards),
        gen_seconds=gen_s,
        completions_per_s=len(scored) / gen_s if gen_s > 0 else None,
    )


def write_records(path: Path, kept: list[Scored], columns: dict[str, list] | None = None) -> None:
    """data.jsonl (prompt, completion, reward, each reward's value, and the columns of the
    prompt that a reward reads), written atomically."""
    columns = columns or {}
    lines = [
        json.dumps(
            dict(prompt=s.prompt, completion=s.completion, reward=s.reward, rewards=s.rewards)
            | ({"columns": {k: v[s.prompt_index] for k, v in columns.items()}} if columns else {})
        )
        + "\n"
        for s in kept
    ]
    atomic_write(path, lambda f: f.writelines(lines))


def write_stats(path: Path, stats: dict) -> None:
    atomic_write_json(
        path,
        {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in stats.items()
        },
    )


def accuracy(scored: list[Scored], key: str) -> float:
    """Fraction of completions whose `key` reward is >= 1 (the checker accepted the answer)."""
    return sum(s.rewards[key] >= 1.0 for s in scored) / len(scored) if scored else 0.0
