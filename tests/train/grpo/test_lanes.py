"""`smollab lanes grpo`: lanes write process-run directories, equal standalone losses and
gradients, end alone when they diverge, and take trials from a sweep's inbox."""

from __future__ import annotations

import copy
import csv
import json

import pytest
import torch

from smollab import api
from smollab.cli import main
from smollab.engine.lane_llama import LaneLlama
from smollab.engine.reference import build_reference
from smollab.engine.sampler import Sampler
from smollab.errors import UserError
from smollab.rundir.inbox import Inbox, LaneTrial
from smollab.rundir.runs import LOG, RunView
from smollab.train.grpo.loss import LossOptions
from smollab.train.grpo.policies import lanes_forward, policy_forward
from smollab.train.grpo.run_state import RunState
from smollab.train.grpo.update import Batch, RunRows, loss_backward
from tests.engine.test_lane_llama import full_policies, lane_policies

peft = pytest.importorskip("peft")


def shared_args(micro_grpo) -> list[str]:
    keep = [a for a in micro_grpo if not a.startswith("run.dir=")]
    return [
        *keep,
        "model.lora.enabled=true",
        "model.lora.r=4",
        "failure.action=flag",
        "perf.threads=1",
        "reward=[{name: sentence_length}]",
    ]  # a reward that varies


