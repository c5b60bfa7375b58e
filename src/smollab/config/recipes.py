"""The shipped recipes: YAML files inside the package (`smollab/configs/<dir>/<name>.yaml`), so a
wheel install has them too, found by name as well as by path.

A reference is resolved in this order:

1. a file that exists, relative to the working directory, is that file (your own copy wins);
2. `configs/<dir>/<name>.yaml`, the spelling the docs and the recipes' headers use, is the
   shipped file when no such path exists here, so it works from any directory once installed;
3. a bare name (`happy`, `happy.yaml`) or `<dir>/<name>` is the shipped recipe with that stem
   in the command's directories (`RECIPE_DIRS`); a stem is unique within a directory.

Only the file is found here: paths inside a recipe (`data.dir`, `model.path`, a sweep's `dir`)
keep meaning relative to the working directory, and a sweep or probe keeps its `base` as written,
because its children resolve the same reference the same way.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from smollab.errors import UserError

# The command that runs the recipes of each directory, and the directories a command's bare
# names are looked up in (the probe and bench also take training recipes as workloads).
COMMAND_OF_DIR = {
    "pretrain": "pretrain",
    "grpo": "grpo",
    "sft": "sft",
    "rft": "rft",
    "sweeps": "sweep",
    "probe": "probe",
}
RECIPE_DIRS: dict[str, tuple[str, ...]] = {
    "pretrain": ("pretrain",),
    "grpo": ("grpo",),
    "sft": ("sft",),
    "rft": ("rft",),
    "data": ("pretrain", "grpo"),
    "sweep": ("sweeps",),
    "probe": ("probe", "pretrain", "grpo", "sft"),
    "bench": ("pretrain", "grpo", "sft"),
}
SUFFIXES = (".yaml", ".yml")


def recipes_root() -> Path:
    """Where the shipped recipes live: `smollab/configs/`, in a checkout and in a wheel alike."""
    return Path(__file__).resolve().parent.parent / "configs"


@dataclass(frozen=True)
class Recipe:
    name: str  # the file stem: what `smollab <command> NAME` takes
    command: str  # the command that runs it
    path: Path
    header: str  # the first line's command, e.g. "smollab grpo configs/grpo/happy.yaml ..."


def _stem(p: Path) -> str:
    return p.stem


def list_recipes() -> list[Recipe]:
    """Every shipped recipe, by directory then name."""
    root, out = recipes_root(), []
    for d, command in COMMAND_OF_DIR.items():
        for p in sorted((q for q in (root / d).glob("*") if q.suffix in SUFFIXES), key=_stem):
            first = p.read_text().splitlines()[:1]
            header = first[0].lstrip("#").strip() if first and first[0].startswith("#") else ""
            out.append(Recipe(p.stem, command, p, header))
    return out


def recipe_making(run_dir: str | Path) -> Recipe | None:
    """The shipped training recipe whose `run.dir` is `run_dir` (the same path as written,
    relative to the working directory): the command that makes a model a recipe names."""
    import yaml

    want = Path(run_dir).expanduser()
    for r in list_recipes():
        if r.command not in ("pretrain", "grpo", "sft", "rft"):
            continue
        run = (yaml.safe_load(r.path.read_text()) or {}).get("run") or {}
        if isinstance(run.get("dir"), str) and Path(run["dir"]) == want:
            return r
    return None


def _is_name(ref: str) -> bool:
    """A bare name or `<dir>/<name>`: no deeper path, not absolute, not relative to `.`."""
    parts = Path(ref).parts
    return 1 <= len(parts) <= 2 and not ref.startswith(("/", ".", "~"))


def resolve_recipe(ref: str | Path, command: str | None = None) -> Path:
    """The file `ref` names for `command` (None: any directory). A path that names no file is
    returned as given, so the caller's own "not found" line names it; an unknown bare name is
    a UserError listing the names there are."""
    p = Path(ref)
    if p.is_file():  # a directory of that name (a run's, say) is not a recipe
        return p
    root, parts = recipes_root(), p.parts
    if len(parts) >= 2 and parts[0] == "configs":  # the documented spelling, from anywhere
        shipped = root.joinpath(*parts[1:])
        return shipped if shipped.is_file() else p
    text = str(ref)
    if not _is_name(text):
        return p
    stem = p.name
    for suffix in SUFFIXES:
        stem = stem.removesuffix(suffix)
    if len(parts) == 2:
        if parts[0] not in COMMAND_OF_DIR:
            return p
        dirs: tuple[str, ...] = (parts[0],)
    elif command is None:
        dirs = tuple(COMMAND_OF_DIR)
    else:
        dirs = RECIPE_DIRS.get(command, tuple(COMMAND_OF_DIR))
    hits = [f for d in dirs for f in (root / d / f"{stem}{s}" for s in SUFFIXES) if f.is_file()]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        where = ", ".join(f"configs/{h.relative_to(root)}" for h in hits)
        raise UserError(
            f"recipe {text}: more than one shipped recipe has that name ({where}); give its path"
        )
    if p.suffix in SUFFIXES and len(parts) == 1:
        return p  # `my.yaml` that is not here and not shipped: a missing file, as written
    names = [r.name for r in list_recipes() if r.path.parent.name in dirs]
    close = difflib.get_close_matches(stem, names, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]}? " if close else ""
    what = f"{command} recipe" if command else "recipe"
    raise UserError(
        f"{what} {text}: no such file and no shipped recipe of that name ({hint}"
        f"shipped: {', '.join(names) or 'none'}; `smollab recipes` lists them)"
    )
