"""`executor: ray` on a real two-raylet Ray cluster on this machine: the same results.csv as the
local executor on the same spec (real micro trials, then fake children that complete, are pruned,
fail and diverge), the spec's keys, and a parent SIGKILLed mid-sweep resuming like a local one."""

from __future__ import annotations

import csv
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import yaml

from smollab.errors import UserError
from smollab.lab.children import pid_alive
from smollab.lab.sweep.ray_executor import RayChild, trial_gpus
from smollab.lab.sweep.scheduler import run_sweep
from smollab.lab.sweep.spec_load import load_spec
from tests.lab.sweep.test_sweep import (
    child_pids,
    fake_spec,
    launches,
    micro_overrides,
    results,
    start_parent,
    wait_for,
    write_spec,
)

TIMING = {"wall_s", "start_s"}  # columns that differ from run to run
PRUNED_AT = re.compile(r" at step \d+: \S+ \S+")


@pytest.fixture(scope="module")
def ray_cluster():
    """Two raylets of one CPU each (a head and a worker node), this module's only; its temp dir
    is short (Ray's socket paths) and private (RAY_TMPDIR: no /tmp/ray shared with others)."""
    from ray.cluster_utils import Cluster

    tmp = tempfile.mkdtemp(prefix="smr", dir="/tmp")
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_TMPDIR", tmp)
    cluster = Cluster(
        initialize_head=True,
        connect=False,
        head_node_args={"num_cpus": 1, "include_dashboard": False},
    )
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()
        mp.undo()
        shutil.rmtree(tmp, ignore_errors=True)


def on_ray(spec_path, address: str, sweep_dir) -> object:
    """The same spec file, with the Ray executor and another sweep dir."""
    tree = yaml.safe_load(spec_path.read_text())
    tree.update(executor="ray", ray={"address": address, "cpu": 1}, dir=str(sweep_dir))
    tree.pop("threads", None)  # refused with Ray: a trial's threads are its ray.cpu
    out = spec_path.with_name("ray_" + spec_path.name)
    out.write_text(yaml.safe_dump(tree, sort_keys=False))
    return out


def same_results(local: list[dict], ray: list[dict], metric: str, loose: set[str] = frozenset()):
    """Row by row: every column equal except timings, the metric within 1e-4, and the `loose`
    trials' steps and pruning step (when a SIGINT lands is up to the clock)."""
    assert len(local) == len(ray) and local
    for a, b in zip(local, ray, strict=True):
        pruned = a["status"] == "pruned"
        for k in a:
            if k in TIMING or (pruned and k == "steps"):
                continue
            if k == metric and a[k]:
                assert float(a[k]) == pytest.approx(float(b[k]), rel=1e-4, abs=1e-4), (k, a, b)
            elif pruned and k == "reason":  # "... at step 7: train_loss 4.997 above ..."
                assert PRUNED_AT.sub("", a[k]) == PRUNED_AT.sub("", b[k]), (a[k], b[k])
            else:
                assert a[k] == b[k], (k, a, b)


def test_real_micro_trials_give_the_local_results(ray_cluster, micro_pretrain, tmp_path, capsys):
    spec = write_spec(
        tmp_path / "lr.yaml",
        command="pretrain",
        overrides=micro_overrides(micro_pretrain),
        space={"optim.lr": [1e-2]},
        metric={"name": "val_loss", "goal": "min"},
        concurrency=1,
        threads=1,
        dir=str(tmp_path / "local"),
    )
    assert run_sweep(load_spec(spec)) == {"completed": 1}
    ray_spec = on_ray(spec, ray_cluster, tmp_path / "ray")
    assert run_sweep(load_spec(ray_spec)) == {"completed": 1}
    same_results(results(tmp_path / "local"), results(tmp_path / "ray"), "val_loss")
    out = capsys.readouterr().out
    assert "ray: 1 trial slot(s) of 1 CPU, 0 GPU" in out
    (row,) = results(tmp_path / "ray")
    assert "perf.threads=1" in (tmp_path / "ray" / row["run_dir"] / "child.log").read_text()
    rows = [
        list(csv.DictReader(open(d / row["run_dir"] / "metrics.csv")))
        for d in (tmp_path / "local", tmp_path / "ray")
    ]
    assert [r["step"] for r in rows[0]] == [r["step"] for r in rows[1]] and len(rows[0]) >= 4
    for name in ("train_loss", "val_loss"):  # every logged value, not only the final metric
        local, ray = ([float(r[name]) for r in rs if r[name]] for rs in rows)
        assert local and local == pytest.approx(ray, abs=1e-5)


