"""Diversity of a batch of completions: high reward with collapsed diversity is a failure."""

from __future__ import annotations

from itertools import combinations


def unique_fraction(texts: list[str]) -> float:
    return len(set(texts)) / len(texts) if texts else 0.0


def mean_pairwise_jaccard(texts: list[str], max_pairs: int = 2000) -> float:
    """Mean word-set Jaccard similarity over pairs (the first `max_pairs` pairs, in order)."""
    sets = [set(t.split()) for t in texts]
    total, n = 0.0, 0
    for a, b in combinations(sets, 2):
        union = len(a | b)
        total += len(a & b) / union if union else 1.0
        n += 1
        if n >= max_pairs:
            break
    return total / n if n else 0.0


def repetition(texts: list[str], n: int = 4) -> float:
    """Mean seq-rep-n (Welleck et al., 2019): share of each text's word n-grams that repeat.

    Catches templates inside a completion ("every day, he felt happy when he ... every day, he
    felt happy when he ..."), which unique fraction and cross-sample Jaccard miss.
    """
    values = []
    for t in texts:
        words = t.split()
        grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        values.append(1 - len(set(grams)) / len(grams) if grams else 0.0)
    return sum(values) / len(values) if values else 0.0
