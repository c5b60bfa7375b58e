"""How sure a comparison across seeds is: per configuration the mean, the interquartile mean and a
bootstrap interval of the mean; for the leading configurations against the best the probability
of improvement, the difference's interval and how many seeds would settle it.

A single final value per seed is noisy in RL, so each seed's value can be its last, its best, or
the mean of its last k logged values (`reduce`).

The bootstrap is stratified over seeds: each configuration's seeds are resampled on their own (a
difference resamples both configurations independently), a percentile interval of the resampled
means. `scipy.stats.bootstrap` does the same, and the tests hold this to it, but scipy is not a
dependency of smollab and a few lines of numpy are all it takes; the method, the number of
resamples and the seed are named in the result so a reader can reproduce it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import NormalDist
from typing import Any, Literal

import numpy as np

Reduce = Literal["last", "best", "mean_last_k"]


@dataclass(frozen=True)
class StatsOptions:
    level: float = 0.95
    resamples: int = 10000
    seed: int = 0
    method: Literal["percentile"] = "percentile"
    reduce: Reduce = "last"
    last_k: int = 3
    leaders: int = 3  # the best and the next ones compared against it
    power: float = 0.8  # of the "seeds needed" estimate

    def describe(self) -> str:
        return (
            f"{self.method} bootstrap of the mean, stratified over seeds, "
            f"{self.resamples} resamples, seed {self.seed}, level {self.level:g}; "
            f"each seed's value: {self.reduce_label}"
        )

    @property
    def reduce_label(self) -> str:
        return f"mean of the last {self.last_k}" if self.reduce == "mean_last_k" else self.reduce


def reduce_curve(values: list[float], goal: str, how: Reduce, k: int) -> float | None:
    """One seed's value from its logged values (in step order)."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None
    if how == "last":
        return vals[-1]
    if how == "best":
        return min(vals) if goal == "min" else max(vals)
    return float(np.mean(vals[-k:]))


def iqm(values: list[float]) -> float:
    """Interquartile mean: the mean of the middle half (a quarter of the seeds cut from each end,
    rounded down, as scipy's trim_mean), robust to one wild seed."""
    x = np.sort(np.asarray(values, float))
    cut = int(0.25 * len(x))
    return float(np.mean(x[cut : len(x) - cut]))


def _bootstrap(samples: tuple, statistic, opts: StatsOptions) -> tuple[float | None, float | None]:
    """Percentile interval of `statistic` over resamples drawn from each sample on its own."""
    if any(len(s) < 2 for s in samples):
        return None, None  # one seed has no spread to resample
    rng = np.random.default_rng(opts.seed)
    resampled = [
        s[rng.integers(0, len(s), size=(opts.resamples, len(s)))] for s in map(np.asarray, samples)
    ]
    values = statistic(*resampled, axis=-1)
    alpha = (1 - opts.level) / 2
    lo, hi = np.quantile(values, [alpha, 1 - alpha])
    return float(lo), float(hi)


def _mean(x, axis=-1):
    return np.mean(x, axis=axis)


def _diff(a, b, axis=-1):
    return np.mean(a, axis=axis) - np.mean(b, axis=axis)


def mean_interval(values: list[float], opts: StatsOptions) -> tuple[float | None, float | None]:
    return _bootstrap((np.asarray(values, float),), _mean, opts)


def difference_interval(
    a: list[float], b: list[float], opts: StatsOptions
) -> tuple[float | None, float | None]:
    """Interval of mean(a) - mean(b), each configuration's seeds resampled on their own."""
    return _bootstrap((np.asarray(a, float), np.asarray(b, float)), _diff, opts)


def probability_of_improvement(a: list[float], b: list[float], goal: str) -> float:
    """P(a seed of `a` does better than a seed of `b`), ties counting half: the Mann-Whitney
    statistic over all pairs, 0.5 when the two are indistinguishable by rank."""
    x = np.asarray(a, float)[:, None]
    y = np.asarray(b, float)[None, :]
    better = (x < y) if goal == "min" else (x > y)
    return float(np.mean(better + 0.5 * (x == y)))