def rows(run_dir) -> list[dict]:
    with open(run_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


def test_lanes_write_the_run_directories_of_process_runs(micro_grpo, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    summaries = api.lanes(
        None,
        shared_args(micro_grpo),
        [
            [f"run.dir={a}", "optim.lr=1e-3"],
            [f"run.dir={b}", "optim.lr=3e-3", "grpo.beta=0.1", "model.lora.r=2", "run.seed=7"],
        ],
    )
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    for d, lr, r in ((a, 1e-3, 4), (b, 3e-3, 2)):
        summary = json.loads((d / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["steps"] == 6
        assert json.loads((d / "config.json").read_text())["optim"]["lr"] == lr
        assert [int(x["step"]) for x in rows(d)] == [1, 2, 3, 4, 5, 6]
        assert json.loads((d / "checkpoints/final/adapter_config.json").read_text())["r"] == r
        assert (d / "checkpoints/final/adapter_model.safetensors").exists()
        # each lane's held-out prompt rewards, for a sweep's Wilcoxon pruner over lanes
        evals = RunView(d).eval_prompts()
        assert [e["step"] for e in evals] == [0, 3, 6] and all(
            len(e["rewards"]) == 4 for e in evals
        )
    # a finished lane is found finished when the same command runs again
    again = api.lanes(None, shared_args(micro_grpo), [[f"run.dir={a}", "optim.lr=1e-3"]])
    assert again[0]["status"] == "completed"


def test_full_lanes_train_and_resume_as_full_fine_tuning_runs(micro_grpo, tmp_path, monkeypatch):
    """Without LoRA each lane trains its own copy of every weight and writes a full run's
    directory (the model in its checkpoints); its first step (same seed, so the same rollouts)
    has the loss, KL and gradient norm of `smollab grpo` alone; interrupted, it resumes."""
    full = [
        *[a for a in shared_args(micro_grpo) if not a.startswith("model.lora")],
        "grpo.beta=0.1",
    ]
    solo = tmp_path / "solo"
    main(["grpo", *full, "optim.lr=1e-3", f"run.dir={solo}"])
    a, b = tmp_path / "a", tmp_path / "b"
    lanes = [[f"run.dir={a}", "optim.lr=1e-3"], [f"run.dir={b}", "optim.lr=1e-4", "run.seed=3"]]
    after_step = RunState.after_step

    def interrupted_at_4(lane, *args):
        after_step(lane, *args)
        if lane.step == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(RunState, "after_step", interrupted_at_4)
    with pytest.raises(KeyboardInterrupt):
        api.lanes(None, full, lanes)
    assert json.loads((b / "summary.json").read_text())["status"] == "interrupted"
    monkeypatch.setattr(RunState, "after_step", after_step)
    summaries = api.lanes(None, full, lanes)  # resumed from step 4
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    assert "full fine-tuning" in (a / LOG).read_text()
    for key in ("loss", "kl", "grad_norm"):
        assert float(rows(a)[0][key]) == pytest.approx(float(rows(solo)[0][key]), rel=1e-4)
    assert [int(x["step"]) for x in rows(b)] == [1, 2, 3, 4, 5, 6]
    assert "resum" in (b / LOG).read_text()
    assert (a / "checkpoints/final/model.safetensors").exists()
    assert not (a / "checkpoints/final/adapter_config.json").exists()


@pytest.mark.parametrize("iterations", [1, 2])
def test_lanes_replay_the_decode_as_the_computed_forward_would_train(
    micro_grpo, tmp_path, iterations
):
    """The default replays each batch's first policy forward from the decode record; its first
    step (same rollouts) has the loss, KL and gradient norm of the computed forward (with two
    passes over the batch, the second computed in both)."""
    lanes = [["optim.lr=1e-3", "grpo.beta=0.1"], ["optim.lr=3e-3", "model.lora.r=2", "run.seed=7"]]
    first = {}
    for replay in ("true", "false"):
        dirs = [tmp_path / f"{replay}{i}" for i in range(len(lanes))]
        api.lanes(
            None,
            [
                *shared_args(micro_grpo),
                f"grpo.replay={replay}",
                "train.max_steps=1",
                f"grpo.num_iterations={iterations}",
                "train.save_interval=0",
            ],
            [[f"run.dir={d}", *extra] for d, extra in zip(dirs, lanes, strict=True)],
        )
        first[replay] = [rows(d)[0] for d in dirs]
        log = (dirs[0] / LOG).read_text()
        assert ("policy forward replayed from the decode" in log) == (replay == "true")
        assert ("policy forward computed (grpo.replay=false)" in log) == (replay == "false")
    for replayed, computed in zip(first["true"], first["false"], strict=True):
        assert replayed["reward_mean"] == computed["reward_mean"]
        for key in ("loss", "kl", "grad_norm"):
            assert float(replayed[key]) == pytest.approx(float(computed[key]), rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("full", [False, True])
def test_each_lanes_loss_kl_and_gradients_equal_its_standalone_run(full):
    """Given the same rollouts, a lane's loss, KL and gradients (its adapter's, or every weight
    of a full lane) are a standalone run's."""
    policies = full_policies() if full else lane_policies(ranks=(2, 4, 4))
    alone = [copy.deepcopy(p) for p in policies]
    opts = [
        LossOptions(**g)
        for g in (
            dict(_grpo(), beta=0.0),
            dict(_grpo(), beta=0.1),
            dict(_grpo(), beta=0.05, loss_type="grpo"),
        )
    ]
    model = LaneLlama.from_hf(policies[0], adapters=False)
    with torch.no_grad():
        model.load_lanes(policies)
    prompts = [[5, 6, 7], [9, 10]] * 2  # 2 prompts x 2 completions per lane
    r = Sampler(model, eos_token_id=2).generate(prompts * 3, 6, seed=0)
    ref = build_reference(policies[0], not full, False)(r, 0.9)
    adv = torch.randn(12, generator=torch.Generator().manual_seed(0))
    mask = r.completion_mask
    spans = [slice(i * 4, (i + 1) * 4) for i in range(3)]
    got = loss_backward(
        lanes_forward(model, policies, 0.9),
        Batch(r, adv, mask, None, ref),
        [RunRows(s, o) for s, o in zip(spans, opts, strict=True)],
        num_generations=2,
    )
    for i, s in enumerate(spans):
        lone_ref = ref[s] if opts[i].beta else None  # beta 0: no reference, as in grpo
        [(loss, stats)] = loss_backward(
            policy_forward(alone[i], 0.9),
            Batch(r.select(s), adv[s], mask[s], None, lone_ref),
            [RunRows(slice(0, 4), opts[i])],
            num_generations=2,
        )
        assert got[i][0] == pytest.approx(loss, abs=1e-5)
        assert got[i][1].get("kl", 0.0) == pytest.approx(stats.get("kl", 0.0), abs=1e-6)
        mine = dict(policies[i].named_parameters())
        for name, p in alone[i].named_parameters():
            if p.requires_grad:
                torch.testing.assert_close(mine[name].grad, p.grad, atol=1e-4, rtol=1e-4)


def _grpo() -> dict:
    return dict(
        beta=0.0,
        epsilon=0.2,
        epsilon_high=None,
        loss_type="dapo",
        max_completion_length=6,
        importance_sampling_level="token",
        delta=None,
        sapo_temperature_pos=1.0,
        sapo_temperature_neg=1.05,
        vespo_k_pos=2.0,
        vespo_lambda_pos=3.0,
        vespo_k_neg=3.0,
        vespo_lambda_neg=2.0,
    )


def test_a_diverging_lane_ends_alone_and_the_others_are_unaffected(micro_grpo, tmp_path):
    args = shared_args(micro_grpo)
    api.lanes(None, args, [[f"run.dir={tmp_path / 'solo'}", "optim.lr=1e-3"]])
    summaries = api.lanes(
        None,
        args,
        [
            [f"run.dir={tmp_path / 'calm'}", "optim.lr=1e-3"],
            [f"run.dir={tmp_path / 'wild'}", "optim.lr=30", "grpo.beta=0"],
        ],
    )
    wild = json.loads((tmp_path / "wild/summary.json").read_text())
    calm = json.loads((tmp_path / "calm/summary.json").read_text())
    assert wild["status"] == "diverged" and wild["steps"] < 6 and wild["evidence"]
    assert calm["status"] == "completed" and calm["steps"] == 6
    solo = rows(tmp_path / "solo")  # the calm lane trains as it would alone
    calm_rows = rows(tmp_path / "calm")
    assert [x["reward_mean"] for x in calm_rows] == [x["reward_mean"] for x in solo]
    # the reference ran on the calm lane's rows alone while the wild one (beta 0) was there
    # (a KL of 1e-5 is a mean of float32 log-prob differences: its rounding is absolute)
    assert [float(x["kl"]) for x in calm_rows] == pytest.approx(
        [float(x["kl"]) for x in solo], rel=1e-4, abs=1e-8
    )
    assert sorted(s["status"] for s in summaries) == ["completed", "diverged"]


def test_lanes_refuse_what_they_cannot_share_in_one_line(micro_grpo, tmp_path):
    args = shared_args(micro_grpo)
    with pytest.raises(UserError, match=r"train.batch_size=16 differs from the first lane's 8"):
        api.lanes(
            None,
            args,
            [
                [f"run.dir={tmp_path / 'a'}"],
                {"run.dir": str(tmp_path / "b"), "train.batch_size": 16},
            ],
        )
    with pytest.raises(UserError, match=r"--max-lanes N is required with --inbox"):
        api.lanes(inbox=tmp_path / "inbox")
    with pytest.raises(UserError, match=r"takes each trial's config from its inbox"):
        api.lanes(None, args, inbox=tmp_path / "inbox", max_lanes=2)
    with pytest.raises(UserError, match=r"model.lora.dropout=0.1 is not supported in lanes"):
        api.lanes(None, [*args, "model.lora.dropout=0.1"], [[f"run.dir={tmp_path / 'c'}"]])
    for knob in ("entropy_coef=0.01", "top_entropy_quantile=0.5", "steps_per_generation=2"):
        with pytest.raises(UserError, match=rf"grpo.{knob} is not supported in lanes"):
            api.lanes(None, [*args, f"grpo.{knob}"], [[f"run.dir={tmp_path / 'c'}"]])
    with pytest.raises(UserError, match=r"two lanes would write .*same: give each its own run.dir"):
        api.lanes(None, args, [[f"run.dir={tmp_path / 'same'}"], [f"run.dir={tmp_path / 'same'}"]])
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()
    assert (
        main(
            [
                "lanes",
                "grpo",
                *args,
                "--lane",
                f"run.dir={tmp_path / 'd'} grpo.top_k=3",
                "--lane",
                f"run.dir={tmp_path / 'e'}",
            ]
        )
        == 2
    )


def test_worker_refills_freed_lanes_and_honours_stop_requests(micro_grpo, tmp_path):
    box = Inbox(tmp_path / "inbox")
    shared = shared_args(micro_grpo)
    trials = (
        ("t0", ["model.lora.dropout=0.1"]),
        ("t1", []),
        ("t2", ["train.max_steps=2"]),
        ("t3", ["optim.lr=2e-3"]),
    )  # t0: refused alone, the worker goes on
    for name, extra in trials:
        box.post(LaneTrial(name, ["grpo", *shared, *extra], str(tmp_path / name)))
    box.stop("t3", "pruned at step 0")
    box.close()
    summaries = api.lanes(inbox=tmp_path / "inbox", max_lanes=2)
    assert box.exit_code("t0") == 1 and not (tmp_path / "t0").exists()
    assert box.exit_code("t1") == 0 and box.exit_code("t2") == 0
    assert box.exit_code("t3") == 130  # stopped while it waited: no step taken
    steps = {
        n: json.loads((tmp_path / n / "summary.json").read_text())["steps"] for n in ("t1", "t2")
    }
    assert steps == {"t1": 6, "t2": 2}
    t3 = json.loads((tmp_path / "t3/summary.json").read_text())
    assert t3["status"] == "interrupted" and not (tmp_path / "t3/checkpoints/step_2").exists()
    assert [r["step"] for r in rows(tmp_path / "t3")] == []
    assert len(summaries) == 3


def test_lanes_take_micro_batches_as_one_pass(micro_grpo, tmp_path):
    """With train.grad_accum=2 every lane's k-th groups go through the batched model together, in
    two micro-batches: the first step's loss, KL and gradient norm of each lane (its own loss
    type) are those of the one-pass step, and the log says why the forward is computed."""
    lanes = [
        ["optim.lr=1e-3", "grpo.beta=0.1"],
        ["optim.lr=3e-3", "grpo.loss_type=grpo", "model.lora.r=2", "run.seed=7"],
    ]
    first = {}
    for accum in (1, 2):
        dirs = [tmp_path / f"a{accum}-{i}" for i in range(len(lanes))]
        summaries = api.lanes(
            None,
            [
                *shared_args(micro_grpo),
                f"train.grad_accum={accum}",
                "train.max_steps=1",
                "train.save_interval=0",
            ],
            [[f"run.dir={d}", *extra] for d, extra in zip(dirs, lanes, strict=True)],
        )
        assert [s["status"] for s in summaries] == ["completed", "completed"]
        first[accum] = [rows(d)[0] for d in dirs]
    log = (dirs[0] / LOG).read_text()
    assert "policy forward computed (train.grad_accum=2 (micro-batches))" in log
    for one, two in zip(first[1], first[2], strict=True):
        assert one["reward_mean"] == two["reward_mean"]
        for key in ("loss", "kl", "grad_norm", "clip_frac"):
            assert float(two[key]) == pytest.approx(float(one[key]), rel=1e-4, abs=1e-7), key
        assert float(one["grad_norm"]) > 0


def test_lanes_draw_with_the_repetition_penalty_and_compute_the_forward(micro_grpo, tmp_path):
    dirs = [tmp_path / f"p{i}" for i in range(2)]
    summaries = api.lanes(
        None,
        [*shared_args(micro_grpo), "grpo.repetition_penalty=1.3", "train.max_steps=1"],
        [[f"run.dir={d}", f"run.seed={i}"] for i, d in enumerate(dirs)],
    )
    assert [s["status"] for s in summaries] == ["completed", "completed"]
    log = (dirs[0] / LOG).read_text()
    assert "policy forward computed (grpo.repetition_penalty=1.3 (penalized draws))" in log
