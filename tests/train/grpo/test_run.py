import json
import statistics

import pytest
import torch
from safetensors.torch import load_file

from smollab.cli import main
from smollab.config.load import load_config
from smollab.errors import RunFailed
from smollab.rundir.rows import read_metrics
from smollab.rundir.runs import RunView
from smollab.train.grpo import run_state
from smollab.train.grpo import step as grpo_step
from smollab.train.grpo.run import train


def _run(overrides):
    return train(load_config("grpo", None, overrides))


def test_full_finetune_end_to_end(micro_grpo, tmp_path):
    summary = _run([*micro_grpo, "run.plots=true"])
    run = tmp_path / "grpo"
    assert summary["status"] == "completed" and summary["steps"] == 6
    rows = read_metrics(run / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5, 6]
    for key in (
        "reward_mean",
        "frac_reward_zero_std",
        "kl",
        "entropy",
        "completion_len",
        "unique_fraction",
        "jaccard",
        "clip_frac",
        "grad_norm",
        "gen_s",
        "train_s",
    ):
        assert rows[-1][key] is not None, key
    assert rows[2]["eval_reward_mean"] is not None  # evaluated at step 3
    assert rows[-1]["kl"] >= 0
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert {"step", "prompt", "completion", "reward"} <= samples[0].keys()
    assert (run / "checkpoints" / "final" / "model.safetensors").exists()
    for plot in ("reward.png", "kl.png", "diversity.png"):
        assert (run / "plots" / plot).exists()
    assert summary["base_eval_reward"] is not None
    # each held-out prompt's reward, per evaluation (the base model's at step 0): their mean is
    # the logged one, so a sweep's Wilcoxon pruner pairs the same numbers prompt by prompt
    per_prompt = RunView(run).eval_prompts()
    evals = {
        int(r["step"]): r["eval_reward_mean"] for r in rows if r["eval_reward_mean"] is not None
    }
    assert [e["step"] for e in per_prompt] == [0, *evals]
    assert per_prompt[0]["rewards"] and statistics.fmean(per_prompt[0]["rewards"]) == pytest.approx(
        summary["base_eval_reward"]
    )
    for e in per_prompt[1:]:
        assert statistics.fmean(e["rewards"]) == pytest.approx(evals[e["step"]], abs=1e-5)


def test_lora_saves_adapter_and_merged_export(micro_grpo, tmp_path):
    summary = _run(
        [*micro_grpo, "model.lora.enabled=true", "model.lora.r=2", "grpo.export_merged=true"]
    )
    assert summary["status"] == "completed"
    final = tmp_path / "grpo" / "checkpoints" / "final"
    assert (final / "adapter_model.safetensors").exists()
    assert not (final / "model.safetensors").exists()
    assert (tmp_path / "grpo" / "checkpoints" / "final_merged" / "model.safetensors").exists()
    assert summary["params_trainable"] < summary["params_total"]


def crash_grpo_at_step(monkeypatch, n: int):
    """Make the GRPO loop raise in step `n` (its n-th advantage computation); returns the real
    function, to put back before resuming."""
    real, calls = grpo_step.group_advantages, {"n": 0}

    def crash(*a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            raise RuntimeError("simulated crash")
        return real(*a, **k)

    monkeypatch.setattr(grpo_step, "group_advantages", crash)
    return real


@pytest.mark.parametrize("lora", [False, True])
def test_resume_after_crash_is_exact(micro_grpo, tmp_path, monkeypatch, lora):
    extra = ["model.lora.enabled=true", "model.lora.r=2"] if lora else []
    _run([*micro_grpo, *extra, f"run.dir={tmp_path / 'ref'}"])
    real = crash_grpo_at_step(monkeypatch, 5)
    with pytest.raises(RunFailed, match="RuntimeError: simulated crash"):
        _run([*micro_grpo, *extra])
    monkeypatch.setattr(grpo_step, "group_advantages", real)
    assert _run([*micro_grpo, *extra])["status"] == "completed"
    rows = read_metrics(tmp_path / "grpo" / "metrics.csv")
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4, 5, 6]
    # the per-prompt rewards of the evaluations, each once, as the uninterrupted run wrote them
    assert RunView(tmp_path / "grpo").eval_prompts() == RunView(tmp_path / "ref").eval_prompts()
    name = "adapter_model.safetensors" if lora else "model.safetensors"
    a = load_file(tmp_path / "ref" / "checkpoints" / "final" / name)
    b = load_file(tmp_path / "grpo" / "checkpoints" / "final" / name)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)


