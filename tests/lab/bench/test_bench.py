"""`smollab bench`: knob plumbing, skip rules, the report writer, and one real tiny bench."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from smollab.config.load import guess_command, load_config
from smollab.errors import UserError
from smollab.lab.bench import knobs as bench_knobs
from smollab.lab.bench import measure as bench_measure
from smollab.lab.bench import report as bench_report
from smollab.lab.bench import run as bench

ROOT = Path(__file__).resolve().parents[3]
PRETRAIN = ROOT / "configs/pretrain/simplestories-1.25m.yaml"
GRPO = ROOT / "configs/grpo/happy.yaml"


def _pretrain_cfg():
    return load_config("pretrain", PRETRAIN, [])


def test_baseline_switches_every_benched_knob_off():
    cfg = _pretrain_cfg()
    names = bench_knobs.select(None, "pretrain")
    assert "completion_len" not in names and "reward_workers" not in names
    base = bench_knobs.baseline_values(names, "pretrain", cfg)
    assert base["perf.precision"] == "fp32" and base["perf.optimizer_impl"] == "plain"
    assert base["perf.tf32"] is False and base["perf.compile"] is False
    assert base["perf.attn_implementation"] == "eager" and base["perf.grad_checkpointing"] is False
    assert bench_knobs.as_overrides({"perf.tf32": False, "train.max_time": None}) == [
        "perf.tf32=false",
        "train.max_time=null",
    ]
    # only the knobs asked for are forced off
    assert bench_knobs.baseline_values(["bf16"], "pretrain", cfg) == {"perf.precision": "fp32"}


def test_pretrain_plan_on_cpu():
    cfg = _pretrain_cfg()
    runs, skipped = bench_knobs.plan(bench_knobs.select(None, "pretrain"), "pretrain", cfg, "cpu")
    runs, skipped = dict(runs), dict(skipped)
    assert runs["bf16"] == {"perf.precision": "bf16"} and runs["fp16"] == {"perf.precision": "fp16"}
    assert runs["fused"] == {"perf.optimizer_impl": "fused"}
    assert runs["foreach"] == {"perf.optimizer_impl": "foreach"}
    assert runs["compile"] == {"perf.compile": True}  # the pretrain loop compiles
    assert runs["grad_ckpt"] == {"perf.grad_checkpointing": True}
    assert runs["sdpa"] == {"perf.attn_implementation": "sdpa"}
    # the same tokens per optimizer step: half batches, twice the accumulation
    assert runs["grad_accum"] == {"train.batch_size": 16, "train.grad_accum": 2}
    assert set(skipped) == {"tf32"}
    assert "CUDA" in skipped["tf32"] and "device is cpu" in skipped["tf32"]


def test_cuda_and_the_unread_table_decide_the_rest():
    cfg = _pretrain_cfg()
    runs, skipped = bench_knobs.plan(["tf32", "compile"], "pretrain", cfg, "cuda")
    assert dict(runs) == {"tf32": {"perf.tf32": True}, "compile": {"perf.compile": True}}
    # a key the command does not read skips its knob, with the table's reason
    runs, skipped = bench_knobs.plan(
        ["compile"], "pretrain", cfg, "cuda", unread=lambda command, key: "no compiler here"
    )
    assert not runs and "no compiler here" in dict(skipped)["compile"]
    runs, skipped = bench_knobs.plan(["compile", "fused", "tf32"], "pretrain", cfg, "mps")
    fused = {"perf.optimizer_impl": "fused"}  # torch 2.13 has a fused AdamW kernel for MPS too
    assert dict(runs) == {"compile": {"perf.compile": True}, "fused": fused}
    assert set(dict(skipped)) == {"tf32"}


def test_grpo_plan():
    cfg = load_config("grpo", GRPO, [])
    assert guess_command(GRPO, []) == "grpo" and guess_command(PRETRAIN, []) == "pretrain"
    runs, skipped = bench_knobs.plan(bench_knobs.select(None, "grpo"), "grpo", cfg, "cpu")
    runs, skipped = dict(runs), dict(skipped)
    assert runs["completion_len"] == {"grpo.max_completion_length": 32}
    assert runs["reward_workers"] == {"grpo.reward_workers": 2}
    assert "does not use it" in skipped["compile"]
    assert runs["grad_accum"] == {"train.grad_accum": 2}  # the same batch in two micro-batches
    assert "bf16" in runs and "sdpa" in runs and "grad_ckpt" in runs
    # the baseline forces no key the grpo schema refuses
    base = bench_knobs.baseline_values(bench_knobs.select(None, "grpo"), "grpo", cfg)
    assert "perf.compile" not in base and "train.grad_accum" not in base
    load_config("grpo", GRPO, bench_knobs.as_overrides(base))
    _, skipped = bench_knobs.plan(["completion_len"], "pretrain", _pretrain_cfg(), "cpu")
    assert "grpo workloads only" in dict(skipped)["completion_len"]
    with pytest.raises(UserError, match="unknown nope"):
        bench_knobs.select(["bf16", "nope"], "grpo")


def test_runtime_skips_and_step_times(tmp_path):
    (tmp_path / "training.log").write_text(
        "2025-01-01 00:00:00 runtime: device cpu, 2 threads, precision fp32, AdamW fused; "
        "skipped: tf32 (CUDA only; cpu has no TF32); pin_memory (CUDA only)\n"
    )
    assert bench_measure.runtime_skipped(tmp_path) == [
        "tf32 (CUDA only; cpu has no TF32)",
        "pin_memory (CUDA only)",
    ]
    rows = [
        {"step": 1.0, "train_s": 2.0},
        {"step": 2.0, "train_s": 2.5},
        {"step": 4.0, "train_s": 3.5},
    ]
    assert bench_measure.step_times(rows, "pretrain") == [(1, 2.0), (2, 0.5), (4, 0.5)]
    assert bench_measure.step_times([{"step": 1.0, "step_s": 0.7}], "grpo") == [(1, 0.7)]


def test_combination_takes_the_best_of_each_group():
    rows = [
        {
            "variant": "bf16",
            "knob": "bf16",
            "status": "ok",
            "speedup": 1.3,
            "within_tolerance": True,
        },
        {
            "variant": "fp16",
            "knob": "fp16",
            "status": "ok",
            "speedup": 1.5,
            "within_tolerance": False,
        },
        {
            "variant": "fused",
            "knob": "fused",
            "status": "ok",
            "speedup": 1.1,
            "within_tolerance": True,
        },
        {
            "variant": "foreach",
            "knob": "foreach",
            "status": "ok",
            "speedup": 1.2,
            "within_tolerance": True,
        },
        {
            "variant": "sdpa",
            "knob": "sdpa",
            "status": "ok",
            "speedup": 1.01,
            "within_tolerance": True,
        },
        {"variant": "compile", "knob": "compile", "status": "failed"},
    ]
    assert bench_knobs.combination(rows, 1.03) == ["bf16", "foreach"]


def _fake_result() -> dict:
    def ok(name, knob, step_s, q, mem, **kw):
        return {
            "variant": name,
            "knob": knob,
            "status": "ok",
            "step_s": step_s,
            "first_step_s": step_s * 3,
            "throughput": 4096 / step_s,
            "unit": "tok/s",
            "peak_mem_mb": mem,
            "quality": q,
            "quality_name": "val loss",
            "wall_s": 12.0,
            "values": kw.pop("values", {}),
            **kw,
        }

    results = [
        ok("baseline", None, 0.50, 4.00, 600),
        ok("bf16", "bf16", 0.40, 4.01, 650, values={"perf.precision": "bf16"}),
        ok("grad_ckpt", "grad_ckpt", 0.70, 4.00, 500, values={"perf.grad_checkpointing": True}),
        ok("fp16", "fp16", 0.45, 4.50, 640, values={"perf.precision": "fp16"}),
        {
            "variant": "compile",
            "knob": "compile",
            "status": "failed",
            "wall_s": 3.0,
            "reason": "exit 1: RuntimeError | boom",
            "values": {"perf.compile": True},
        },
        ok("baseline (repeat)", None, 0.52, 4.00, 600),
    ]
    bench.rescore(results, "pretrain", 0.02)
    return {
        "workload": "configs/pretrain/x.yaml",
        "kind": "pretrain",
        "device": "cpu",
        "steps": 30,
        "warmup_steps": 5,
        "tolerance": 0.02,
        "min_speedup": 1.03,
        "overrides": ["train.batch_size=8"],
        "baseline_values": {"perf.precision": "fp32"},
        "results": results,
        "combined_knobs": ["bf16"],
        "load_start": [1.0, 1.0, 1.0],
        "skipped": [{"knob": "tf32", "reason": "TF32 is a CUDA matmul mode; device is cpu"}],
    }


def test_report_writer_on_a_fake_result(tmp_path):
    result = _fake_result()
    by = {r["variant"]: r for r in result["results"]}
    assert by["bf16"]["speedup"] == pytest.approx(0.50 / 0.40)  # against the faster baseline
    assert by["bf16"]["within_tolerance"] and not by["fp16"]["within_tolerance"]
    md = bench_report.render_markdown(result)
    assert "| bf16 | perf.precision=bf16 | 0.400 |" in md
    assert "**no**" in md  # fp16 left the tolerance
    assert "failed: exit 1: RuntimeError \\| boom" in md  # a pipe in a reason stays one cell
    assert "**tf32**: TF32 is a CUDA matmul mode" in md
    assert "Noise:" in md and "Only bf16 helped" in md and "![speedup" in md
    table = bench_report.table_markdown(result)
    assert table.count("\n") == len(result["results"]) + 1
    widths = {len(re.split(r"(?<!\\)\|", line)) for line in table.splitlines()}
    assert len(widths) == 1  # every row has the header's number of cells
    png = bench_report.write_plot(result, tmp_path / "bench.png")
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"


def test_a_real_tiny_bench(micro_pretrain, tmp_path):
    """Four real children. No `fused` variant: its plan is test_pretrain_plan_on_cpu's, and
    fused AdamW is what every other CPU training test runs (optimizer_impl auto)."""
    out = tmp_path / "bench"
    lines = []
    result = bench.run_bench(
        str(PRETRAIN),
        [*micro_pretrain, "perf.threads=1"],
        knobs=["grad_accum", "tf32", "log_interval", "save_interval"],
        steps=6,
        out=out,
        recheck=False,
        min_speedup=100.0,
        echo=lines.append,
    )
    assert [r["variant"] for r in result["results"]] == [
        "baseline",
        "grad_accum",
        "log_interval",
        "save_interval",
    ]
    assert all(r["status"] == "ok" for r in result["results"]), result["results"]
    by = {r["variant"]: r for r in result["results"]}
    assert by["baseline"]["tokens_per_step"] == by["grad_accum"]["tokens_per_step"] == 4 * 32
    cfg = json.loads((out / "grad_accum" / "config.json").read_text())
    assert (cfg["train"]["batch_size"], cfg["train"]["grad_accum"]) == (2, 2)
    base_cfg = json.loads((out / "baseline" / "config.json").read_text())
    # the baseline forces each benched knob off (tf32's default is on), even one skipped later,
    # and only those: optimizer_impl, not benched here, keeps its default
    assert base_cfg["perf"]["tf32"] is False and base_cfg["train"]["max_steps"] == 6
    assert base_cfg["perf"]["optimizer_impl"] == "auto"
    # the interval knobs' values reach their variants over the workload's and the bench's own
    train = {
        v: json.loads((out / v / "config.json").read_text())["train"]
        for v in ("baseline", "log_interval", "save_interval")
    }
    assert train["baseline"]["log_interval"] == 1 and train["baseline"]["save_interval"] == 0
    assert train["log_interval"]["log_interval"] == 10
    assert train["save_interval"]["save_interval"] == 5
    assert by["save_interval"]["timing"] == by["log_interval"]["timing"] == "wall"
    assert by["save_interval"]["wall_step_s"] > 0 and by["baseline"]["wall_step_s"] > 0
    assert (out / "save_interval" / "checkpoints" / "step_5").is_dir()
    assert not list(out.glob("baseline/checkpoints/step_*"))
    assert [s["knob"] for s in result["skipped"]] == ["tf32"]  # no CUDA in the test machine
    for name in ("bench.md", "bench.json", "bench.png"):
        assert (out / name).stat().st_size > 0
    assert "| grad_accum |" in (out / "bench.md").read_text() and any(
        "| save_interval |" in x for x in lines
    )
    assert json.loads((out / "bench.json").read_text())["results"][1]["knob"] == "grad_accum"
    if sys.platform.startswith("linux"):  # the variants forked from one server, its log beside
        assert result["start"] == "warm" and (out / "warm.log").exists()
        assert sum(x.startswith("variant start: warm (start: auto on Linux)") for x in lines) == 1


SEED_KNOBS = {  # the seed project's speed guide, knob by knob, as the bench names them
    "mixed precision": {"bf16", "fp16"},
    "gradient checkpointing": {"grad_ckpt"},
    "data loader workers": {"workers"},
    "pinned memory": {"pin_memory"},
    "prefetch": {"prefetch"},
    "gradient accumulation": {"grad_accum"},
    "compile": {"compile"},
    "fused AdamW": {"fused"},
    "save strategy": {"save_interval"},
    "logging interval": {"log_interval"},
}


def test_the_sft_plan_covers_every_knob_of_the_seed():
    """On the SFT recipe every seed knob is measured or skipped with a reason, never absent."""
    cfg = load_config("sft", ROOT / "configs/sft/story-continuation.yaml", [])
    runs, skipped = bench_knobs.plan(bench_knobs.select(None, "sft"), "sft", cfg, "cpu")
    runs, skipped = dict(runs), dict(skipped)
    for seed, names in SEED_KNOBS.items():
        assert names & (set(runs) | set(skipped)), seed
    assert "device is cpu" in skipped["pin_memory"]
    assert runs["log_interval"] == {"train.log_interval": 10}
    assert runs["save_interval"] == {"train.save_interval": 5}
    base = bench_knobs.baseline_values(bench_knobs.select(None, "sft"), "sft", cfg)
    assert base["train.log_interval"] == 1 and base["train.save_interval"] == 0
    load_config("sft", ROOT / "configs/sft/story-continuation.yaml", bench_knobs.as_overrides(base))


def test_wall_timed_knobs_count_what_falls_between_steps():
    rows = [
        {"step": 1, "wall_s": 5.0},
        {"step": 2, "wall_s": 6.0},
        {"step": 4, "wall_s": 7.0},
        {"step": 8, "wall_s": 11.0},
    ]
    assert bench_measure.wall_step_s(rows, 2) == pytest.approx(5.0 / 6)  # steps 2..8
    assert bench_measure.wall_step_s(rows, 20) == pytest.approx(6.0 / 7)  # from the first row
    assert bench_measure.wall_step_s(rows[:1], 0) is None
    results = [
        {"variant": "baseline", "knob": None, "status": "ok", "step_s": 0.5, "wall_step_s": 0.6},
        {
            "variant": "save_interval",
            "knob": "save_interval",
            "status": "ok",
            "step_s": 0.5,
            "wall_step_s": 0.8,
        },
        {"variant": "fused", "knob": "fused", "status": "ok", "step_s": 0.4, "wall_step_s": 0.9},
    ]
    bench.rescore(results, "sft", 0.02)
    by = {r["variant"]: r for r in results}
    assert by["save_interval"]["speedup"] == pytest.approx(0.6 / 0.8)  # wall against wall
    assert by["save_interval"]["timing"] == "wall"
    assert by["fused"]["speedup"] == pytest.approx(0.5 / 0.4) and "timing" not in by["fused"]
    table = bench_report.table_markdown({"kind": "sft", "results": results})
    assert "| save_interval | - | 0.800 wall |" in table


@pytest.mark.parametrize(
    "kw, message",
    [
        (
            {"steps": 0},
            "--steps must be at least 3 (warm-up steps are excluded from timing), got 0",
        ),
        ({"repeat": 0}, "--repeat must be at least 1, got 0"),
        ({"timeout": 0.0}, "--timeout must be a positive number of seconds, got 0"),
        ({"tolerance": -1.0}, "--tolerance must be 0 or more, got -1"),
        ({"min_speedup": 0.0}, "--min-speedup must be above 0"),
        ({"knobs": []}, "--knobs: empty"),
        ({"knobs": ["bogus"]}, "--knobs: unknown bogus"),
        ({"start": "hot"}, "--start: auto, warm or cold, got 'hot'"),
    ],
)
def test_bad_bench_settings_fail_with_one_line_and_no_directory(tmp_path, kw, message):
    out = tmp_path / "bench"
    with pytest.raises(UserError) as e:
        bench.run_bench(str(PRETRAIN), [], out=out, **kw)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert not out.exists()
