"""The sweep spec's schema: `SweepSpec` and its sections, and the validated config of one trial.

`space`, `overrides` and `enqueue` points are keyed by dotted config keys (`optim.lr`); a space
entry is a list of values or a `Distribution` (`low`/`high`). Reading and checking a spec file is
`smollab.lab.sweep.spec_load`.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from smollab.config.load import read_yaml
from smollab.config.recipes import resolve_recipe
from smollab.lab.spec_common import SpecSection, Start
from smollab.rundir.metric import Metric


class Distribution(SpecSection):
    """A range for samplers other than grid: float or int, optionally log-uniform or stepped."""

    low: float
    high: float
    log: bool = False
    type: Literal["float", "int"] = "float"
    step: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> Distribution:
        if not self.low < self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError("log: true needs low > 0")
        if self.log and self.step is not None:
            raise ValueError("log and step cannot be combined")
        if self.type == "int" and not (
            float(self.low).is_integer() and float(self.high).is_integer()
        ):
            raise ValueError("type int needs integer low and high")
        return self

    def optuna(self):
        from optuna.distributions import FloatDistribution, IntDistribution

        if self.type == "int":
            return IntDistribution(
                int(self.low), int(self.high), log=self.log, step=int(self.step or 1)
            )
        return FloatDistribution(self.low, self.high, log=self.log, step=self.step)


class TPEOptions(SpecSection):
    """`sampler: tpe`, every setting whose default moved between Optuna releases named here
    (4.x: independent, no constant liar; 5.x: multivariate with a constant liar), so one spec
    gives the same trials under either."""

    multivariate: bool = Field(
        True, description="tpe: model the keys jointly (lr x beta interact), not one by one"
    )
    constant_liar: bool = Field(
        True,
        description="tpe: count running trials as bad, so trials packed at once are not the same "
        "point",
    )
    group: bool = Field(False, description="tpe: split the space into groups (with multivariate)")
    n_startup_trials: int = Field(10, ge=0, description="tpe: random trials before the model")
    n_ei_candidates: int = Field(24, ge=1, description="tpe: candidates scored per suggestion")

    @model_validator(mode="after")
    def _check(self) -> TPEOptions:
        if self.group and not self.multivariate:
            raise ValueError("group needs multivariate: true")
        return self


class QMCOptions(SpecSection):
    """`sampler: qmc`: the sequence and its scrambling, pinned (scrambled draws use sampler_seed)."""

    type: Literal["sobol", "halton"] = Field(
        "sobol", description="qmc: the low-discrepancy sequence"
    )
    scramble: bool = Field(False, description="qmc: randomize the sequence by sampler_seed")


class Pruner(SpecSection):
    type: Literal["none", "median", "asha", "threshold", "wilcoxon"] = Field(
        "none",
        description="early stopping by Optuna's pruners: median, asha (successive halving), "
        "threshold (lower/upper), wilcoxon (grpo: each held-out prompt's reward paired with the "
        "best trial's), or none",
    )
    metric: str | None = Field(None, description="intermediate metric (default: metric.name)")
    n_startup_trials: int = Field(2, ge=0, description="median: trials before pruning starts")
    n_warmup_steps: int = Field(0, ge=0, description="steps before a trial may be pruned")
    interval_steps: int = Field(1, ge=1, description="steps between pruning checks")
    min_resource: int | None = Field(None, ge=1, description="asha: steps of the first rung")
    reduction_factor: int = Field(
        3, ge=2, description="asha: each rung keeps 1 in this many trials"
    )
    lower: float | None = Field(None, description="threshold: prune a trial below this value")
    upper: float | None = Field(None, description="threshold: prune a trial above this value")
    patience: int | None = Field(
        None,
        ge=0,
        description="prune only a trial whose reported value has not improved for this many "
        "reports (Optuna's PatientPruner around the pruner; with type none, patience alone)",
    )
    min_delta: float = Field(
        0.0, ge=0, description="patience: the least change that counts as an improvement"
    )
    smooth: int | None = Field(
        None,
        ge=1,
        description="report the moving mean of the last k logged values, not each raw value "
        "(a jittery RL curve)",
    )
    p_threshold: float | None = Field(
        None, gt=0, lt=1, description="wilcoxon: prune below this p-value (default 0.1)"
    )
    n_startup_steps: int | None = Field(
        None, ge=0, description="wilcoxon: prompt rewards paired before pruning (default 2)"
    )

    def label(self) -> str:
        """The pruner in a few words: `median (patience 3, min_delta 0.02, smooth 5)`."""
        extra = {
            "patience": self.patience,
            "min_delta": self.min_delta or None,
            "smooth": self.smooth,
            "p_threshold": self.p_threshold,
        }
        shown = ", ".join(f"{k} {v:g}" for k, v in extra.items() if v is not None)
        return f"{self.type} ({shown})" if shown else self.type

    @model_validator(mode="after")
    def _check(self) -> Pruner:
        if self.type == "asha" and self.min_resource is None:
            raise ValueError("asha needs an explicit min_resource (steps of the first rung)")
        if self.type == "threshold" and self.lower is None and self.upper is None:
            raise ValueError("threshold needs lower or upper")
        if self.min_delta and self.patience is None:
            raise ValueError("min_delta needs patience")
        if self.smooth is not None and self.type == "none" and self.patience is None:
            raise ValueError("smooth needs a pruner to smooth for (a type, or patience)")
        if self.type != "wilcoxon":
            for key in ("p_threshold", "n_startup_steps"):
                if getattr(self, key) is not None:
                    raise ValueError(f"{key} is for type wilcoxon (the type is {self.type})")
        else:
            for key in ("patience", "smooth", "metric"):
                if getattr(self, key) is not None:
                    raise ValueError(
                        f"{key} acts on a logged curve; wilcoxon pairs each held-out "
                        f"prompt's reward instead"
                    )
        return self


class MeasureOptions(SpecSection):
    """The measure step (`smollab.lab.sweep.measure`): after the search, its best configurations
    on fresh seeds."""

    top_k: int = Field(3, ge=1, description="measure: the search's best configurations rerun")
    seeds: int = Field(ge=1, description="measure: fresh seeds per configuration (--measure N)")


class ReportOptions(SpecSection):
    target_loss: float | None = Field(None, description="LR sweeps: a loss every good run reaches")
    plots_every_s: float = Field(20.0, ge=0, description="least seconds between live plot redraws")
    level: float = Field(0.95, gt=0, lt=1, description="seeds: confidence level of the intervals")
    resamples: int = Field(10000, ge=100, description="seeds: bootstrap resamples")
    seed: int = Field(0, ge=0, description="seeds: the bootstrap's random seed")
    method: Literal["percentile"] = Field("percentile", description="seeds: bootstrap kind")
    reduce: Literal["last", "best", "mean_last_k"] = Field(
        "last", description="seeds: each trial's value: its objective, its best, or mean of last k"
    )
    last_k: int = Field(3, ge=1, description="seeds: reduce mean_last_k: the last k logged values")
    leaders: int = Field(3, ge=2, description="seeds: configurations compared (the best included)")
    power: float = Field(0.8, gt=0, lt=1, description="seeds: power of the seeds-needed estimate")


class PbtOptions(SpecSection):
    """`sampler: pbt`: population-based training (`smollab.lab.sweep.pbt`)."""

    population: int = Field(ge=2, description="members trained at once, each its own lineage")
    interval: int = Field(
        ge=1, description="steps between exploit/explore decisions (each member's checkpoints)"
    )
    budget: int = Field(ge=1, description="steps each member trains in all (its train.max_steps)")
    perturb: dict[str, list[float]] = Field(
        description="numeric config key -> factors; a member that exploits multiplies its "
        "donor's value by one of them"
    )
    quantile: float = Field(
        0.25,
        gt=0,
        le=0.5,
        description="fraction of the population at the bottom that exploits one at the top",
    )

    @model_validator(mode="after")
    def _check(self) -> PbtOptions:
        if not self.perturb:
            raise ValueError(
                "perturb: give at least one key and its factors, e.g. optim.lr: [0.8, 1.25]"
            )
        for key, factors in self.perturb.items():
            if not factors:
                raise ValueError(f"perturb.{key}: give at least one factor")
            for f in factors:
                if not f > 0:
                    raise ValueError(f"perturb.{key}: factor {f:g} must be above 0")
        if self.budget <= self.interval:
            raise ValueError(
                f"budget ({self.budget}) must exceed interval ({self.interval}): no member "
                "would ever exploit another"
            )
        return self

    def ends(self) -> list[int]:
        """The step each generation ends at: interval, 2 x interval, ..., budget."""
        return [*range(self.interval, self.budget, self.interval), self.budget]


class RayOptions(SpecSection):
    """`executor: ray`: where the trials run and what each reserves (`smollab.lab.sweep.ray_executor`)."""

    address: str | None = Field(
        None,
        description="the Ray cluster to join: auto (the one running on this machine), host:port "
        "or ray://host:port; null: a local Ray started for the sweep and stopped when it ends "
        "(joins RAY_ADDRESS's cluster when that is set), as Ray Tune does",
    )
    cpu: float = Field(1.0, gt=0, description="CPUs a trial reserves; its threads, rounded up")
    gpu: float | None = Field(
        None, ge=0, description="GPUs a trial reserves (default: 1/concurrency on CUDA, else 0)"
    )


class SweepSpec(SpecSection):
    command: str = Field(description="the command each trial runs: pretrain, grpo, sft or rft")
    base: str | None = Field(None, description="the recipe every trial starts from")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="dotted config keys every trial sets, over base"
    )
    space: dict[str, list[Any] | Distribution] = Field(
        description="dotted config key -> a list of values, or a range {low, high, log, type, "
        "step} for samplers other than grid"
    )
    sampler: Literal["grid", "random", "qmc", "tpe", "pbt"] = Field(
        "grid",
        description="how points are picked: every combination (grid), Optuna's sampler, or "
        "population-based training (pbt: the pbt section)",
    )
    sampler_seed: int = Field(0, description="seed of the sampler")
    tpe: TPEOptions | None = Field(
        None, description="sampler tpe: its settings, pinned (default: the values shown)"
    )
    qmc: QMCOptions | None = Field(
        None, description="sampler qmc: its sequence and scrambling, pinned"
    )
    n_trials: int | None = Field(None, ge=1, description="configurations to sample (not grid)")
    seeds: list[int] = Field(
        default_factory=lambda: [0], min_length=1, description="run.seed of each configuration"
    )
    metric: Metric = Field(description="the objective: a metrics.csv column, goal, reduction")
    pbt: PbtOptions | None = Field(None, description="sampler pbt: population, interval, perturb")
    pruner: Pruner = Field(default_factory=Pruner)
    enqueue: list[dict[str, Any]] = Field(
        default_factory=list,
        description="points (dotted key -> value) tried first, e.g. to bracket the range",
    )
    concurrency: int | Literal["auto"] = Field(
        1,
        description="trials at once; auto: the best throughput of the last probe of this "
        "workload on this device",
    )
    threads: int | None = Field(None, ge=1, description="CPU threads to divide (default: all)")
    dir: str | None = Field(None, description="default sweeps/<spec name>")
    storage: str | None = Field(None, description="an RDB URL; default: <dir>/study.journal")
    study_name: str | None = Field(None, min_length=1, description="default: unique to the dir")
    mps: bool = Field(False, description="CUDA: run trials under the NVIDIA MPS daemon")
    executor: Literal["local", "ray", "lanes"] = Field(
        "local", description="child processes, Ray, or lanes of one GRPO worker"
    )
    start: Start = "auto"
    lanes: int | Literal["auto"] | None = Field(
        None,
        description="executor lanes: trials trained at once as lanes of one worker (N, or "
        "auto: the best of the last probe of lane counts)",
    )
    lane_workers: int | Literal["auto"] | None = Field(
        None,
        description="executor lanes: worker processes of `lanes` lanes each, the threads "
        "split among them (default 1; with lanes: auto, the probe's best)",
    )
    ray: RayOptions | None = Field(None, description="executor ray: cluster and trial resources")
    retry_failed: bool = Field(True, description="a rerun retries trials that failed (crashed)")
    stop_timeout_s: float = Field(60.0, gt=0, description="grace for a child to stop on SIGINT")
    trial_timeout_s: float | None = Field(
        None, gt=0, description="wall-clock seconds a trial may run per launch (default: no limit)"
    )
    stall_timeout_s: float | None = Field(
        3600.0, gt=0, description="seconds a trial may write nothing to its run dir (null: off)"
    )
    poll_s: float = Field(0.5, gt=0, description="seconds between looks at the running trials")
    routing_baseline: bool = Field(
        False,
        description="also run each routed GRPO trial's matched grpo.routing.mode=none "
        "baseline, once per distinct baseline (smollab.lab.sweep.baseline)",
    )
    report: ReportOptions = Field(default_factory=ReportOptions)
    measure: MeasureOptions | None = Field(
        None,
        description="once the search ends, rerun its best top_k configurations with `seeds` "
        "fresh seeds (not the search's) and compare them across those",
    )

    # ---- derived ---------------------------------------------------------------------------

    def warm_refused(self) -> str | None:
        """Why this executor's trials cannot fork from a warm start server, or None."""
        if self.executor == "lanes":
            return "executor lanes: a worker trains its trials as lanes of one process"
        if self.executor == "ray":  # seen: the kill -9 resume test's trials ran on to their end
            return (
                "executor ray: an actor that ends takes its own children with it, not a trial "
                "forked from a server it started, which would run on unwatched"
            )
        return None

    def grid_points(self) -> list[dict[str, Any]]:
        """Every configuration of a grid (without seeds), in the spec's order."""
        keys = list(self.space)
        return [
            dict(zip(keys, combo, strict=True))
            for combo in itertools.product(*(self.space[k] for k in keys))
        ]

    def param_keys(self) -> list[str]:
        """The keys a trial's point holds: the space's, then (pbt) the perturbed ones it lacks."""
        extra = [k for k in (self.pbt.perturb if self.pbt else {}) if k not in self.space]
        return [*self.space, *extra]

    def total_runs(self) -> int:
        if self.pbt is not None:  # one trial per member and generation
            return self.pbt.population * len(self.pbt.ends())
        configs = len(self.grid_points()) if self.sampler == "grid" else self.n_trials or 0
        return configs * len(self.seeds)

    def identity(self) -> dict[str, Any]:
        """What defines the study: a rerun in the same dir must not change it."""
        d = self.model_dump(mode="json")
        return {
            k: d[k]
            for k in (
                "command",
                "base",
                "overrides",
                "space",
                "sampler",
                "sampler_seed",
                "seeds",
                "metric",
            )
        } | ({"pbt": d["pbt"]} if self.pbt else {})  # a dir from before pbt keeps its identity

    def sweep_dir(self) -> Path:
        return Path(self.dir) if self.dir else Path("sweeps") / "sweep"

    def describe(self) -> list[str]:
        """What the sweep would run (`smollab sweep --dry-run`)."""
        from smollab.lab.spec_common import override_value

        def show(v: Any) -> str:
            return f"{v:.4g}" if isinstance(v, float) else str(v)

        out = [
            f"sweep {self.sweep_dir()}: command {self.command}, base {self.base or '(defaults)'}"
        ]
        if self.overrides:
            out.append(
                "overrides: "
                + " ".join(f"{k}={override_value(v)}" for k, v in self.overrides.items())
            )
        if self.sampler == "grid":
            points = self.grid_points()
            out.append(
                f"grid: {len(points)} points x {len(self.seeds)} seed(s) = "
                f"{self.total_runs()} trials"
            )
            out += ["  " + " ".join(f"{k}={show(v)}" for k, v in p.items()) for p in points]
        elif self.pbt is not None:
            p = self.pbt
            out.append(
                f"pbt: a population of {p.population}, {p.budget} steps each, exploit/explore "
                f"every {p.interval} steps ({len(p.ends())} generations, {self.total_runs()} "
                f"trials); the bottom {p.quantile:g} continue from the top's checkpoints"
            )
            out += [f"  perturb {k} by {v}" for k, v in p.perturb.items()]
            out += [f"  {k}: {v}" for k, v in self.space.items()]
        else:
            out.append(
                f"{self.sampler}: {self.n_trials} configurations x {len(self.seeds)} seed(s)"
            )
            out += [f"  {k}: {v}" for k, v in self.space.items()]
            pinned = {"tpe": self.tpe or TPEOptions(), "qmc": self.qmc or QMCOptions()}
            if self.sampler in pinned:
                settings = pinned[self.sampler].model_dump()
                out.append(
                    f"{self.sampler} (seed {self.sampler_seed}): "
                    + ", ".join(f"{k} {v}" for k, v in settings.items())
                )
        if self.routing_baseline:
            out.append(self._describe_baselines())
        if self.measure:
            first = max(self.seeds) + 1
            out.append(
                f"measure: then the best {self.measure.top_k} configuration(s) x fresh seeds "
                f"{list(range(first, first + self.measure.seeds))}"
            )
        at_once = (
            f"lanes: {self.lanes}"
            + (f"; lane_workers: {self.lane_workers}" if self.lane_workers is not None else "")
            if self.executor == "lanes"
            else f"concurrency: {self.concurrency}"
        )
        out.append(
            f"metric: {self.metric.label} ({self.metric.goal}); pruner: {self.pruner.label()}; "
            f"{at_once}; executor: {self.executor}"
            + (f"; start: {self.start}" if self.executor == "local" else "")
        )
        limits = {"trial timeout": self.trial_timeout_s, "stall timeout": self.stall_timeout_s}
        out.append(
            "; ".join(f"{k}: {'off' if v is None else f'{v:g} s'}" for k, v in limits.items())
            + f"; SIGKILL {self.stop_timeout_s:g} s after SIGINT"
        )
        return out

    def _describe_baselines(self) -> str:
        from smollab.lab.sweep.baseline import Baselines

        if self.sampler != "grid":
            return (
                "routing baselines: one matched mode=none trial per distinct routed configuration"
            )
        found = Baselines(self)
        routed = [
            found.add(str(i), p, s) for i, p in enumerate(self.grid_points()) for s in self.seeds
        ]
        n_routed = sum(1 for b in routed if b is not None)
        return (
            f"routing baselines: {len(found.by_name)} matched mode=none trial(s) for "
            f"{n_routed} routed trial(s)"
        )


def base_tree(spec: SweepSpec) -> dict[str, Any]:
    """The base recipe with the spec's overrides applied (a config tree, not yet validated)."""
    from smollab.config.load import set_dotted

    tree = read_yaml(resolve_recipe(spec.base, spec.command)) if spec.base else {}
    for key, value in spec.overrides.items():
        set_dotted(tree, key, value)
    return tree


def resolve_config(spec: SweepSpec, point: dict[str, Any], seed: int | None = None):
    """The validated config of one trial (used to check the spec, and for probe signatures)."""
    from smollab.config.load import set_dotted, validate
    from smollab.config.registry import SCHEMAS

    tree = base_tree(spec)
    for key, value in point.items():
        set_dotted(tree, key, value)
    if seed is not None:
        set_dotted(tree, "run.seed", seed)
    return validate(SCHEMAS[spec.command], tree)