def test_failure_rules_stop_or_flag(micro_grpo, tmp_path):
    deg = _run([*micro_grpo, "failure.max_jaccard=0.0", "failure.patience=2"])
    assert deg["status"] == "degenerate" and deg["steps"] < 6
    assert "Jaccard" in deg["evidence"]
    stuck = _run(
        [
            *micro_grpo,
            f"run.dir={tmp_path / 's'}",
            "failure.stuck_grace_steps=4",
            "failure.baseline_steps=1",
            "failure.stuck_margin=2",
            "failure.action=flag",
        ]
    )
    assert stuck["status"] == "completed" and "stuck" in stuck["flags"]
    div = _run([*micro_grpo, f"run.dir={tmp_path / 'd'}", "failure.max_kl=1e-9", "grpo.beta=0.1"])
    assert div["status"] == "diverged" and "kl" in div["evidence"]


def test_user_reward_module(micro_grpo, tmp_path, monkeypatch):
    (tmp_path / "myrewards.py").write_text(
        "def short(completions, **kw):\n    return [1.0 / (1 + len(c)) for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    summary = _run(
        [*micro_grpo, "reward=[{name: 'myrewards:short', weight: 2.0}, {name: happy_count}]"]
    )
    assert summary["status"] == "completed"
    rows = read_metrics(tmp_path / "grpo" / "metrics.csv")
    assert rows[0]["reward/myrewards:short"] is not None


def test_bad_reward_stops_before_writing(micro_grpo, tmp_path, capsys):
    assert main(["grpo", *micro_grpo, "reward=[{name: hapy_binary}]"]) == 2
    err = capsys.readouterr().err
    assert "hapy_binary" in err and err.count("\n") == 1
    assert not (tmp_path / "grpo").exists()


def test_replayed_policy_forward_trains_like_the_computed_one(micro_grpo, tmp_path):
    runs = {}
    for replay in ("true", "false"):
        _run(
            [
                *micro_grpo,
                f"grpo.replay={replay}",
                f"run.dir={tmp_path / replay}",
                "train.max_steps=2",
            ]
        )
        runs[replay] = read_metrics(tmp_path / replay / "metrics.csv")[0]
        log = (tmp_path / replay / "training.log").read_text()
        assert ("policy forward replayed from the decode" in log) == (replay == "true")
    assert "policy forward computed (grpo.replay=false)" in log
    on, off = runs["true"], runs["false"]  # step 1: same rollout, same weights
    assert on["reward_mean"] == off["reward_mean"]
    for key in ("loss", "kl", "grad_norm"):
        assert on[key] == pytest.approx(off[key], rel=1e-4, abs=1e-7), key


