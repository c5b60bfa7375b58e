"""The sweep's Optuna study: its sampler and pruner, the search space as Optuna distributions, and
its storage (a journal file in the sweep dir unless the spec names an RDB URL).

The study's name is the spec's `study_name`, else the one the sweep dir recorded in sweep.json
when it started, else one made from the dir's resolved path: two sweep dirs sharing one RDB URL
never merge into one study, and a dir keeps its study when it is moved.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from pathlib import Path
from typing import Any

from smollab.errors import UserError
from smollab.lab.sweep.spec import Distribution, Pruner, QMCOptions, SweepSpec, TPEOptions
from smollab.rundir.atomic import read_json
from smollab.rundir.runs import SWEEP_META

JOURNAL = "study.journal"


def _grid_sampler_cls():
    from optuna.samplers import GridSampler

    class AskTellGrid(GridSampler):
        """GridSampler whose after_trial does not call `study.stop()`: that only works inside
        `study.optimize`, and raises under ask and tell on the last grid point."""

        def after_trial(self, study, trial, state, values) -> None:
            return None

    return AskTellGrid


def make_sampler(spec: SweepSpec):
    """The spec's sampler with every setting passed explicitly: Optuna 5 changed TPE's defaults
    (multivariate, constant_liar), and a default left to the library would give a spec other
    trials after an upgrade."""
    import warnings

    import optuna

    if spec.sampler == "grid":
        space = {k: list(v) for k, v in spec.space.items()}
        space["seed"] = list(spec.seeds)
        return _grid_sampler_cls()(space, seed=spec.sampler_seed)
    if spec.sampler in ("random", "pbt"):  # pbt adds its members itself: never asked
        return optuna.samplers.RandomSampler(seed=spec.sampler_seed)
    with warnings.catch_warnings():  # Optuna marks QMC, and 4.x TPE's multivariate, experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if spec.sampler == "qmc":
            q = spec.qmc or QMCOptions()
            return optuna.samplers.QMCSampler(
                qmc_type=q.type,
                scramble=q.scramble,
                seed=spec.sampler_seed,
                independent_sampler=optuna.samplers.RandomSampler(seed=spec.sampler_seed),
                warn_independent_sampling=False,
            )
        t = spec.tpe or TPEOptions()
        return optuna.samplers.TPESampler(
            seed=spec.sampler_seed,
            multivariate=t.multivariate,
            constant_liar=t.constant_liar,
            group=t.group,
            n_startup_trials=t.n_startup_trials,
            n_ei_candidates=t.n_ei_candidates,
        )


def make_pruner(spec: SweepSpec):
    """The spec's pruner, inside Optuna's PatientPruner when it sets `patience`: a jittery RL
    curve then has to stall for that many reports before the pruner's verdict counts."""
    import warnings

    import optuna

    with warnings.catch_warnings():  # Optuna marks the patient and Wilcoxon pruners experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _pruner(spec.pruner)


def _pruner(p: Pruner):
    import optuna

    if p.type == "median":
        pruner = optuna.pruners.MedianPruner(
            n_startup_trials=p.n_startup_trials,
            n_warmup_steps=p.n_warmup_steps,
            interval_steps=p.interval_steps,
        )
    elif p.type == "asha":
        pruner = optuna.pruners.SuccessiveHalvingPruner(
            min_resource=p.min_resource, reduction_factor=p.reduction_factor
        )
    elif p.type == "threshold":
        pruner = optuna.pruners.ThresholdPruner(
            lower=p.lower,
            upper=p.upper,
            n_warmup_steps=p.n_warmup_steps,
            interval_steps=p.interval_steps,
        )
    elif p.type == "wilcoxon":
        return optuna.pruners.WilcoxonPruner(
            p_threshold=0.1 if p.p_threshold is None else p.p_threshold,
            n_startup_steps=2 if p.n_startup_steps is None else p.n_startup_steps,
        )
    else:
        pruner = None
    if p.patience is not None:
        return optuna.pruners.PatientPruner(pruner, patience=p.patience, min_delta=p.min_delta)
    return pruner or optuna.pruners.NopPruner()


def prunes(p: Pruner) -> bool:
    """Whether the spec's pruner can stop a trial at all (type none without patience cannot)."""
    return p.type != "none" or p.patience is not None


def prune_evidence(p: Pruner, metric: str, step: int, value: float) -> str:
    """Why the pruner stopped a trial, in words for its summary and results.csv."""
    what = (
        f"{metric} {value:.4g}"
        if p.smooth is None
        else f"{metric} {value:.4g} (mean of {p.smooth})"
    )
    if p.type == "wilcoxon":
        return (
            f"wilcoxon pruner after {step + 1} held-out prompt rewards: worse than the best "
            f"trial's, paired prompt by prompt (p < {p.p_threshold or 0.1:g})"
        )
    evidence = f"{p.type} pruner at step {step}: {what}"
    if p.type == "threshold" and p.upper is not None and value > p.upper:
        evidence += f" above the upper bound {p.upper:g}"
    elif p.type == "threshold" and p.lower is not None and value < p.lower:
        evidence += f" below the lower bound {p.lower:g}"
    elif p.type == "median":
        evidence += " worse than the median of earlier trials at this step"
    elif p.type == "asha":
        evidence += f" not in the top 1/{p.reduction_factor} of its rung"
    if p.patience is not None:
        evidence = evidence.replace(
            f"{p.type} pruner",
            "patient pruner" if p.type == "none" else f"patient {p.type} pruner",
            1,
        )
        evidence += (
            f"; its best of its last {p.patience + 1} reports is worse than its best before "
            f"(min_delta {p.min_delta:g})"
        )
    return evidence


