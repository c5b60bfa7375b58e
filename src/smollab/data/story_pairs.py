"""Prompt/completion pairs from the offline story corpus, for `smollab sft` recipes: a story's
first sentences as the prompt, the sentences after them as the completion.

    python -m smollab.data.story_pairs data/sft/story-pairs.jsonl --n 5000

The stories come from the offline generator under a seed of their own (default 1; the
pretraining corpus is data.seed 0), so the pairs are new stories in the corpus's style.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from smollab.data.stories import generate_stories
from smollab.rundir.atomic import atomic_write_text

_SENTENCE_END = re.compile(r'(?<=[.!?])"?\s+')


def sentences(story: str) -> list[str]:
    """A story cut after each sentence's end mark (a closing quote stays with its sentence)."""
    out, start = [], 0
    for m in _SENTENCE_END.finditer(story):
        out.append(story[start : m.end()].strip())
        start = m.end()
    if story[start:].strip():
        out.append(story[start:].strip())
    return out


def story_pairs(
    n: int, seed: int = 1, prompt_sentences: int = 2, completion_sentences: int = 2
) -> list[dict[str, str]]:
    """`n` records {"prompt", "completion"}; the completion starts with a space, as the text
    after the prompt does. Stories too short for both parts are skipped (and more drawn)."""
    out: list[dict[str, str]] = []
    batch = 0
    while len(out) < n:
        for story in generate_stories(max(n, 64), seed=seed * 1_000_003 + batch):
            s = sentences(story)
            if len(s) < prompt_sentences + completion_sentences:
                continue
            out.append(
                {
                    "prompt": " ".join(s[:prompt_sentences]),
                    "completion": " "
                    + " ".join(s[prompt_sentences : prompt_sentences + completion_sentences]),
                }
            )
            if len(out) == n:
                break
        batch += 1
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m smollab.data.story_pairs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("out", help="the .jsonl file to write (its folder is made)")
    ap.add_argument("--n", type=int, default=5000, help="records to write")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prompt-sentences", type=int, default=2)
    ap.add_argument("--completion-sentences", type=int, default=2)
    a = ap.parse_args(argv)
    if min(a.n, a.prompt_sentences, a.completion_sentences) < 1:
        ap.error("--n, --prompt-sentences and --completion-sentences must be >= 1")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = story_pairs(a.n, a.seed, a.prompt_sentences, a.completion_sentences)
    atomic_write_text(out, "".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} records to {out}")


if __name__ == "__main__":
    main()
