"""`executor: ray` on one machine with nothing started by hand: the sweep starts a Ray of its own
(no `ray.address`), runs its trials there and stops it at the end; `address: auto` with no
cluster running is one line naming the key. Its own module: the cluster fixture of
test_ray_executor.py would otherwise be the running cluster these tests must not find."""

from __future__ import annotations

import shutil
import tempfile

import pytest

from smollab.errors import UserError
from smollab.lab.sweep.scheduler import run_sweep
from smollab.lab.sweep.spec_load import load_spec
from tests.lab.sweep.test_sweep import fake_spec, results


@pytest.fixture
def private_ray(monkeypatch):
    """Ray's files in a short private directory (its socket paths), and no cluster address."""
    tmp = tempfile.mkdtemp(prefix="smr", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", tmp)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def no_cluster_running() -> bool:
    import ray

    try:
        ray.init(address="auto", include_dashboard=False)
    except ConnectionError:
        return True
    ray.shutdown()
    return False


def test_a_sweep_starts_a_local_ray_and_stops_it(private_ray, fake_child, micro_data, tmp_path):
    import ray

    spec = fake_spec(
        tmp_path, micro_data, executor="ray", space={"optim.lr": [0.1, 0.2]}, concurrency=2
    )
    said: list[str] = []
    assert run_sweep(load_spec(spec), out=said.append) == {"completed": 2}
    assert [r["status"] for r in results(tmp_path / "sweep")] == ["completed", "completed"]
    assert any("ray: 2 trial slot(s)" in s and "started a local Ray" in s for s in said), said
    assert not ray.is_initialized()
    assert no_cluster_running()  # the sweep's Ray stopped with it


def test_address_auto_without_a_cluster_is_one_line(private_ray, fake_child, micro_data, tmp_path):
    spec = fake_spec(tmp_path, micro_data, executor="ray", ray={"address": "auto"})
    with pytest.raises(UserError) as e:
        run_sweep(load_spec(spec))
    msg = str(e.value)
    assert msg.startswith("sweep key ray.address: no Ray cluster at auto") and "\n" not in msg
    assert "leave ray.address out" in msg
    assert not (tmp_path / "sweep").exists()  # the dir the sweep made is gone again