def distributions(spec: SweepSpec) -> dict[str, Any]:
    from optuna.distributions import CategoricalDistribution

    d = {
        k: v.optuna() if isinstance(v, Distribution) else CategoricalDistribution(v)
        for k, v in spec.space.items()
    }
    if spec.sampler == "grid":
        d["seed"] = CategoricalDistribution(list(spec.seeds))
    return d


def study_name(spec: SweepSpec, sweep_dir: Path) -> str:
    """The spec's study_name, else the one the dir started with, else `<dir name>-<hash of its
    resolved path>`."""
    if spec.study_name:
        return spec.study_name
    with contextlib.suppress(UserError, OSError, AttributeError):
        recorded = read_json(sweep_dir / SWEEP_META).get("spec", {}).get("study_name")
        if isinstance(recorded, str) and recorded:
            return recorded
    resolved = str(Path(sweep_dir).resolve())
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", Path(resolved).name)[:40] or "sweep"
    return f"{stem}-{hashlib.sha1(resolved.encode()).hexdigest()[:10]}"


def repair_journal(path: Path) -> None:
    """Make a journal a killed sweep left behind readable again (the caller holds the sweep dir's
    lock, so no other process writes it): drop a torn last line, which Optuna would otherwise
    glue to the next record and refuse to read, and remove the journal's own lock file, which
    would stall every write for its 30 s grace period."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"{path}.lock")
    try:
        with open(path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                f.truncate(data.rfind(b"\n") + 1)
    except FileNotFoundError:
        pass


def driver_url(url: str) -> str:
    """The URL with a driver that is installed: a bare postgresql:// means psycopg (3) under
    SQLAlchemy 2.1 and psycopg2 under 2.0, and the `postgres` extra installs psycopg2."""
    from sqlalchemy.engine.url import make_url

    parsed = make_url(url)
    if parsed.drivername != "postgresql":
        return url
    try:
        parsed.get_dialect().import_dbapi()
        return url
    except ImportError:
        return parsed.set(drivername="postgresql+psycopg2").render_as_string(hide_password=False)


CONNECT_TIMEOUT_S = 10  # an unreachable database host fails in seconds, not minutes


# The DBAPI argument that bounds a connection attempt, per SQLAlchemy driver; others get none.
TIMEOUT_ARG = {
    "psycopg2": "connect_timeout",
    "psycopg": "connect_timeout",
    "pymysql": "connect_timeout",
    "mysqldb": "connect_timeout",
    "pg8000": "timeout",
}


def connect_args(url: str) -> dict[str, Any]:
    """The DBAPI arguments for an RDB URL: a connect timeout for a database server (psycopg2 and
    the MySQL drivers wait for the OS's TCP timeout otherwise), unless the URL sets one. Its
    name is the driver's: pg8000 calls it `timeout` and refuses `connect_timeout`."""
    from sqlalchemy.engine.url import make_url

    parsed = make_url(driver_url(url))
    arg = TIMEOUT_ARG.get(parsed.get_driver_name())
    if arg is None or arg in parsed.query:
        return {}
    return {arg: CONNECT_TIMEOUT_S}


def shown_url(url: str) -> str:
    """The URL for a message: the password masked."""
    from sqlalchemy.engine.url import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url


def storage_error(url: str, e: BaseException) -> UserError:
    """One line for a database that cannot be opened: the driver's own words (psycopg2:
    `connection to server at "h" (ip), port p failed: Connection refused`), without SQLAlchemy's
    trailer and the SQL it was running."""
    text = str(getattr(e, "orig", None) or e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    return UserError(f"sweep key storage: cannot open {shown_url(url)}: {first}")


def storage_engine(url: str) -> Any:
    """An engine that opens a connection per use (no pool to go stale in a long sweep)."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    return sqlalchemy.create_engine(
        driver_url(url), poolclass=NullPool, connect_args=connect_args(url)
    )


def ping_storage(url: str) -> None:
    """Connect once, before the sweep makes its dir, prepares data and measures peaks: a wrong
    host, port, password or database name stops it within CONNECT_TIMEOUT_S. Not a SQLite file:
    opening one creates it (its directory was checked with the spec)."""
    import sqlalchemy
    from sqlalchemy.engine.url import make_url

    if make_url(url).get_backend_name() == "sqlite":
        return
    engine = storage_engine(url)
    try:
        with engine.connect():
            pass
    except sqlalchemy.exc.SQLAlchemyError as e:
        raise storage_error(url, e) from None
    finally:
        engine.dispose()


def open_study(spec: SweepSpec, sweep_dir: Path):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        if spec.storage:
            storage = optuna.storages.RDBStorage(
                driver_url(spec.storage), engine_kwargs={"connect_args": connect_args(spec.storage)}
            )
        else:
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend

            storage = JournalStorage(JournalFileBackend(str(sweep_dir / JOURNAL)))
        return optuna.create_study(
            storage=storage,
            study_name=study_name(spec, sweep_dir),
            load_if_exists=True,
            direction="minimize" if spec.metric.goal == "min" else "maximize",
            sampler=make_sampler(spec),
            pruner=make_pruner(spec),
        )
    except Exception as e:
        if not spec.storage or type(e).__module__.split(".")[0] != "sqlalchemy":
            raise
        raise storage_error(spec.storage, e) from None


def close_study(study: Any) -> None:
    """Close the connections an RDB study's engine pooled: a sweep run from Python (`run_sweep`)
    would otherwise leave them open on the database server after it returns."""
    from optuna.storages import RDBStorage

    storage = getattr(study, "_storage", None)
    storage = getattr(storage, "_backend", storage)  # optuna wraps an RDBStorage in a cache
    if isinstance(storage, RDBStorage):
        storage.remove_session()
        storage.engine.dispose()
