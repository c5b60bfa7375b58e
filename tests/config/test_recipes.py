"""Shipped recipes: inside the wheel, found by name or by their documented path from any
directory, listed by `smollab recipes`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from smollab.cli import main
from smollab.config.load import load_config
from smollab.config.recipes import list_recipes, recipes_root, resolve_recipe
from smollab.errors import UserError
from smollab.lab.probe.spec import load_probe
from smollab.lab.sweep.spec_load import load_spec

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.relative_to(recipes_root()).as_posix() for p in recipes_root().rglob("*.yaml"))


def test_the_repo_root_configs_is_the_package_copy():
    """One copy of the recipes: the checkout's configs/ is the package's (the docs' paths)."""
    assert (ROOT / "configs").resolve() == recipes_root()
    assert len(SHIPPED) >= 15 and "grpo/happy.yaml" in SHIPPED


def test_the_wheel_carries_every_recipe(tmp_path):
    """Build the wheel offline from a copy of the project (the checkout stays clean)."""
    pytest.importorskip("setuptools", reason="the dev extra installs setuptools")
    src = tmp_path / "project"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "src", src / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )
    out = tmp_path / "wheel"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = out.glob("smollab-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f for f in SHIPPED if f"smollab/configs/{f}" not in names]
    assert not missing, missing
    assert "smollab/config/recipes.py" in names and "smollab/api.py" in names


@pytest.mark.parametrize(
    "ref, command, expected",
    [
        ("happy", "grpo", "grpo/happy.yaml"),
        ("happy.yaml", "grpo", "grpo/happy.yaml"),
        ("grpo/happy", None, "grpo/happy.yaml"),
        ("configs/grpo/happy.yaml", "grpo", "grpo/happy.yaml"),
        ("simplestories-1.25m", "pretrain", "pretrain/simplestories-1.25m.yaml"),
        ("lr-1.25m", "sweep", "sweeps/lr-1.25m.yaml"),
        ("pretrain-micro", "probe", "probe/pretrain-micro.yaml"),
        (
            "simplestories-1.25m",
            "probe",
            "pretrain/simplestories-1.25m.yaml",
        ),  # a training workload
        ("happy", "bench", "grpo/happy.yaml"),
    ],
)
def test_names_and_documented_paths_resolve_from_any_directory(
    ref, command, expected, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # no configs/ here: only the package's copy can answer
    assert resolve_recipe(ref, command) == recipes_root() / expected


def test_a_path_that_exists_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("happy").write_text("optim: {lr: 0.5}\n")
    assert resolve_recipe("happy", "grpo") == Path("happy")
    assert load_config("grpo", "happy").optim.lr == 0.5
    own = tmp_path / "configs" / "grpo"
    own.mkdir(parents=True)
    (own / "happy.yaml").write_text("optim: {lr: 0.25}\n")
    assert load_config("grpo", "configs/grpo/happy.yaml").optim.lr == 0.25


def test_a_directory_of_that_name_does_not_hijack_the_recipe(tmp_path, monkeypatch):
    """`happy/` (a run directory, say) in the working directory is not a recipe file."""
    monkeypatch.chdir(tmp_path)
    Path("happy").mkdir()
    (tmp_path / "configs" / "grpo" / "happy.yaml").mkdir(parents=True)
    assert resolve_recipe("happy", "grpo") == recipes_root() / "grpo/happy.yaml"
    assert resolve_recipe("configs/grpo/happy.yaml", "grpo") == recipes_root() / "grpo/happy.yaml"
    shipped = load_config("grpo", str(recipes_root() / "grpo/happy.yaml"))
    assert load_config("grpo", "happy") == shipped


def test_unknown_names_are_one_line_naming_what_there_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        load_config("grpo", "hapy")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("grpo recipe hapy:") and "did you mean happy?" in msg
    with pytest.raises(UserError, match="config file not found: configs/grpo/nope.yaml"):
        load_config("grpo", "configs/grpo/nope.yaml")
    with pytest.raises(UserError, match="config file not found: mine.yaml"):
        load_config("pretrain", "mine.yaml")
    with pytest.raises(UserError, match="pretrain recipe happy: no such file"):
        load_config("pretrain", "happy")  # a grpo recipe is not a pretrain name


def test_the_commands_take_names_and_paths_inside_stay_relative(tmp_path, monkeypatch):
    """The recipe is found in the package; runs/ and data/ it names stay under the cwd."""
    monkeypatch.chdir(tmp_path)
    cfg = load_config("grpo", "happy")
    assert cfg.model.path == "runs/simplestories-1.25m" and not Path(cfg.model.path).is_absolute()
    spec = load_spec("lr-micro")  # the sweep's directory comes from its name, under the cwd
    assert spec.dir == str(Path("sweeps") / "lr-micro")
    probe, _ = load_probe("pretrain-1.25m", [])
    assert probe.base == "configs/pretrain/simplestories-1.25m.yaml"  # as written; children
    assert probe.dir == str(Path("probes") / "pretrain-1.25m")  # resolve it the same way
    assert not any(tmp_path.iterdir())  # loading wrote nothing


def test_smollab_recipes_lists_every_recipe_with_its_first_line(capsys):
    assert main(["recipes"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["name", "command", "first", "line"]
    rows = {  # by command and name: a name may repeat in another command's directory
        tuple(line.split()[1::-1]): line.split(None, 2) for line in out[1:] if line and "  " in line
    }
    recipes = list_recipes()
    assert len(recipes) == len(SHIPPED)
    for r in recipes:
        name, command, header = rows[(r.command, r.name)]
        assert command == r.command and header == r.header
        assert header.startswith(f"smollab {r.command} configs/")
    assert rows[("grpo", "happy")][2] == (
        "smollab grpo configs/grpo/happy.yaml model.path=runs/simplestories-1.25m"
    )
    # a name is unique within its command's directory
    per_dir = [(r.command, r.name) for r in recipes]
    assert len(per_dir) == len(set(per_dir))


@pytest.mark.parametrize("name", [s for s in SHIPPED if s.startswith(("sweeps/", "probe/"))])
def test_every_shipped_sweep_and_probe_recipe_loads(name, tmp_path, monkeypatch):
    """The spec validates whole (keys, space, executor and lanes rules) from any directory."""
    monkeypatch.chdir(tmp_path)
    path = str(recipes_root() / name)
    if name.startswith("sweeps/"):
        assert load_spec(path).total_runs() > 0
    else:
        assert load_probe(path, [])[0].command
    assert not any(tmp_path.iterdir())