def test_pruned_and_failed_trials_are_recorded_as_locally(
    ray_cluster, fake_child, micro_data, tmp_path
):
    """lr 0.1 completes, 1e-4 stays above the threshold (pruned by SIGINT), 100 raises (failed),
    20 turns nan (diverged)."""
    spec = fake_spec(
        tmp_path,
        micro_data,
        space={"optim.lr": [0.1, 1e-4, 100, 20]},
        overrides={"train.max_steps": 100},
        dir=str(tmp_path / "local"),
        pruner={"type": "threshold", "metric": "train_loss", "upper": 4.9, "n_warmup_steps": 3},
    )
    want = {"completed": 1, "pruned": 1, "failed": 1, "diverged": 1}
    assert run_sweep(load_spec(spec)) == want
    assert run_sweep(load_spec(on_ray(spec, ray_cluster, tmp_path / "ray"))) == want
    local, ray = results(tmp_path / "local"), results(tmp_path / "ray")
    same_results(local, ray, "val_loss")
    by_status = {r["status"]: r for r in ray}
    assert "boom at lr 100" in by_status["failed"]["reason"]
    assert "above the upper bound 4.9" in by_status["pruned"]["reason"]
    assert int(by_status["pruned"]["steps"]) < 100  # stopped by the SIGINT, not run out
    pruned_log = (tmp_path / "ray" / by_status["pruned"]["run_dir"] / "summary.json").read_text()
    assert '"pruned"' in pruned_log


def test_a_killed_parent_resumes_on_ray(ray_cluster, fake_child, micro_data, tmp_path):
    """SIGKILL the sweep: Ray ends its actors, their children die, and a rerun finishes the sweep
    with each metrics row exactly once, as locally (tests/lab/sweep/test_sweep.py)."""
    spec = fake_spec(
        tmp_path,
        micro_data,
        space={"optim.lr": [0.1, 0.2, 0.3]},
        overrides={"train.max_steps": 300},
        executor="ray",
        ray={"address": ray_cluster},
    )
    d = tmp_path / "sweep"
    parent = start_parent(fake_child, spec, {})
    wait_for(
        lambda: (
            any(r["status"] == "running" for r in results(d))
            if (d / "results.csv").exists() and child_pids(d)
            else False
        ),
        timeout=120,
    )
    wait_for(lambda: all((p / "metrics.csv").exists() for p in child_pids(d)))
    pids = child_pids(d)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    for run_dir, pid in pids.items():
        wait_for(lambda pid=pid, run_dir=run_dir: not pid_alive(pid, str(run_dir)), timeout=60)
    assert run_sweep(load_spec(spec)) == {"completed": 3}
    for r in results(d):
        steps = [ln.split(",")[0] for ln in (d / r["run_dir"] / "metrics.csv").read_text().split()]
        assert steps[1:] == [str(i) for i in range(1, 301)]  # each row once, resumed or not
    assert [launches(p) for p in pids] == [2] * len(pids)  # killed while running: resumed


def test_a_lost_actor_fails_its_trial_and_its_slot_is_replaced(
    ray_cluster, fake_child, micro_data, tmp_path, monkeypatch
):
    """A node or worker lost mid-trial: the trial is recorded failed, naming it, and the next trial
    runs on a fresh actor in the slot."""
    import ray

    from smollab.lab.sweep import ray_executor

    spec = fake_spec(
        tmp_path,
        micro_data,
        space={"optim.lr": [0.1, 0.2]},
        concurrency=1,
        overrides={"train.max_steps": 300},
        executor="ray",
        ray={"address": ray_cluster},
    )
    launched: list = []
    real_launch = ray_executor.RayExecutor.launch

    def launch(self, *a, **kw):
        child = real_launch(self, *a, **kw)
        if not launched:  # the first trial: its actor dies once it has logged a step
            metrics = child.run_dir / "metrics.csv"
            threading.Thread(
                target=lambda: wait_for(metrics.exists) and ray.kill(child.slot.actor), daemon=True
            ).start()
        launched.append(child)
        return child

    monkeypatch.setattr(ray_executor.RayExecutor, "launch", launch)
    assert run_sweep(load_spec(spec)) == {"failed": 1, "completed": 1}
    first, second = results(tmp_path / "sweep")
    assert first["status"] == "failed" and "the Ray actor running this trial" in first["reason"]
    assert launched[0].slot is not launched[1].slot and launched[1].slot.node != "?"
    assert second["status"] == "completed" and second["steps"] == "300"


