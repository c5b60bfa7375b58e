"""Population-based training (`sampler: pbt`): a population of members trained in generations of
`pbt.interval` steps; at each generation's end the bottom `quantile` exploit a top member (they
continue from its checkpoint, its hyperparameters multiplied by one of each key's `perturb`
factors) and the others continue themselves.

How a member continues, and why so:
- Every member runs to `train.max_steps = pbt.budget` with `train.save_interval = pbt.interval`,
  so the LR schedule is the one of a plain `budget`-step run and a checkpoint lands on every
  generation's end. When a generation's checkpoint (`checkpoints/step_<end>/`) is written the
  sweep stops the child (SIGINT; a lane's stop through the inbox, as for a pruned lane; a poll's
  worth of steps past the end are discarded): its rows past the end are cut and it is recorded
  `completed`, its metric the value at the end.
- A continuation is a NEW trial, in a new run directory, for every member of the next generation
  (one that continues itself too): the parent's `step_<end>` checkpoint is hard-linked into it,
  with the parent's metrics.csv and its config.json with the new values written in, and the
  child starts with `run.resume=auto` and the new values, so it resumes there: weights, AdamW
  moments, RNG streams and the step counter carry over, and the LR at step s is the schedule of
  the NEW `optim.lr` at s (the loops set it every step). AdamW's own keys (weight_decay, betas,
  eps) sit in the optimizer state the checkpoint restores, so they may not be perturbed.
  With `executor: lanes` the child is a lane: the worker resumes a posted trial from its run
  dir's newest checkpoint as a process does, so a continuation refills a freed lane from its
  parent's checkpoint, and nothing here knows the executor.
- Generations are synchronous: generation g+1 is decided once every member of g ended. The
  lineage is then a function of the metrics alone (and `sampler_seed`, which picks the donor
  among the top members and each factor), and a sweep killed at any point continues exactly:
  every decision is a trial in the study, made after its run directory is ready.
- A member without a metric (failed, diverged) counts as the worst. Failed trials are not
  retried: the next generation replaces them from a top member. A bottom member whose metric
  ties the best continues itself, and one that exploits takes a top member that beats it, not
  one that ties it (a flat reward says nothing about who is better).
Trials of a pbt sweep record `pbt_member`, `pbt_generation`, `parent` (the parent's run
directory), `parent_trial` (its study number), `parent_step` and `perturbed` (key -> factor)
as user attributes; results.csv and the report show them.
"""

from __future__ import annotations

import csv
import io
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smollab.errors import UserError
from smollab.lab.sweep.spec import Distribution, SweepSpec, resolve_config
from smollab.lab.sweep.trials import NextTrial, trial_name
from smollab.rundir.atomic import atomic_write_json, atomic_write_text, read_json
from smollab.rundir.runs import CHECKPOINTS, CONFIG, METRICS, TRAINER_STATE, set_status

MEMBER, GENERATION = "pbt_member", "pbt_generation"
# AdamW's own settings: the checkpoint's optimizer state restores them over the config's.
OPTIMIZER_STATE_KEYS = ("optim.weight_decay", "optim.beta1", "optim.beta2", "optim.eps")
# What shapes the checkpoint's weights: a member resumed with another value could not load them.
SHAPE_KEYS = ("model.lora.r",)


def fixed_overrides(spec: SweepSpec) -> dict[str, Any]:
    """What every member runs with: the whole budget's schedule, a checkpoint per generation."""
    return {"train.max_steps": spec.pbt.budget, "train.save_interval": spec.pbt.interval}


def initial_points(spec: SweepSpec) -> list[dict[str, Any]]:
    """Generation 0's values: the grid's points in turn when the space is all lists (a population
    of 8 over a 2 x 4 grid starts from the grid), else draws seeded by `sampler_seed`; a
    perturbed key outside the space keeps the base config's value."""
    n = spec.pbt.population
    if all(isinstance(v, list) for v in spec.space.values()):
        grid = spec.grid_points()
        points = [dict(grid[i % len(grid)]) for i in range(n)]
    else:
        rng = random.Random(spec.sampler_seed)
        points = [
            {
                key: _draw(rng, d) if isinstance(d, Distribution) else rng.choice(d)
                for key, d in spec.space.items()
            }
            for _ in range(n)
        ]
    base = resolve_config(spec, points[0], spec.seeds[0]).model_dump()
    for key in spec.param_keys()[len(spec.space) :]:
        for point in points:
            point[key] = base_value(base, key)
    return points


def base_value(config: dict[str, Any], key: str) -> Any:
    """A dotted key's value in a config dump."""
    for part in key.split("."):
        config = config[part]
    return config


