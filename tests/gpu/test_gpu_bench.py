"""`smollab bench` on CUDA, pretraining and GRPO: every variant runs on the GPU, none is skipped
(the CUDA-only knobs apply here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from smollab.lab.bench.run import run_bench
from tests.gpu.marks import GPU, bf16_ok, compile_toolchain_missing

pytestmark = GPU

ROOT = Path(__file__).resolve().parents[2]


def bench(workload, overrides, knobs, tmp_path):
    knobs = knobs + (["bf16"] if bf16_ok() else [])
    result = run_bench(
        str(ROOT / workload),
        [*overrides, "perf.device=cuda"],
        knobs=knobs,
        steps=6,
        out=tmp_path / "bench",
        recheck=False,
        min_speedup=100.0,
        echo=lambda _: None,
    )
    assert result["baseline_ok"] and result["device"] == "cuda"
    assert result["skipped"] == []
    by = {r["variant"]: r for r in result["results"]}
    assert set(by) == {"baseline", *knobs}
    assert all(r["status"] == "ok" and r["step_s"] > 0 for r in by.values()), by
    return by


def test_bench_pretrain_on_cuda(micro_pretrain, tmp_path):
    bench(
        "configs/pretrain/simplestories-1.25m.yaml",
        micro_pretrain,
        ["tf32", "fused", "fp16"],
        tmp_path,
    )


def test_bench_compile_on_cuda(micro_pretrain, tmp_path):
    if why := compile_toolchain_missing():
        pytest.skip(why)
    bench("configs/pretrain/simplestories-1.25m.yaml", micro_pretrain, ["compile"], tmp_path)


def test_bench_grpo_on_cuda(micro_grpo, tmp_path):
    bench("configs/grpo/happy.yaml", micro_grpo, ["foreach", "completion_len"], tmp_path)
