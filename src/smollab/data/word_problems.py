"""Arithmetic word problems in the story corpus's style (an offline task with an exact checker): a prompt that
ends in "answer:", an exact answer any checker recomputes from the prompt alone.

Three templates, lower-case like the generated stories (so the WordPiece tokenizer, which folds
case, reads them as the byte-level BPE does):

- add:    "lily has 3 apples. she finds 4 more. how many apples does lily have now? answer:"
- take:   "lily has 9 apples. she gives 2 to tom. how many apples does lily have now? answer:"
- groups: "lily has 3 bags with 4 apples in each bag. how many apples does lily have in all?
  answer:"

The answer is " 7"; the worked form " 3 + 4 = 7" (" 9 - 2 = 7", " 3 * 4 = 12") is what the
pretraining corpus shows, so a small model can copy the numbers before it computes.

The held-out split is a deterministic hash of (template, name, a, b): `is_heldout` puts about
`HELDOUT_PERCENT` of those combinations aside, and no training file (prompts.txt, corpus.txt,
sft.jsonl) ever holds one, whatever the seed; heldout.txt holds only them. The object, pronoun
wording and friend are not in the key, so a held-out problem never appears in training with
another object either.

    python -m smollab.data.word_problems --out data/word-problems

writes prompts.txt (training prompts, one a line, for grpo.prompts_file and rft), heldout.txt
(held-out prompts, for grpo.eval_prompts_file and benchmarks/word_problem_accuracy.py), the same
as data with the answer as a column (prompts.jsonl and heldout.jsonl: {"prompt", "answer"}, which
`word_problem_correct` reads instead of parsing the prompt),
corpus.txt (generated stories and worked problems shuffled, one document a line, for
`smollab pretrain` with data.source=files) and sft.jsonl ({"prompt", "completion"} records).
The default mix (60,000 worked problems, 2,000 stories) is about three quarters problems by
tokens: with 10,000 stories (two thirds of the tokens) the 1.25M base had learnt the worked
form but not to copy the numbers after 400 steps (9% greedy on held-out prompts).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from smollab.data.story_words import BOY_NAMES, FOODS, GIRL_NAMES
from smollab.errors import UserError
from smollab.rundir.atomic import atomic_write_text

TEMPLATES = ("add", "take", "groups")
OPS = {"add": "+", "take": "-", "groups": "*"}
HELDOUT_PERCENT = 10
THINGS = FOODS + (
    "shells",
    "pebbles",
    "buttons",
    "marbles",
    "stickers",
    "crayons",
    "balloons",
    "feathers",
    "acorns",
    "coins",
    "stones",
    "kites",
    "books",
    "beads",
    "leaves",
    "flowers",
    "ribbons",
)
CONTAINERS = {
    "bags": "bag",
    "boxes": "box",
    "baskets": "basket",
    "jars": "jar",
    "bowls": "bowl",
    "buckets": "bucket",
    "sacks": "sack",
    "tins": "tin",
}
NAMES = GIRL_NAMES + BOY_NAMES
FIND = ("finds", "gets", "picks up", "is given", "buys")
LOSE = ("gives", "sells", "lends", "sends")
NAME = r"(?P<name>[a-z]+)"
NUM = r"(?P<{}>\d+)"
# One pattern per template, on the normalized prompt (see `normalize`); the numbers are a and b.
PATTERNS = {
    "add": re.compile(
        rf"^{NAME} has {NUM.format('a')} (?P<things>[a-z ]+)\. (?:she|he) "
        rf"(?:{'|'.join(FIND)}) {NUM.format('b')} more\. how many (?P=things) "
        r"does (?P=name) have now\? answer:$"
    ),
    "take": re.compile(
        rf"^{NAME} has {NUM.format('a')} (?P<things>[a-z ]+)\. (?:she|he) "
        rf"(?:{'|'.join(LOSE)}) {NUM.format('b')} to [a-z]+\. how many "
        r"(?P=things) does (?P=name) have now\? answer:$"
    ),
    "groups": re.compile(
        rf"^{NAME} has {NUM.format('a')} (?P<box>[a-z]+) with "
        rf"{NUM.format('b')} (?P<things>[a-z ]+) in each [a-z]+\. how many "
        r"(?P=things) does (?P=name) have in all\? answer:$"
    ),
}


@dataclass(frozen=True)
class Problem:
    """One problem: `prompt` ends in "answer:"; `worked` and `answer` are its completions."""

    template: str
    name: str
    a: int
    b: int
    prompt: str

    @property
    def value(self) -> int:
        return solve(self.template, self.a, self.b)

    @property
    def answer(self) -> str:
        return f" {self.value}"

    @property
    def worked(self) -> str:
        return f" {self.a} {OPS[self.template]} {self.b} = {self.value}"


def solve(template: str, a: int, b: int) -> int:
    return a + b if template == "add" else a - b if template == "take" else a * b


def normalize(prompt: str) -> str:
    """Lower case, single spaces, no space before . ? : (a WordPiece decode puts them there)."""
    text = " ".join(prompt.lower().split())
    return re.sub(r" ([.?:])", r"\1", text)


def parse(prompt: str) -> Problem | None:
    """The problem a prompt states, or None when it matches no template."""
    text = normalize(prompt)
    for template, pattern in PATTERNS.items():
        m = pattern.match(text)
        if m:
            return Problem(template, m["name"], int(m["a"]), int(m["b"]), text)
    return None


def answer_of(prompt: str) -> int:
    """The exact answer recomputed from the prompt; UserError naming it when it parses as none."""
    p = parse(prompt)
    if p is None:
        raise UserError(
            f"word problems: prompt {prompt[:80]!r} matches no template "
            "(see smollab.data.word_problems)"
        )
    return p.value


def is_heldout(template: str, name: str, a: int, b: int, percent: int = HELDOUT_PERCENT) -> bool:
    """Whether (template, name, a, b) belongs to the held-out split: a stable hash, not `hash()`
    (salted per process), so every run and machine agrees."""
    key = f"{template}|{name}|{a}|{b}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % 100 < percent


def _numbers(
    rng: random.Random, template: str, max_number: int, max_factor: int
) -> tuple[int, int]:
    if template == "add":
        return rng.randint(1, max_number), rng.randint(1, max_number)
    if template == "take":
        a = rng.randint(2, max_number)
        return a, rng.randint(1, a - 1)
    return rng.randint(2, max_factor), rng.randint(2, max_factor)


def make(rng: random.Random, max_number: int = 20, max_factor: int = 9) -> Problem:
    """One random problem (any split)."""
    template = rng.choice(TEMPLATES)
    girl = rng.random() < 0.5
    name = rng.choice(GIRL_NAMES if girl else BOY_NAMES)
    pron = "she" if girl else "he"
    a, b = _numbers(rng, template, max_number, max_factor)
    things = rng.choice(THINGS)
    if template == "add":
        text = (
            f"{name} has {a} {things}. {pron} {rng.choice(FIND)} {b} more. "
            f"how many {things} does {name} have now? answer:"
        )
    elif template == "take":
        friend = name
        while friend == name:
            friend = rng.choice(NAMES)
        text = (
            f"{name} has {a} {things}. {pron} {rng.choice(LOSE)} {b} to {friend}. "
            f"how many {things} does {name} have now? answer:"
        )
    else:
        box = rng.choice(tuple(CONTAINERS))
        text = (
            f"{name} has {a} {box} with {b} {things} in each {CONTAINERS[box]}. "
            f"how many {things} does {name} have in all? answer:"
        )
    return Problem(template, name, a, b, text)


def stream(
    seed: int, heldout: bool, max_number: int = 20, max_factor: int = 9, unique: bool = False
) -> Iterator[Problem]:
    """Endless problems of one split from `random.Random(seed)`; `unique`: distinct prompts."""
    if max_number < 2 or max_factor < 2:
        raise UserError(
            f"--max-number and --max-factor must be >= 2, got {max_number}, {max_factor}"
        )
    rng = random.Random(seed)
    seen: set[str] = set()
    while True:
        p = make(rng, max_number, max_factor)
        if is_heldout(p.template, p.name, p.a, p.b) != heldout:
            continue
        if unique:
            if p.prompt in seen:
                continue
            seen.add(p.prompt)
        yield p


def take(problems: Iterator[Problem], n: int) -> list[Problem]:
    return [next(problems) for _ in range(n)]


def write_all(
    out: str | Path,
    *,
    prompts: int = 1024,
    heldout: int = 512,
    corpus: int = 60_000,
    stories: int = 2000,
    sft: int = 4000,
    seed: int = 0,
    max_number: int = 20,
    max_factor: int = 9,
    sft_form: str = "worked",
) -> dict[str, Path]:
    """The task's files under `out` (see the module docstring); a file whose count is 0 is not
    written. Each file draws from its own seed (seed, seed + 1, ...), so changing one count
    changes no other file."""
    counts = {
        "prompts": prompts,
        "heldout": heldout,
        "corpus": corpus,
        "stories": stories,
        "sft": sft,
    }
    bad = [f"--{k} {v}" for k, v in counts.items() if v < 0]
    if bad or not any(counts.values()):
        raise UserError(f"counts must be >= 0 and one of them > 0, got {', '.join(bad) or 0}")
    if sft_form not in ("worked", "answer"):
        raise UserError(f"--sft-form {sft_form!r}: expected worked or answer")
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}

    def train(offset: int, unique: bool = False) -> Iterator[Problem]:
        return stream(seed + offset, False, max_number, max_factor, unique)

    if prompts:
        rows = take(train(0, unique=True), prompts)
        paths["prompts"] = _write(d / "prompts.txt", [p.prompt for p in rows])
        paths["prompts_table"] = _write(d / "prompts.jsonl", [_row(p) for p in rows])
    if heldout:
        rows = take(stream(seed + 1, True, max_number, max_factor, unique=True), heldout)
        paths["heldout"] = _write(d / "heldout.txt", [p.prompt for p in rows])
        paths["heldout_table"] = _write(d / "heldout.jsonl", [_row(p) for p in rows])
    if corpus or stories:
        from smollab.data.stories import generate_stories

        docs = [p.prompt + p.worked for p in take(train(2), corpus)]
        docs += generate_stories(stories, seed + 3)
        random.Random(seed + 4).shuffle(docs)
        paths["corpus"] = _write(d / "corpus.txt", docs)
    if sft:
        rows = take(train(5), sft)
        recs = [
            {"prompt": p.prompt, "completion": p.worked if sft_form == "worked" else p.answer}
            for p in rows
        ]
        paths["sft"] = _write(d / "sft.jsonl", [json.dumps(r) for r in recs])
    return paths


def _row(p: Problem) -> str:
    """The task as data: the prompt and its answer, a column the reward reads."""
    return json.dumps({"prompt": p.prompt, "answer": p.value})


def _write(path: Path, lines: Sequence[str]) -> Path:
    atomic_write_text(path, "".join(f"{x}\n" for x in lines))
    return path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m smollab.data.word_problems", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--out", default="data/word-problems", help="directory for the files")
    p.add_argument("--prompts", type=int, default=1024, help="training prompts (prompts.txt)")
    p.add_argument("--heldout", type=int, default=512, help="held-out prompts (heldout.txt)")
    p.add_argument("--corpus", type=int, default=60_000, help="worked problems in corpus.txt")
    p.add_argument("--stories", type=int, default=2000, help="generated stories in corpus.txt")
    p.add_argument("--sft", type=int, default=4000, help="records in sft.jsonl")
    p.add_argument(
        "--sft-form",
        choices=("worked", "answer"),
        default="worked",
        help="sft.jsonl completions: ' 3 + 4 = 7' or ' 7'",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-number", type=int, default=20, help="largest number in add and take")
    p.add_argument("--max-factor", type=int, default=9, help="largest number in groups")
    a = p.parse_args(argv)
    try:
        paths = write_all(
            a.out,
            prompts=a.prompts,
            heldout=a.heldout,
            corpus=a.corpus,
            stories=a.stories,
            sft=a.sft,
            seed=a.seed,
            max_number=a.max_number,
            max_factor=a.max_factor,
            sft_form=a.sft_form,
        )
    except UserError as e:
        print(f"smollab: error: {e}")
        return 2
    print("wrote " + ", ".join(str(v) for v in paths.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