def seeds_needed(a: list[float], b: list[float], opts: StatsOptions) -> int | None:
    """Seeds per configuration for a two-sided test at `level` with `power` to tell the observed
    difference from zero, given the pooled spread (normal approximation). None: no difference."""
    delta = abs(float(np.mean(a)) - float(np.mean(b)))
    if delta == 0:
        return None
    var = [np.var(v, ddof=1) for v in (a, b) if len(v) > 1]
    sd2 = float(np.mean(var)) if var else 0.0
    norm = NormalDist()
    z = norm.inv_cdf(1 - (1 - opts.level) / 2) + norm.inv_cdf(opts.power)
    return max(2, math.ceil(2 * z * z * sd2 / (delta * delta)))


@dataclass
class ConfigStats:
    name: str
    params: dict[str, Any]
    values: list[float]
    mean: float
    iqm: float
    std: float | None
    ci: tuple[float | None, float | None]


@dataclass
class Versus:
    name: str
    best: str
    difference: float
    ci: tuple[float | None, float | None]
    probability_of_improvement: float
    distinguished: bool  # the difference's interval excludes zero
    seeds_needed: int | None


@dataclass
class SeedStats:
    options: StatsOptions
    goal: str
    metric: str
    configs: list[ConfigStats] = field(default_factory=list)  # best first
    versus: list[Versus] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.options.describe(),
            "options": asdict(self.options),
            "metric": self.metric,
            "goal": self.goal,
            "configs": [asdict(c) for c in self.configs],
            "versus_best": [asdict(v) for v in self.versus],
        }


def compare(
    groups: dict[str, tuple[dict[str, Any], list[float]]],
    goal: str,
    metric: str,
    opts: StatsOptions,
) -> SeedStats:
    """`groups`: a name per configuration -> (its parameters, one value per seed)."""
    sign = 1 if goal == "min" else -1
    out = SeedStats(options=opts, goal=goal, metric=metric)
    for name, (params, vals) in groups.items():
        if not vals:
            continue
        out.configs.append(
            ConfigStats(
                name=name,
                params=params,
                values=list(vals),
                mean=float(np.mean(vals)),
                iqm=iqm(vals),
                std=float(np.std(vals, ddof=1)) if len(vals) > 1 else None,
                ci=mean_interval(vals, opts),
            )
        )
    out.configs.sort(key=lambda c: sign * c.mean)
    if not out.configs:
        return out
    best = out.configs[0]
    for c in out.configs[1 : opts.leaders]:
        lo, hi = difference_interval(c.values, best.values, opts)
        out.versus.append(
            Versus(
                name=c.name,
                best=best.name,
                difference=c.mean - best.mean,
                ci=(lo, hi),
                probability_of_improvement=probability_of_improvement(c.values, best.values, goal),
                distinguished=lo is not None and hi is not None and (lo > 0 or hi < 0),
                seeds_needed=seeds_needed(c.values, best.values, opts),
            )
        )
    return out


def _f(v: Any) -> str:
    return "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def _ci(ci: tuple[float | None, float | None]) -> str:
    return "n/a (one seed)" if ci[0] is None else f"[{_f(ci[0])}, {_f(ci[1])}]"


def stats_lines(s: SeedStats) -> list[str]:
    """The markdown section: a table per configuration, then each leader against the best."""
    pct = f"{100 * s.options.level:g}%"
    lines = [f"_Method: {s.options.describe()}._", ""]
    lines += [
        f"| configuration | seeds | mean {s.metric} | IQM | std | {pct} CI of the mean |",
        "|---|---|---|---|---|---|",
    ]
    for c in s.configs:
        lines.append(
            f"| {c.name} | {len(c.values)} | {_f(c.mean)} | {_f(c.iqm)} | {_f(c.std)} | "
            f"{_ci(c.ci)} |"
        )
    lines.append("")
    if s.versus:
        lines += [
            f"Against the best ({s.configs[0].name}); P(improvement): chance that a seed of the "
            "configuration beats a seed of the best.",
            "",
            f"| configuration | difference | {pct} CI | P(improvement) | verdict | seeds needed |",
            "|---|---|---|---|---|---|",
        ]
        for v in s.versus:
            verdict = "distinguished" if v.distinguished else "indistinguishable"
            need = "no difference" if v.seeds_needed is None else str(v.seeds_needed)
            lines.append(
                f"| {v.name} | {_f(v.difference)} | {_ci(v.ci)} | "
                f"{_f(v.probability_of_improvement)} | {verdict} | {need} |"
            )
        lines += [
            "",
            f"_Seeds needed_: per configuration, for a two-sided test at level {s.options.level:g} "
            f"with power {s.options.power:g} to tell the observed difference from zero given the "
            "pooled spread (normal approximation).",
            "",
        ]
    return lines
