"""The chess FEN rewards, batched vs one completion at a time (never run by CI).

A GRPO-shaped batch: 256 completions, `--prompts` distinct prompts (default 32 x 8 generations),
each completion its prompt's true next FEN with 0-8 random character edits. Timed alternately in
one process, medians of wall and process CPU seconds:

- batched: the registered `fen_distance` (true FEN once per distinct prompt, cached; one
  rapidfuzz `process.cpdist` call), with the cache cleared before each call (one step's cost on
  new prompts) and warm (prompts seen at an earlier step, as a prompts file's are);
- per item: `fen_distance_serial` (python-chess push and one Levenshtein call per completion);
- the distance alone: cpdist vs a Python loop of `Levenshtein.normalized_similarity`.

    python benchmarks/chess_rewards.py [--n 256] [--prompts 32] [--repeats 15]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time


def _corrupt(text: str, rng: random.Random) -> str:
    chars = list(text)
    for _ in range(rng.randint(0, 8)):
        i = rng.randrange(len(chars))
        op = rng.choice("sid")
        if op == "s":
            chars[i] = rng.choice("pnbrqkPNBRQK12345678/")
        elif op == "i":
            chars.insert(i, rng.choice("pnbrqkPNBRQK12345678/"))
        elif len(chars) > 1:
            del chars[i]
    return "".join(chars)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=15)
    a = ap.parse_args()

    from rapidfuzz import process
    from rapidfuzz.distance import Levenshtein

    from smollab.data.chess_fen import examples
    from smollab.device.mfu import cpu_model_name
    from smollab.rewards.chess_fen import answer, fen_distance, fen_distance_serial, true_fen

    rng = random.Random(0)
    rows = examples(a.prompts, seed=0)
    per = a.n // a.prompts
    prompts = [r["prompt"] for r in rows for _ in range(per)]
    comps = [_corrupt(r["answer"], rng) for r in rows for _ in range(per)]
    truths = [true_fen(p) for p in prompts]
    assert fen_distance(comps, prompts) == fen_distance_serial(comps, prompts)

    def cold() -> None:
        true_fen.cache_clear()
        fen_distance(comps, prompts)

    answers = [answer(c) for c in comps]
    cases = {
        "batched, cold cache": cold,
        "batched, warm cache": lambda: fen_distance(comps, prompts),
        "per item": lambda: fen_distance_serial(comps, prompts),
        "distance only: cpdist": lambda: process.cpdist(
            answers, truths, scorer=Levenshtein.normalized_similarity
        ),
        "distance only: loop": lambda: [
            Levenshtein.normalized_similarity(x, t) for x, t in zip(answers, truths, strict=True)
        ],
    }
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in cases}
    for _ in range(a.repeats):
        for name, fn in cases.items():
            w, c = time.perf_counter(), time.process_time()
            fn()
            times[name].append((time.perf_counter() - w, time.process_time() - c))
    print(
        f"CPU: {cpu_model_name()}; {len(comps)} completions, {a.prompts} distinct prompts, "
        f"median of {a.repeats}"
    )
    med = {k: statistics.median(w for w, _ in v) for k, v in times.items()}
    for name, v in times.items():
        cpu = statistics.median(c for _, c in v)
        print(f"  {name:24s} wall {med[name] * 1e3:8.3f} ms   cpu {cpu * 1e3:8.3f} ms")
    print(
        f"per item / batched cold: {med['per item'] / med['batched, cold cache']:.1f}x; "
        f"per item / batched warm: {med['per item'] / med['batched, warm cache']:.1f}x; "
        f"loop / cpdist: {med['distance only: loop'] / med['distance only: cpdist']:.1f}x"
    )


if __name__ == "__main__":
    main()
