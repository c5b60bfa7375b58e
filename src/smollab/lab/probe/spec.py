"""A probe recipe (`ProbeSpec`) and how `smollab probe WORKLOAD key=value ...` is read into one."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator

from smollab.errors import UserError
from smollab.lab.spec_common import (
    SpecSection,
    Start,
    coerce,
    error_line,
    flatten,
    override_value,
)


class ProbeSpec(SpecSection):
    command: str = Field("pretrain", description="the workload's command: pretrain, grpo or sft")
    base: str | None = Field(None, description="the workload's recipe")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="dotted config keys every run sets, over base"
    )
    ks: list[int] | None = Field(None, description="explicit k to try; default 1, 2, 4, ... max_k")
    max_k: int = Field(32, ge=1, description="most runs at once: k = 1, 2, 4, ... up to this")
    lanes: list[int] | None = Field(
        None,
        description="grpo: lane counts to measure beside the process counts, each as "
        "one `smollab lanes grpo` process (e.g. [1, 2, 4, 8])",
    )
    lane_workers: list[int] = Field(
        [1],
        description="with lanes: each lane count N also as W concurrent `smollab lanes grpo` "
        "processes of N lanes each, the probe's threads split among them (e.g. [1, 2])",
    )
    warmup: int = Field(5, ge=0, description="logged steps each run takes before measuring")
    steps: int = Field(20, ge=3, description="steps measured per run while all k run")
    drop: float = Field(
        0.1,
        gt=0,
        lt=1,
        description="stop when aggregate throughput falls this fraction below the best",
    )
    latency_tolerance: float = Field(
        0.1, ge=0, description="best_latency: step time within this of k=1"
    )
    mem_fraction: float = Field(
        0.9, gt=0, le=1, description="stop before a level needing more than this share of memory"
    )
    bisect: bool = Field(
        False, description="also try k between the last good and the first bad level"
    )
    split: bool = Field(
        True,
        description="CPU: for k below the thread count, also try 1 thread "
        "per run (k x 1 next to k x threads/k)",
    )
    threads: int | None = Field(None, ge=1, description="CPU threads to divide (default: all)")
    mps: bool | Literal["auto"] = Field(
        "auto", description="CUDA: share the GPU through the NVIDIA MPS daemon (auto: on)"
    )
    timeout_s: float = Field(300.0, gt=0, description="seconds each level may take")
    start: Start = "auto"
    dir: str | None = Field(None, description="the probe directory (default probes/<workload>)")
    cache: bool = Field(True, description="keep the result for `concurrency: auto` sweeps")

    @field_validator("ks", "lanes", "lane_workers")
    @classmethod
    def _check_ks(cls, ks: list[int] | None, info: ValidationInfo) -> list[int] | None:
        what = {"ks": "k", "lanes": "lane count"}.get(info.field_name, "worker count")
        if ks is None:
            return None
        if not ks:
            raise ValueError(f"give at least one {what}, or leave {info.field_name} out")
        if min(ks) < 1:
            raise ValueError(f"every {what} must be at least 1, got {min(ks)}")
        if len(set(ks)) != len(ks):
            raise ValueError(f"repeated {what} in {ks}")
        return sorted(ks)


def load_probe(workload: str, overrides: list[str]) -> tuple[ProbeSpec, list[str]]:
    """WORKLOAD is a probe recipe (has `command:`) or a training config. `key=value` whose key is
    a probe setting (steps=10, max_k=8, bisect=true) sets the probe; others go to the workload."""
    from smollab.config.load import guess_command, read_yaml
    from smollab.config.recipes import resolve_recipe

    tree = read_yaml(resolve_recipe(workload, "probe"))
    if "command" in tree:
        spec_tree = dict(tree)
    else:
        spec_tree = {"command": guess_command(tree), "base": workload}
    if "overrides" in spec_tree and not isinstance(spec_tree["overrides"], dict):
        got = spec_tree["overrides"]
        raise UserError(
            f"probe key overrides: expected a mapping of config keys "
            f"(train.batch_size: 8), got {type(got).__name__} {got!r}"[:300]
        )
    spec_tree["overrides"] = coerce(flatten(spec_tree.get("overrides") or {}))
    work: list[str] = []
    from smollab.config.load import parse_override

    for item in overrides:
        key, value = parse_override(item)
        if key == "overrides" and not isinstance(value, dict):
            raise UserError(
                f"probe key overrides: expected a mapping, got {value!r}; "
                f"give overrides.KEY=VALUE or the config's KEY=VALUE"
            )
        if key.startswith("overrides."):
            spec_tree.setdefault("overrides", {})[key.removeprefix("overrides.")] = coerce(value)
        elif key in ProbeSpec.model_fields or "." not in key:
            spec_tree[key] = coerce(value)  # an unknown plain key is reported as a probe key
        else:
            work.append(item)
    for key in spec_tree:
        if key not in ProbeSpec.model_fields:
            import difflib

            close = difflib.get_close_matches(key, list(ProbeSpec.model_fields), n=1)
            raise UserError(
                f"unknown probe key {key}" + (f" (did you mean {close[0]}?)" if close else "")
            )
    try:
        spec = ProbeSpec.model_validate(spec_tree)
    except ValidationError as err:
        raise UserError(error_line(err, "probe")) from None
    from smollab.lab.start import check

    check(spec.start, "probe key start")
    if spec.base and not resolve_recipe(spec.base, spec.command).is_file():
        raise UserError(f"probe key base: file not found: {spec.base}")
    if spec.ks and spec.ks[-1] > spec.max_k:
        raise UserError(
            f"probe key ks: {spec.ks[-1]} is above max_k ({spec.max_k}); raise max_k or drop it"
        )
    if spec.dir and Path(spec.dir).exists() and not Path(spec.dir).is_dir():
        raise UserError(f"probe key dir: {spec.dir} exists and is not a directory")
    from smollab.config.load import load_config
    from smollab.config.registry import SCHEMAS

    if spec.command not in SCHEMAS or spec.command == "data":
        raise UserError(f"probe key command: {spec.command!r} is not a training command")
    if spec.command == "rft":
        raise UserError(
            "probe key command: rft's unit is a round (sample, SFT, evaluate), not "
            "an optimizer step; probe a round's SFT with command sft"
        )
    base_overrides = [f"{k}={override_value(v)}" for k, v in spec.overrides.items()] + work
    cfg = load_config(spec.command, spec.base, base_overrides)  # validate now, before any launch
    if spec.lane_workers != [1] and not spec.lanes:
        raise UserError(
            "probe key lane_workers: set it with lanes: [...] (the lane counts each "
            "of the W processes runs)"
        )
    if spec.lanes and spec.command != "grpo":
        raise UserError(f"probe key lanes: lanes train grpo runs only, not {spec.command}")
    if spec.lanes:
        from smollab.config.lanes import check_supported
        from smollab.config.load import to_dict

        try:
            check_supported(flatten(to_dict(cfg)), "of this probe")
        except UserError as e:
            raise UserError(f"probe key lanes: {e}") from None
    if spec.dir is None:
        spec.dir = str(Path("probes") / Path(workload).stem)
    return spec, base_overrides