def test_a_trial_on_ray_gets_its_slots_threads_even_alone(fake_child, micro_data, tmp_path):
    """Locally the last trial takes every free thread; on Ray it has only what its slot reserves."""
    from types import SimpleNamespace

    from smollab.lab.sweep.scheduler import Sweep
    from smollab.lab.sweep.trials import NextTrial

    argvs: list[list[str]] = []
    sweep = Sweep(load_spec(fake_spec(tmp_path, micro_data, concurrency=2)), out=lambda _: None)
    sweep.concurrency, sweep.total_threads = 2, 2
    sweep.trials = SimpleNamespace(
        run_dir=lambda name: tmp_path / name,
        remaining=lambda: 0,
        study=SimpleNamespace(study_name="s"),
    )

    class Slot:  # the RayExecutor's part the scheduler uses
        trial_threads = 1

        def launch(self, name, argv, run_dir, threads=None, **kw):
            argvs.append(argv)
            return RayChild(name, run_dir, threads, pid=1, slot=None)

    sweep.executor = Slot()
    sweep._launch(NextTrial(SimpleNamespace(user_attrs={}), "last", {"optim.lr": 0.1}, 0))
    assert [a for a in argvs[0] if a.startswith("perf.threads=")] == ["perf.threads=1"]


def test_ray_keys(micro_data, tmp_path, monkeypatch):
    spec = fake_spec(tmp_path, micro_data, ray={"cpu": 2})
    with pytest.raises(UserError, match="sweep key ray: set only with executor: ray"):
        load_spec(spec)
    spec = fake_spec(tmp_path, micro_data, executor="ray", mps=True)
    with pytest.raises(UserError, match="sweep key mps: not with executor: ray"):
        load_spec(spec)
    spec = fake_spec(tmp_path, micro_data, executor="ray", threads=4)
    with pytest.raises(UserError, match=r"sweep key threads: not with executor: ray .*ray\.cpu"):
        load_spec(spec)
    spec = fake_spec(tmp_path, micro_data, executor="ray", ray={"gpu": 0.5})
    loaded = load_spec(spec)
    assert loaded.ray.address is None and loaded.ray.cpu == 1  # a local Ray of its own
    assert trial_gpus(loaded, 4, "cuda") == 0.5
    loaded.ray.gpu = None
    assert trial_gpus(loaded, 4, "cuda") == 0.25 and trial_gpus(loaded, 4, "cpu") == 0
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "ray" else real(n, *a)
    )
    with pytest.raises(UserError, match=r"pip install 'smollab\[ray\]'"):
        load_spec(spec)


