"""The sweep's Optuna study: its sampler and pruner, the search space as Optuna distributions, and
its storage (a journal file in the sweep dir unless the spec names an RDB URL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from smollab.lab.sweep.spec import Distribution, Pruner, SweepSpec


def _grid_sampler_cls():
    from optuna.samplers import GridSampler

    class AskTellGrid(GridSampler):
        """GridSampler whose after_trial does not call `study.stop()`: that only works inside
        `study.optimize`, and raises under ask and tell on the last grid point."""

        def after_trial(self, study, trial, state, values) -> None:
            return None

    return AskTellGrid


def make_sampler(spec: SweepSpec):
    import optuna

    if spec.sampler == "grid":
        space = {k: list(v) for k, v in spec.space.items()}
        space["seed"] = list(spec.seeds)
        return _grid_sampler_cls()(space, seed=spec.sampler_seed)
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=spec.sampler_seed)
    if spec.sampler == "qmc":
        return optuna.samplers.QMCSampler(seed=spec.sampler_seed, warn_independent_sampling=False)
    return optuna.samplers.TPESampler(seed=spec.sampler_seed)


def make_pruner(spec: SweepSpec):
    import optuna

    p = spec.pruner
    if p.type == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.n_startup_trials,
                                           n_warmup_steps=p.n_warmup_steps,
                                           interval_steps=p.interval_steps)  # fmt: skip
    if p.type == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=p.min_resource,
                                                      reduction_factor=p.reduction_factor)  # fmt: skip
    if p.type == "threshold":
        return optuna.pruners.ThresholdPruner(lower=p.lower, upper=p.upper,
                                              n_warmup_steps=p.n_warmup_steps,
                                              interval_steps=p.interval_steps)  # fmt: skip
    return optuna.pruners.NopPruner()


def prune_evidence(p: Pruner, metric: str, step: int, value: float) -> str:
    """Why the pruner stopped a trial, in words for its summary and results.csv."""
    evidence = f"{p.type} pruner at step {step}: {metric} {value:.4g}"
    if p.type == "threshold" and p.upper is not None and value > p.upper:
        evidence += f" above the upper bound {p.upper:g}"
    elif p.type == "threshold" and p.lower is not None and value < p.lower:
        evidence += f" below the lower bound {p.lower:g}"
    elif p.type == "median":
        evidence += " worse than the median of earlier trials at this step"
    elif p.type == "asha":
        evidence += f" not in the top 1/{p.reduction_factor} of its rung"
    return evidence


def distributions(spec: SweepSpec) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution

    d = {k: v.optuna() if isinstance(v, Distribution) else CategoricalDistribution(v)
         for k, v in spec.space.items()}  # fmt: skip
    if spec.sampler == "grid":
        d["seed"] = CategoricalDistribution(list(spec.seeds))
    return d


def open_study(spec: SweepSpec, sweep_dir: Path):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if spec.storage:
        storage = spec.storage
    else:
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        storage = JournalStorage(JournalFileBackend(str(sweep_dir / "study.journal")))
    return optuna.create_study(
        storage=storage, study_name=spec.study_name, load_if_exists=True,
        direction="minimize" if spec.metric.goal == "min" else "maximize",
        sampler=make_sampler(spec), pruner=make_pruner(spec),
    )  # fmt: skip