def test_max_time_counts_training_time_and_a_resume_continues_it(micro_grpo, tmp_path, monkeypatch):
    """train.max_time is the steps' time, as in pretraining: loading and evaluation are free, and
    a resumed run goes on with the time its checkpoint had spent. A fake clock makes each step
    take 4 s (5 readings a step, 1 s apart), so max_time=10 stops after step 3 (12 s)."""
    import itertools
    import time
    from types import SimpleNamespace

    clock = itertools.count()
    monkeypatch.setattr(
        grpo_step, "time", SimpleNamespace(time=time.time, perf_counter=lambda: float(next(clock)))
    )
    over = [*micro_grpo, "train.max_time=10", "train.save_interval=1"]
    real, calls = run_state.lr_at, []

    def stop_at_step_3(*a, **k):  # Ctrl-C as step 3 starts: step 2's checkpoint holds 8 s
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(run_state, "lr_at", stop_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        _run(over)
    monkeypatch.setattr(run_state, "lr_at", real)
    summary = _run(over)  # resumes at step 2 with 8 s spent: one more step reaches 12 s
    assert summary["status"] == "completed" and summary["steps"] == 3
    assert summary["train_seconds"] == 12.0 and summary["seconds_per_step"] == 4.0


@pytest.mark.parametrize(
    "loss",
    [
        ["grpo.loss_type=cispo", "grpo.epsilon_high=5"],
        ["grpo.loss_type=sapo", "grpo.importance_sampling_level=sequence"],
        ["grpo.loss_type=vespo", "grpo.vespo_k_neg=2"],
        ["grpo.loss_type=luspo", "grpo.importance_sampling_level=sequence", "grpo.delta=2"],
    ],
)
def test_trl_loss_family_trains_off_policy(micro_grpo, tmp_path, loss):
    """Each of TRL's newer loss types through the loop, each batch used twice (ratio != 1)."""
    base = [o for o in micro_grpo if not o.startswith("grpo.eval_prompts")]
    summary = _run(
        [
            *base,
            "train.max_steps=2",
            "train.eval_interval=0",
            "train.save_interval=0",
            "grpo.num_iterations=2",
            *loss,
        ]
    )
    assert summary["status"] == "completed"
    rows = read_metrics(tmp_path / "grpo" / "metrics.csv")
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert all(0 <= r["frac_reward_zero_std"] <= 1 for r in rows)


@pytest.fixture(scope="module")
def bf16_model(micro_model, tmp_path_factory):
    """micro_model's weights saved in bf16, as Hub checkpoints are published (config: bfloat16)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = micro_model / "checkpoints" / "final"
    out = tmp_path_factory.mktemp("bf16") / "model"
    AutoModelForCausalLM.from_pretrained(final, dtype=torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(final).save_pretrained(out)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    return out


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_bf16_checkpoint_trains_fp32_master_weights(bf16_model, micro_grpo, tmp_path, lora):
    """A bf16 checkpoint (how Hub models are published) loads as fp32 weights under
    model.dtype=auto: the run completes with its forward replayed from the lean decode, the log
    says what was stored and what is trained, and the checkpoint is saved (and says it is) fp32."""
    extra = ["model.lora.enabled=true", "model.lora.r=2"] if lora else []
    over = [*micro_grpo, f"model.path={bf16_model}", "train.max_steps=2", *extra]
    summary = _run(over)
    assert summary["status"] == "completed" and summary["steps"] == 2
    run = tmp_path / "grpo"
    log = (run / "training.log").read_text()
    assert "weights float32 (model.dtype=auto); stored bfloat16" in log
    assert "sampler lean" in log and "policy forward replayed from the decode" in log
    final = run / "checkpoints" / "final"
    weights = load_file(final / ("adapter_model.safetensors" if lora else "model.safetensors"))
    assert {t.dtype for t in weights.values()} == {torch.float32}
    if not lora:
        assert json.loads((final / "config.json").read_text())["dtype"] == "float32"


def test_trl_entropy_and_multi_reward_knobs_train_log_and_resume(micro_grpo, tmp_path, monkeypatch):
    """TRL's entropy bonus (adaptive), high-entropy token mask and GDPO aggregation through the
    whole loop: the row logs the exact entropy and the coefficient as it moves, the forward is
    computed from the logits (no replay), and a resume restores the controller exactly."""
    knobs = [
        "grpo.use_adaptive_entropy=true",
        "grpo.entropy_coef=0.01",
        "grpo.entropy_target=100.0",  # always at most the target: the coefficient climbs
        "grpo.entropy_coef_delta=0.002",
        "grpo.top_entropy_quantile=0.5",
        "grpo.multi_objective_aggregation=normalize_then_sum",
        "reward=[{name: happy_binary}, {name: sentence_length, weight: 0.5}]",
    ]
    _run([*micro_grpo, *knobs, f"run.dir={tmp_path / 'ref'}"])
    ref = read_metrics(tmp_path / "ref" / "metrics.csv")
    assert [r["entropy_coef"] for r in ref] == pytest.approx(
        [0.012, 0.014, 0.016, 0.018, 0.02, 0.022]
    )
    assert all(r["entropy"] > 0 for r in ref)
    log = (tmp_path / "ref" / "training.log").read_text()
    assert "policy forward computed (per-token entropies" in log
    real, calls = grpo_step.multi_objective_advantages, []

    def crash(*a, **k):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("simulated crash")
        return real(*a, **k)

    monkeypatch.setattr(grpo_step, "multi_objective_advantages", crash)
    with pytest.raises(RunFailed, match="RuntimeError: simulated crash"):
        _run([*micro_grpo, *knobs])
    monkeypatch.setattr(grpo_step, "multi_objective_advantages", real)
    assert _run([*micro_grpo, *knobs])["status"] == "completed"
    rows = read_metrics(tmp_path / "grpo" / "metrics.csv")
    for a, b in zip(ref, rows, strict=True):
        for key in ("entropy_coef", "entropy", "loss", "reward_mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def test_steps_per_generation_trains_several_steps_on_one_generated_batch(
    micro_grpo, tmp_path, monkeypatch
):
    """TRL's steps_per_generation = 3 x grad_accum: a batch of 3 x 8 completions generated at
    steps 1 and 4, each step training on its own 8 (clipped against the sampler's log-probs);
    the rows between generations spend no time generating. A crash resumes exactly, from the
    checkpoint between generations."""
    knobs = [
        "grpo.steps_per_generation=3",
        "grpo.epsilon_high=0.28",
        "train.save_interval=3",
    ]
    summary = _run([*micro_grpo, *knobs, f"run.dir={tmp_path / 'ref'}"])
    assert summary["status"] == "completed" and summary["steps"] == 6
    rows = read_metrics(tmp_path / "ref" / "metrics.csv")
    assert [r["gen_s"] > 0 for r in rows] == [True, False, False, True, False, False]
    samples = [
        json.loads(x) for x in (tmp_path / "ref" / "samples.jsonl").read_text().split("\n")[:-1]
    ]
    first = {s["step"]: (s["prompt"], s["completion"]) for s in samples}
    assert len(set(first.values())) == 6  # each step trains on its own slice
    assert (
        "policy forward computed (grpo.steps_per_generation=3"
        in (tmp_path / "ref" / "training.log").read_text()
    )
    real = crash_grpo_at_step(monkeypatch, 2)  # in the 2nd generation
    with pytest.raises(RunFailed, match="RuntimeError: simulated crash"):
        _run([*micro_grpo, *knobs])
    monkeypatch.setattr(grpo_step, "group_advantages", real)
    assert _run([*micro_grpo, *knobs])["status"] == "completed"
    again = read_metrics(tmp_path / "grpo" / "metrics.csv")
    for a, b in zip(rows, again, strict=True):
        for key in ("loss", "reward_mean", "clip_frac", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


def test_a_repetition_penalty_computes_the_policy_forward(micro_grpo, tmp_path):
    """Penalized draws are not the policy's: the loss's forward is computed, never replayed."""
    _run([*micro_grpo, "grpo.repetition_penalty=1.1", "train.max_steps=1"])
    log = (tmp_path / "grpo" / "training.log").read_text()
    assert "policy forward computed (grpo.repetition_penalty=1.1 (penalized draws))" in log


def test_each_phase_mark_waits_for_the_device(micro_grpo, monkeypatch):
    """gen_s, reward_s, ref_s and train_s each end at a synchronize of the run's device, so an
    accelerator's queued kernels land in the phase that queued them."""
    import time
    import types

    events = []

    def mark():
        events.append("mark")
        return time.perf_counter()

    monkeypatch.setattr(grpo_step, "synchronize", lambda device: events.append(device.type))
    monkeypatch.setattr(grpo_step, "time", types.SimpleNamespace(perf_counter=mark, time=time.time))
    _run([*micro_grpo, "train.max_steps=2"])
    step = ["mark"] + ["cpu", "mark"] * 4  # start, then generated, rewarded, referenced, trained
    assert events == step * 2


def test_the_static_decode_trains_like_the_eager_one_and_the_log_says_which(micro_grpo, tmp_path):
    rows = {}
    for decode in ("eager", "static"):
        run = tmp_path / decode
        _run([*micro_grpo, f"grpo.decode={decode}", f"run.dir={run}", "train.max_steps=2"])
        rows[decode] = read_metrics(run / "metrics.csv")
        log = (run / "training.log").read_text()
        assert f"sampler decode: {decode} (decode={decode} as configured; lm head: " in log
    for eager, static in zip(rows["eager"], rows["static"], strict=True):  # the same tokens
        assert eager["reward_mean"] == static["reward_mean"]
        assert eager["completion_len"] == static["completion_len"]
        assert eager["unique_fraction"] == static["unique_fraction"]
    eager, static = rows["eager"][0], rows["static"][0]  # step 1: the same weights too
    for key in ("loss", "kl", "grad_norm"):
        assert eager[key] == pytest.approx(static[key], rel=1e-4, abs=1e-7), key
    auto = tmp_path / "auto"
    _run([*micro_grpo, f"run.dir={auto}", "train.max_steps=1"])
    assert "sampler decode: eager (auto on cpu: " in (auto / "training.log").read_text()