def test_the_local_executor_never_imports_ray(micro_data, tmp_path):
    """`import ray` costs seconds and the package is an extra: only `executor: ray` loads it."""
    spec = fake_spec(tmp_path, micro_data)
    code = (
        "import sys; from smollab.cli import main; import smollab.lab.sweep.scheduler; "
        f"main(['sweep', {str(spec)!r}, '--dry-run']); "
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "executor: local" in done.stdout


def test_an_idle_dead_actor_or_a_slow_launch_hands_the_trial_to_a_fresh_slot(
    ray_cluster, fake_child, micro_data, tmp_path, monkeypatch
):
    """Before the second trial its idle slot's actor dies; the third's launch call does not
    answer in time (it did start the child, which is stopped first). Neither aborts the sweep,
    neither trial is lost, and the third's metrics have each step once."""
    import ray

    from smollab.lab.sweep import ray_executor

    spec = fake_spec(
        tmp_path,
        micro_data,
        space={"optim.lr": [0.1, 0.2, 0.3]},
        concurrency=1,
        overrides={"train.max_steps": 20},
        executor="ray",
        ray={"address": ray_cluster},
    )
    names: list[str] = []
    slow: list[int] = []

    def actor_dies(actor, calls: int = 20) -> bool:
        """ray.kill is asynchronous: a call may still be answered before the actor is gone."""
        for _ in range(calls):
            try:
                ray.get(actor.ready.remote(), timeout=30)
            except ray.exceptions.RayActorError:
                return True
            time.sleep(0.1)
        return False

    real_launch, real_get = ray_executor.RayExecutor.launch, ray.get

    def launch(self, name, *a, **kw):
        names.append(name)
        if len(names) == 2:
            (slot,) = self.slots
            ray.kill(slot.actor)
            assert actor_dies(slot.actor)
        if len(names) == 3:
            slow.append(1)  # its first call (the launch) returns, then says it timed out
        return real_launch(self, name, *a, **kw)

    def get(*a, **kw):
        out = real_get(*a, **kw)
        if slow:
            slow.clear()
            raise ray.exceptions.GetTimeoutError("slow")
        return out

    monkeypatch.setattr(ray_executor.RayExecutor, "launch", launch)
    monkeypatch.setattr(ray, "get", get)
    lines: list[str] = []
    assert run_sweep(load_spec(spec), out=lines.append) == {"completed": 3}
    out = "\n".join(lines)
    assert f"died (ActorDiedError) before trial {names[1]} started" in out
    assert f"did not start trial {names[2]} in 30 s" in out
    d = tmp_path / "sweep" / "trials" / names[2]
    steps = [ln.split(",")[0] for ln in (d / "metrics.csv").read_text().split()]
    assert steps[1:] == [str(i) for i in range(1, 21)]
    assert launches(d) == 2


def test_a_slot_ray_cannot_place_again_leaves_the_sweep_running(
    ray_cluster, fake_child, micro_data, tmp_path, monkeypatch
):
    """A node lost on a full cluster: the second trial's actor dies and no fresh one can be placed
    (here: it asks for 64 CPUs). The first trial runs on, the third waits for its slot, and the
    sweep ends normally (it once blocked on Ray, then killed every slot)."""
    import ray

    from smollab.lab.sweep import ray_executor

    spec = fake_spec(
        tmp_path,
        micro_data,
        space={"optim.lr": [0.1, 0.2, 0.3]},
        concurrency=2,
        overrides={"train.max_steps": 300},
        executor="ray",
        ray={"address": ray_cluster},
    )
    real_init, real_launch = ray_executor.RayExecutor.__init__, ray_executor.RayExecutor.launch
    launched: list = []

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        self._remote = ray.remote(ray_executor.TrialSlot).options(num_cpus=64)
        monkeypatch.setattr(ray_executor, "START_TIMEOUT_S", 2.0)

    def launch(self, *a, **kw):
        child = real_launch(self, *a, **kw)
        if len(launched) == 1:  # the second trial: its actor dies once it has logged a step
            metrics = child.run_dir / "metrics.csv"
            threading.Thread(
                target=lambda: wait_for(metrics.exists) and ray.kill(child.slot.actor), daemon=True
            ).start()
        launched.append(child)
        return child

    monkeypatch.setattr(ray_executor.RayExecutor, "__init__", init)
    monkeypatch.setattr(ray_executor.RayExecutor, "launch", launch)
    lines: list[str] = []
    assert run_sweep(load_spec(spec), out=lines.append) == {"completed": 2, "failed": 1}
    assert "a fresh actor takes its place once Ray can place it" in "\n".join(lines)
    by_dir = {tmp_path / "sweep" / r["run_dir"]: r for r in results(tmp_path / "sweep")}
    assert by_dir[launched[1].run_dir]["status"] == "failed"
    assert launched[2].slot is launched[0].slot  # the first trial's, once it finished


def test_a_slot_that_cannot_start_and_a_gpu_cluster_seen_from_a_cpu_driver(
    ray_cluster, fake_child, micro_data, tmp_path, monkeypatch
):
    """One line each, and no Ray connection left behind: a node without the sweep's directory
    (the actor's constructor fails there), and GPUs in the cluster with no ray.gpu and no CUDA
    here (zero-GPU actors would see every GPU of their node)."""
    import os

    import ray

    from smollab.lab.sweep.ray_executor import RayExecutor

    spec = load_spec(fake_spec(tmp_path, micro_data, executor="ray", ray={"address": ray_cluster}))
    missing = str(tmp_path / "not-on-that-node")
    real_getcwd = os.getcwd
    monkeypatch.setattr(os, "getcwd", lambda: missing)
    with pytest.raises(UserError) as e:
        RayExecutor(spec, 1, "cpu", say=lambda _: None)
    assert re.fullmatch(
        rf"sweep key executor: ray: node \S+ has no directory {missing} "
        r"\(No such file or directory\); every node must see .*",
        str(e.value),
    )
    assert not ray.is_initialized()
    monkeypatch.setattr(os, "getcwd", real_getcwd)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0, "GPU": 2.0})
    with pytest.raises(UserError, match=r"^sweep key ray\.gpu: the cluster has 2 GPU\(s\)"):
        RayExecutor(spec, 1, "cpu", say=lambda _: None)
    assert not ray.is_initialized()
    spec.ray.gpu = 0.0  # an explicit share is honoured
    RayExecutor(spec, 1, "cpu", say=lambda _: None).close()


def test_reap_stale_waits_for_a_child_on_another_host(tmp_path, monkeypatch):
    """Its pid means nothing here: wait its grace and a margin (once per process), never signal
    a local process that has the pid."""
    import os

    from smollab.lab import children

    slept: list[float] = []
    monkeypatch.setattr(children.time, "sleep", slept.append)
    monkeypatch.setattr(children, "_first_stale", None)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / ".child.pid").write_text(f"{os.getpid()}\nanother-node\n")
    assert children.reap_stale(tmp_path / "a", 5.0) is True
    assert slept and 14 < slept[0] <= 15  # 5 s grace + the 10 s margin
    assert not (tmp_path / "a" / ".child.pid").exists()
    assert children.reap_stale(tmp_path / "b", 5.0) is True and len(slept) == 2
    (tmp_path / "a" / ".child.pid").write_text(f"{os.getpid()}\n{children.socket.gethostname()}\n")
    assert children.reap_stale(tmp_path / "a", 5.0) is False  # here: not a child in that dir
