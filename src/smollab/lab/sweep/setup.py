"""What a sweep does once, before its first trial: the models its trials load checked, the sweep
dir's record of which sweep it holds (a rerun with another study is refused), and the data
prepared once for all trials."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from smollab.errors import UserError
from smollab.lab.sweep.spec import SweepSpec, resolve_config
from smollab.rundir.atomic import atomic_write_json, read_json
from smollab.rundir.runs import SWEEP_META


def check_models(spec: SweepSpec) -> None:
    """Every model the trials load can be found (`models.loading.check_model_source`), checked
    once per distinct `model` section before the sweep makes its dir: a missing base would
    otherwise fail every trial in turn. The grid's points, else the base with each listed value
    of the space and each enqueued point."""
    from smollab.models.loading import check_model_source

    if spec.sampler == "grid":
        points = spec.grid_points()
    else:
        listed = [{k: v} for k, vs in spec.space.items() if isinstance(vs, list) for v in vs]
        points = [{}, *spec.enqueue, *listed]
    seen: set[str] = set()
    for point in points:
        model = resolve_config(spec, point, spec.seeds[0]).model
        if (key := model.model_dump_json()) not in seen:
            seen.add(key)
            check_model_source(model)


def write_meta(
    sweep_dir: Path, spec: SweepSpec, concurrency: int, threads: int, device: str
) -> str:
    """Record the sweep in its dir; return the dir's owner id (made once, kept across reruns),
    which tells its trials from another parent's in a shared RDB study."""
    path = sweep_dir / SWEEP_META
    ident = spec.identity()
    old = read_json(path) if path.exists() else {}
    if old and old.get("identity") != ident:
        changed = [k for k in ident if (old.get("identity") or {}).get(k) != ident[k]]
        raise UserError(
            f"sweep dir {sweep_dir} holds a different sweep ({', '.join(changed)} "
            f"changed): use another dir= or remove it"
        )
    owner = old.get("owner") or f"{socket.gethostname()}:{uuid.uuid4().hex[:12]}"
    atomic_write_json(
        path,
        {
            "identity": ident,
            "owner": owner,
            "spec": spec.model_dump(mode="json"),
            "concurrency": concurrency,
            "threads": threads,
            "device": device,
            "updated": time.strftime("%Y-%m-%d %H:%M:%S"),
        },
    )
    return owner


def preflight_data(spec: SweepSpec, say: Callable[[str], None], out: Callable[[str], None]) -> None:
    """Prepare the data dir once here instead of in every child at the same time. A sweep over
    `data.` keys leaves it to each trial, whose data differ."""
    if spec.command not in ("pretrain", "grpo") or any(k.startswith("data.") for k in spec.space):
        return
    from smollab.data.prepare import ensure_prepared

    cfg = resolve_config(spec, {}, spec.seeds[0])
    said: list[str] = []

    def log(msg: str) -> None:  # the heading only when there is something to say
        if not said:
            say(f"data: preparing {cfg.data.dir} once for all trials")
            said.append(msg)
        out(f"  {msg}")

    ensure_prepared(cfg.data, exact=spec.command == "pretrain", log=log)