def _draw(rng: random.Random, d: Distribution) -> float | int:
    import math

    if d.log:
        v = math.exp(rng.uniform(math.log(d.low), math.log(d.high)))
    else:
        v = rng.uniform(d.low, d.high)
    if d.step:
        v = d.low + round((v - d.low) / d.step) * d.step
    return int(round(v)) if d.type == "int" else float(f"{v:.6g}")


def perturbed(value: Any, factor: float) -> Any:
    v = value * factor
    return int(round(v)) if isinstance(value, int) else float(f"{v:.6g}")


def segment_done(run_dir: Path, end: int) -> bool:
    """Whether a member has written the checkpoint its generation ends at."""
    return (run_dir / CHECKPOINTS / f"step_{end}" / TRAINER_STATE).exists()


def cut_metrics(run_dir: Path, end: int) -> None:
    """Drop metrics.csv's rows past `end`: the steps a stopped member ran past its generation's
    checkpoint belong to no lineage (its continuation starts from the checkpoint)."""
    path = run_dir / METRICS
    if not path.exists():
        return
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames or [], list(reader)
    kept = [r for r in rows if not r.get("step") or int(float(r["step"])) <= end]
    if len(kept) == len(rows):
        return
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(kept)
    atomic_write_text(path, buf.getvalue())


def fork_run(parent: Path, step: int, run_dir: Path, values: dict[str, Any]) -> None:
    """Make `run_dir` a run that resumes at the parent's `step` with `values` set: its checkpoint
    (hard links: checkpoints are never rewritten in place), its metrics (cut to `step` by the
    child on resume) and its config with the new values. Built beside and renamed into place."""
    from smollab.config.load import set_dotted

    ckpt = parent / CHECKPOINTS / f"step_{step}"
    if not (ckpt / TRAINER_STATE).exists():
        raise UserError(
            f"pbt: {ckpt} is missing: the member cannot be continued (was train.keep_last "
            "too small for the steps it ran past its generation's end?)"
        )
    tmp = run_dir.with_name(run_dir.name + ".fork")
    for p in (tmp, run_dir):  # left by a sweep killed before the trial was recorded
        shutil.rmtree(p, ignore_errors=True)
    (tmp / CHECKPOINTS).mkdir(parents=True)
    try:
        shutil.copytree(ckpt, tmp / CHECKPOINTS / ckpt.name, copy_function=os.link)
    except OSError:  # another filesystem: copies
        shutil.rmtree(tmp / CHECKPOINTS / ckpt.name, ignore_errors=True)
        shutil.copytree(ckpt, tmp / CHECKPOINTS / ckpt.name)
    if (parent / METRICS).exists():
        shutil.copyfile(parent / METRICS, tmp / METRICS)
        cut_metrics(tmp, step)
    if (parent / CONFIG).exists():
        config = read_json(parent / CONFIG)
        for key, value in {**values, "run.dir": str(run_dir)}.items():
            set_dotted(config, key, value)
        atomic_write_json(tmp / CONFIG, config)
    os.replace(tmp, run_dir)


