"""`smollab probe` on CUDA at k = 1, 2 with real children, without and with the MPS daemon (the
runs must attach to it as clients)."""

from __future__ import annotations

import shutil

import pytest

from smollab.lab.mps import CONTROL
from smollab.lab.probe.run import run_probe
from smollab.lab.probe.spec import ProbeSpec
from tests.conftest import MICRO_DATA
from tests.gpu.marks import GPU

pytestmark = GPU


@pytest.mark.parametrize("mps", [False, True], ids=["time-sliced", "mps"])
def test_probe_on_cuda(mps, micro_data, tmp_path, monkeypatch):
    if mps and shutil.which(CONTROL) is None:
        pytest.skip(f"{CONTROL} not found: no CUDA MPS daemon on this machine")
    monkeypatch.setenv("SMOLLAB_CACHE_DIR", str(tmp_path / "cache"))
    overrides = [
        "model.preset=micro",
        f"data.dir={micro_data}",
        *MICRO_DATA,
        "train.batch_size=8",
        "train.seq_len=64",
        "perf.device=cuda",
    ]
    spec = ProbeSpec(
        command="pretrain",
        ks=[1, 2],
        max_k=2,
        warmup=2,
        steps=5,
        split=False,
        cache=False,
        mps=mps,
        timeout_s=180,
        dir=str(tmp_path / "probe"),
    )
    said: list[str] = []
    result = run_probe(spec, overrides, out=said.append)
    assert result["device"]["kind"] == "cuda"
    levels = {lv["k"]: lv for lv in result["levels"]}
    assert set(levels) == {1, 2}
    for lv in levels.values():
        assert lv["error"] is None and lv["steps_per_s"] > 0 and lv["peak_mem_mb"] > 0, said
    used = result["mps_daemon"]["used"]
    assert result["workload"]["mps_daemon"] is used  # cached under the regime measured
    if mps and not used:  # the levels ran time-sliced: nothing of MPS to check
        pytest.skip("the MPS control daemon could not start here: " + " | ".join(said[:3]))
    if not mps and used:
        pytest.skip("an MPS daemon runs on this machine: no time-sliced probe is possible")
    if mps:
        assert levels[2]["mps"] == {"attached": 2, "missing": []}, said
    else:
        assert levels[2]["mps"] is None