def _param_distribution(spec: SweepSpec, key: str, value: Any):
    """The member's value as an Optuna distribution: a perturbed key's value lies anywhere, so it
    is the one-point range of its own value; other keys keep the space's choices."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if key in spec.pbt.perturb:
        if isinstance(value, int):
            return IntDistribution(value, value)
        return FloatDistribution(float(value), float(value))
    d = spec.space[key]
    return d.optuna() if isinstance(d, Distribution) else CategoricalDistribution(d)


class Population:
    """Which member runs next, decided from the study: generation 0's members first, then each
    next generation once the previous one has ended."""

    def __init__(
        self,
        spec: SweepSpec,
        study: Any,
        trials_dir: Path,
        say: Callable[[str], None],
        add_running: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], Any],
    ):
        self.spec, self.study, self.trials_dir, self.say = spec, study, trials_dir, say
        self.add_running = add_running  # Trials.add_running: records a RUNNING trial we launch
        self.ends = spec.pbt.ends()
        self._said_extinct = False

    def _by_slot(self) -> dict[tuple[int, int], Any]:
        out = {}
        for t in self.study.get_trials(deepcopy=False):
            if GENERATION in t.user_attrs:
                out[(t.user_attrs[GENERATION], t.user_attrs[MEMBER])] = t
        return out

    def segment_end(self, trial: Any) -> int | None:
        """The step a running trial's generation ends at; None for the last generation."""
        g = getattr(trial, "user_attrs", {}).get(GENERATION)
        return None if g is None or g >= len(self.ends) - 1 else self.ends[g]

    def segment_over(self, trial: Any, run_dir: Path) -> bool:
        """Whether a running member has checkpointed its (not last) generation's end."""
        end = self.segment_end(trial)
        return end is not None and segment_done(run_dir, end)

    def end_segment(self, trial: Any, run_dir: Path) -> bool:
        """Close a member's generation once its child exited: when it checkpointed the end, the
        rows past the end are cut and it is `completed` there, however the child ended (stopped
        by the sweep, run on to the budget, diverged later): what it did past its checkpoint
        belongs to no lineage. False when the end was not reached (or is the budget's)."""
        if not self.segment_over(trial, run_dir):
            return False
        end = self.segment_end(trial)
        cut_metrics(run_dir, end)
        set_status(run_dir, "completed", f"pbt: its generation ends at step {end}")
        return True

    def next_trial(self) -> NextTrial | None:
        from optuna.trial import TrialState

        by = self._by_slot()
        n = self.spec.pbt.population
        for g in range(len(self.ends)):
            missing = [m for m in range(n) if (g, m) not in by]
            if not missing:
                continue
            if g == 0:
                return self._create(0, missing[0], initial_points(self.spec)[missing[0]], None)
            prev = {m: by[(g - 1, m)] for m in range(n)}
            if not all(t.state.is_finished() for t in prev.values()):
                return None  # the generation's decisions wait for all its members
            values = {m: t.value for m, t in prev.items() if t.state == TrialState.COMPLETE}
            if not values:
                if not self._said_extinct:
                    self.say(f"pbt: no member of generation {g - 1} has a metric; stopping")
                    self._said_extinct = True
                return None
            donor, point, factors = self._decide(g, missing[0], prev, values)
            return self._create(g, missing[0], point, prev[donor], factors)
        return None

    def _decide(
        self, g: int, m: int, prev: dict[int, Any], values: dict[int, float]
    ) -> tuple[int, dict[str, Any], dict[str, float]]:
        """(donor, values, factors): the member itself unchanged, or, in the bottom quantile (or
        without a metric), the values of a top member that did better, perturbed."""
        p = self.spec.pbt
        ranked = sorted(values, key=lambda i: (values[i], i))
        if self.spec.metric.goal == "max":
            ranked = sorted(values, key=lambda i: (-values[i], i))
        k = max(1, int(p.quantile * p.population))
        top, bottom = ranked[:k], set(ranked[-k:])
        own = {key: prev[m].params[key] for key in self.spec.param_keys()}
        if m in top or (m in values and m not in bottom) or values.get(m) == values[top[0]]:
            return m, own, {}  # a bottom member that ties the best has nothing to gain
        # A top member that ties this one (a flat metric fills the top with ties) is no better.
        better = [i for i in top if m not in values or values[i] != values[m]]
        rng = random.Random(f"{self.spec.sampler_seed}:{g}:{m}")
        donor = rng.choice(better)
        point = {key: prev[donor].params[key] for key in self.spec.param_keys()}
        factors = {key: rng.choice(fs) for key, fs in p.perturb.items()}
        trial = {key: perturbed(point[key], f) for key, f in factors.items()}
        try:  # a perturbed value the schema refuses (beta=1.2): the donor's values unperturbed
            resolve_config(self.spec, {**point, **trial, **fixed_overrides(self.spec)})
        except UserError as e:
            self.say(f"pbt: member {m} generation {g}: perturbation refused ({e}); unperturbed")
            return donor, point, {}
        return donor, {**point, **trial}, factors

    def _create(
        self,
        g: int,
        m: int,
        point: dict[str, Any],
        parent: Any | None,
        factors: dict[str, float] | None = None,
    ) -> NextTrial:
        """Record the member's trial of generation g in the study (RUNNING, as a retry is), after
        its run directory is forked from the parent's checkpoint."""
        import optuna

        seed = self.spec.seeds[0]
        name = trial_name(0, point, seed).replace("000", f"g{g:02d}-m{m:02d}", 1)
        attrs: dict[str, Any] = {
            "run_dir": name,
            "seed": seed,
            MEMBER: m,
            GENERATION: g,
            "overrides": fixed_overrides(self.spec),
        }
        if parent is not None:
            step = self.ends[g - 1]
            fork_run(
                self.trials_dir / parent.user_attrs["run_dir"], step, self.trials_dir / name, point
            )
            attrs.update(
                parent=parent.user_attrs["run_dir"],
                parent_trial=parent.number,
                parent_step=step,
                perturbed=factors or {},
            )
            how = (
                f"exploits {parent.user_attrs['run_dir']} at step {step}, "
                + ", ".join(f"{k.split('.')[-1]} x{f:g}" for k, f in factors.items())
                if factors
                else f"continues from {parent.user_attrs['run_dir']} at step {step}"
            )
            self.say(f"pbt: member {m} generation {g}: {how}")
        dists = {k: _param_distribution(self.spec, k, v) for k, v in point.items()}
        frozen = self.add_running(point, dists, attrs)
        trial = optuna.trial.Trial(self.study, frozen._trial_id)
        return NextTrial(trial, name, point, seed, extra=fixed_overrides(self.spec))
