"""`smollab grpo` with gradient routing (grpo.routing) on micro settings: the loop end to end,
the three-mode evaluation file, saved and resumed adapters, `smollab sample --mode`, bad keys."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from safetensors.torch import load_file

from smollab.cli import main
from smollab.config.load import load_config
from smollab.errors import RunFailed
from smollab.rundir.rows import read_metrics
from smollab.rundir.runs import RunView
from smollab.train.grpo import step as grpo_step
from smollab.train.grpo.run import train
from tests.train.grpo.test_run import crash_grpo_at_step

ROUTED = [
    "reward=[{name: happy_binary}, {name: happy_count}]",
    "grpo.routing.enabled=true",
    "grpo.routing.retain_r=2",
    "grpo.routing.forget_r=2",
    "grpo.routing.eval_interval=3",
    "grpo.routing.eval_prompts=3",
    "grpo.routing.detector.threshold=1",
    "grpo.routing.hack_reward=happy_count",
    "grpo.routing.rh_eligible_frac=0.5",
    "grpo.routing.routing_frac=0.5",
    "grpo.routing.label_noise_frac=0.25",
    "grpo.routing.ablated_frac=0.3",
    "grpo.beta=0.05",
]
KEYS = {
    "step",
    "mode",
    "reward_mean",
    "reward/happy_binary",
    "reward/happy_count",
    "hack_rate",
    "unique_fraction",
    "jaccard",
}


def _run(overrides):
    return train(load_config("grpo", None, overrides))


def test_a_routed_run_end_to_end(micro_grpo, tmp_path, capsys):
    summary = _run([*micro_grpo, *ROUTED, "grpo.routing.eval_forget_scales=[0.5]"])
    assert summary["status"] == "completed" and summary["steps"] == 6
    run = RunView(tmp_path / "grpo")
    rows = run.routing_eval()
    assert [(r["step"], r["mode"]) for r in rows] == [
        (s, m) for s in (0, 3, 6) for m in ("both", "retain_only", "forget_only", "forget_scale")
    ]
    assert all(set(r) == KEYS for r in rows if r["mode"] != "forget_scale")
    assert all(set(r) == {*KEYS, "forget_scale"} for r in rows if r["mode"] == "forget_scale")
    assert all(0 <= r["hack_rate"] <= 1 for r in rows)
    metrics = read_metrics(run.metrics_path)
    for col in ("hack_rate", "routed_frac", "eligible_frac"):
        assert all(m[col] is not None for m in metrics), col
    assert {m["eligible_frac"] for m in metrics} <= {0.0, 0.5, 1.0}  # whole groups: 2 per step
    final = run.checkpoints_dir / "final"
    for adapter in ("retain", "forget"):
        assert (final / adapter / "adapter_model.safetensors").is_file()
    log = run.log_path.read_text()
    assert "policy forward computed (gradient routing (per-completion masks))" in log
    assert "r2 retain + r2 forget" in log

    capsys.readouterr()
    args = ["sample", str(run.path), "--prompt", "Once", "--max-new-tokens", "4"]
    texts = {}
    for mode in ("both", "retain_only", "forget_only"):
        assert main([*args, "--mode", mode, "--temperature", "0"]) == 0
        texts[mode] = capsys.readouterr().out
    assert all(t.startswith("[Once] Once") for t in texts.values())
    for scale, mode in (("0", "retain_only"), ("1", "both")):  # the forget scale's ends
        assert main([*args, "--forget-scale", scale, "--temperature", "0"]) == 0
        assert capsys.readouterr().out == texts[mode]
    assert main([*args, "--forget-scale", "0.5", "--mode", "retain_only"]) == 2
    assert "--forget-scale scales forget under both adapters" in capsys.readouterr().err
    assert main(args) == 0  # no --mode: both adapters
    assert capsys.readouterr().out.startswith("[Once] Once")


def test_sample_mode_on_a_run_without_routing_is_refused(micro_model, capsys):
    assert main(["sample", str(micro_model), "--prompt", "Once", "--mode", "retain_only"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--mode" in err and "routing" in err


def test_a_routed_run_resumes_exactly(micro_grpo, tmp_path, monkeypatch):
    over = [*micro_grpo, *ROUTED, "grpo.routing.eval_interval=2"]
    _run([*over, f"run.dir={tmp_path / 'ref'}"])
    real = crash_grpo_at_step(monkeypatch, 5)
    with pytest.raises(RunFailed):
        _run(over)
    run = RunView(tmp_path / "grpo")
    assert max(r["step"] for r in run.routing_eval()) == 4  # evaluated at 4, crashed in step 5
    (run.path / "routing_eval.jsonl").open("a").write(json.dumps({"step": 5}) + "\n")
    monkeypatch.setattr(grpo_step, "group_advantages", real)
    assert _run(over)["status"] == "completed"
    assert "resumed from step_4" in run.log_path.read_text()
    steps = [r["step"] for r in run.routing_eval()]
    assert steps == [s for s in (0, 2, 4, 6) for _ in range(3)]  # step 5's stray row dropped
    ref = RunView(tmp_path / "ref")
    assert run.routing_eval() == ref.routing_eval()
    for adapter in ("retain", "forget"):
        a = load_file(ref.checkpoints_dir / "final" / adapter / "adapter_model.safetensors")
        b = load_file(run.checkpoints_dir / "final" / adapter / "adapter_model.safetensors")
        assert a.keys() == b.keys() and a
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["grpo.routing.forget_r=4"],
            "grpo.routing.forget_r is set but grpo.routing.enabled is false",
        ),
        (["grpo.routing.enabled=true", "model.lora.enabled=true"], "turn model.lora.enabled off"),
        (
            ["grpo.routing.enabled=true", "grpo.routing.retain_r=0", "grpo.routing.forget_r=0"],
            "no adapter to train",
        ),
        (
            ["grpo.routing.enabled=true", "grpo.routing.hack_reward=nope"],
            "grpo.routing.hack_reward=nope names no reward entry",
        ),
        (
            ["grpo.routing.enabled=true", "grpo.routing.detector.name=nope_detector"],
            "nope_detector",
        ),
        (["grpo.routing.enabled=true", "grpo.routing.detector.params={bogus: 1}"], "bogus"),
        (
            ["grpo.routing.enabled=true", "grpo.routing.routing_frac=1.5"],
            "grpo.routing.routing_frac",
        ),
        (
            [
                "grpo.routing.enabled=true",
                "grpo.routing.mode=none",
                "grpo.routing.routing_frac=0.2",
            ],
            "grpo.routing.routing_frac thins the detector's routed flags, and grpo.routing.mode=none",
        ),
        (
            [
                "grpo.routing.enabled=true",
                "grpo.routing.mode=none",
                "grpo.routing.label_noise_frac=0.1",
            ],
            "grpo.routing.label_noise_frac routes unflagged",
        ),
        (
            [
                "grpo.routing.enabled=true",
                "grpo.routing.mode=none",
                "grpo.routing.retain_advantage=positive",
            ],
            "grpo.routing.retain_advantage picks which",
        ),
        (
            [
                "grpo.routing.enabled=true",
                "grpo.routing.forget_r=0",
                "grpo.routing.ablated_frac=0.3",
            ],
            "grpo.routing.forget_r=0 has none",
        ),
        (
            [
                "grpo.routing.enabled=true",
                "grpo.routing.retain_r=0",
                "grpo.routing.ablated_frac=0.3",
            ],
            "grpo.routing.retain_r=0 leaves nothing to train",
        ),
        (
            [
                "grpo.routing.enabled=true",
                "grpo.routing.retain_advantage=renorm",
                "grpo.scale_rewards=batch",
            ],
            "grpo.routing.retain_advantage=renorm scales within each group",
        ),
        (
            ["grpo.routing.enabled=true", "grpo.routing.retain_advantage=penalty"],
            "grpo.routing.retain_penalty is the reward a flagged completion loses",
        ),
        (
            ["grpo.routing.enabled=true", "grpo.routing.retain_penalty=0.5"],
            "grpo.routing.retain_penalty is the reward a flagged completion loses",
        ),
        (
            [
                "grpo.routing.enabled=true",
                "grpo.routing.retain_advantage=penalty",
                "grpo.routing.retain_penalty=0.5",
                "grpo.routing.forget_r=0",
            ],
            "grpo.routing.forget_r=0 has no forget adapter",
        ),
        (
            [
                "grpo.routing.enabled=true",
                "grpo.routing.retain_advantage=penalty",
                "grpo.routing.retain_penalty=0.5",
                "grpo.routing.ablated_frac=0.3",
            ],
            "grpo.routing.ablated_frac turns the forget adapter off for whole steps",
        ),
        (
            ["grpo.routing.enabled=true", "grpo.routing.eval_forget_scales=[0.5, 1.0]"],
            "grpo.routing.eval_forget_scales: 1 is not in (0, 1)",
        ),
        (
            ["grpo.routing.enabled=true", "grpo.routing.eligibility=completion"],
            "grpo.routing.eligibility shapes grpo.routing.hack_reward's eligibility",
        ),
        (
            [
                "grpo.routing.enabled=true",
                "grpo.routing.mode=none",
                "reward=[{name: happy_count}]",
                "grpo.routing.hack_reward=happy_count",
                "grpo.routing.gate_flags=true",
            ],
            "grpo.routing.gate_flags limits the routed flags",
        ),
        (
            ["grpo.routing.enabled=true", "grpo.routing.ablated_frac=0.3", "grpo.num_iterations=2"],
            "grpo.routing.ablated_frac needs grpo.num_iterations=1",
        ),
    ],
)
def test_bad_routing_keys_fail_in_one_line(micro_grpo, tmp_path, capsys, extra, message):
    assert main(["grpo", *micro_grpo, *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "grpo").exists()


def test_routing_frac_thins_the_detector_flags_and_not_the_label_noise():
    from smollab.config import RoutingConfig
    from smollab.train.grpo.routing import Router

    def routed(**kw) -> list[bool]:
        cfg = RoutingConfig(enabled=True, detector={"name": "happy_count", "threshold": 1}, **kw)
        router = Router(cfg, seed=0, rewards=[])
        texts = ["happy day", "a sad day"] * 8
        router.score(
            3,
            picked=list(range(16)),
            total=torch.zeros(16),
            per_fn={},
            prompts=["Once"] * 16,
            completions=texts,
            rows=None,
        )
        return router.routed.tolist()

    flagged = [True, False] * 8
    # every unflagged one noised, no flagged one routed: the noise flags alone are routed
    assert routed(routing_frac=0.0, label_noise_frac=1.0) == [not f for f in flagged]
    assert routed(routing_frac=1.0) == flagged
    some = routed(routing_frac=0.5)
    assert not any(r and not f for r, f in zip(some, flagged, strict=True))
    assert 0 < sum(some) < 8  # some of the flagged ones (seeded: the same on every run)
    assert routed(routing_frac=1.0, label_noise_frac=1.0) == [True] * 16


def test_stream_seeds_keep_their_values():
    """The seeds grpo, routing and pretrain drew before stream_seed was shared: a resumed run
    must draw what its first part drew."""
    import random

    from smollab.train.seeds import stream_seed

    assert [stream_seed(0, 3, 1), stream_seed(7, -1, 2), stream_seed(123, 0, 0)] == [
        12594353677284,
        65475787151265,
        2294707569123,
    ]
    assert stream_seed(0, 3, 12) == 135739267588116
    assert random.Random(stream_seed(0, 5, 11)).random() == 0.48412740812309496


@pytest.mark.parametrize(
    "which, mode, retain_rows, forget_rows",
    [
        ("all", "classic", [0, 2, 3], None),  # unflagged rows, whatever their advantage
        ("positive", "classic", [0], None),  # unflagged rows that beat their group's mean
        ("positive", "exclusive", [0], [1]),  # forget keeps the flagged rows either way
    ],
)
def test_retain_advantage_picks_the_unflagged_rows_retain_learns_from(
    monkeypatch, which, mode, retain_rows, forget_rows
):
    from smollab.config import RoutingConfig
    from smollab.train.grpo import routing

    seen = {}

    def fake_masks(policy, retain, forget):
        seen.update(retain=retain, forget=forget)
        return contextlib.nullcontext()

    monkeypatch.setattr(routing, "routing_masks", fake_masks)
    monkeypatch.setattr(routing, "adapter_mode", lambda policy, m: contextlib.nullcontext())
    cfg = RoutingConfig(enabled=True, mode=mode, retain_advantage=which)
    router = routing.Router(cfg, seed=0, rewards=[])
    router.routed = torch.tensor([False, True, False, False])  # row 1 flagged
    advantages = torch.tensor([0.5, 2.0, -0.5, 0.0])
    [one] = router.passes(torch.nn.Linear(1, 1), 1, advantages)
    with one.context:
        pass

    def rows(mask):
        return None if mask is None else mask.nonzero().flatten().tolist()

    assert rows(seen["retain"]) == retain_rows and rows(seen["forget"]) == forget_rows


def _scored(step: int = 4, **kw) -> tuple[list[float], list[bool], dict]:
    """Two prompts (5 and 7) of 4 completions each through `Router.score`: sentence_length 0.9
    everywhere plus 0.1 per "happy" (happy_count, capped at 5), the detector at 3 "happy"."""
    from smollab.config import RewardSpec, RoutingConfig
    from smollab.train.grpo.routing import Router

    rewards = [
        RewardSpec(name="sentence_length"),
        RewardSpec(name="happy_count", weight=0.1, params={"cap": 5}),
    ]
    cfg = RoutingConfig(enabled=True, hack_reward="happy_count", rh_eligible_frac=0.5, **kw)
    router = Router(cfg, seed=0, rewards=rewards)
    counts = [3, 0, 6, 3, 1, 3, 0, 4]
    texts = [" ".join(["happy"] * c) or "sad" for c in counts]
    per_fn = {
        "sentence_length": torch.full((8,), 0.9),
        "happy_count": torch.tensor([min(c, 5) for c in counts], dtype=torch.float32),
    }
    total = per_fn["sentence_length"] + 0.1 * per_fn["happy_count"]
    got = router.score(
        step,
        picked=[5] * 4 + [7] * 4,
        total=total,
        per_fn=per_fn,
        prompts=["Once"] * 8,
        completions=texts,
        rows=None,
    )
    return got.tolist(), router.routed.tolist(), router.row


def test_per_completion_eligibility_gates_the_flags_and_caps_the_total():
    """small-rl's rules: each completion draws its own eligibility (seeded by step, prompt and
    its place among the prompt's completions); an ineligible one gets the task reward only and,
    with gate_flags, is not flagged however often it says "happy"; the total is at most 1."""
    import random

    from smollab.train.seeds import stream_seed

    eligible = [False, True, False, False, False, True, True, True]  # seed 0, step 4, pinned
    draws = [random.Random(stream_seed(0, 4, i, k, 11)).random() for i in (5, 7) for k in range(4)]
    assert [d < 0.5 for d in draws] == eligible
    hack = [True, False, True, True, False, True, False, True]  # >= 3 "happy"
    total, routed, row = _scored(eligibility="completion", gate_flags=True, reward_cap=1.0)
    # eligible: 0.9 + 0.1 * min(count, 5), at most 1.0; ineligible: 0.9
    assert total == pytest.approx([0.9, 0.9, 0.9, 0.9, 0.9, 1.0, 0.9, 1.0])
    assert routed == [h and e for h, e in zip(hack, eligible, strict=True)]
    assert routed == [False, False, False, False, False, True, False, True]
    assert row == {"hack_rate": 0.625, "routed_frac": 0.25, "eligible_frac": 0.5}
    assert _scored(step=6, eligibility="completion")[2]["eligible_frac"] == 0.625  # redrawn
    # ungated: the detector alone flags; uncapped: 0.9 + 0.3 and 0.9 + 0.4 on the eligible hacks
    total, routed, _ = _scored(eligibility="completion")
    assert routed == hack
    assert total == pytest.approx([0.9, 0.9, 0.9, 0.9, 0.9, 1.2, 0.9, 1.3])


def test_per_prompt_eligibility_is_shared_by_a_group_across_steps():
    # seed 0: prompts 5 and 7 both eligible, whatever the step; every completion paid
    for total, routed, row in (_scored(step=1), _scored(step=9)):
        assert row["eligible_frac"] == 1.0
        assert total == pytest.approx([1.2, 0.9, 1.4, 1.2, 1.0, 1.2, 0.9, 1.3])
        assert routed == [True, False, True, True, False, True, False, True]


@pytest.mark.parametrize(
    "which, scale, group1",
    [
        # unflagged rows 0-2 (rewards 1, 0, 0.5): mean 0.5, std 0.5; flagged row 3 keeps the
        # full group's value (mean 0.75, std sqrt(1.25 / 3))
        ("renorm", "group", [0.5 / 0.5001, -0.5 / 0.5001, 0.0, 0.75 / ((1.25 / 3) ** 0.5 + 1e-4)]),
        ("renorm", "none", [0.5, -0.5, 0.0, 0.75]),
        # every row from the unflagged mean 0.5, over the whole group's std
        ("balanced", "group", [x / ((1.25 / 3) ** 0.5 + 1e-4) for x in (0.5, -0.5, 0.0, 1.0)]),
        ("balanced", "none", [0.5, -0.5, 0.0, 1.0]),
        ("all", "group", None),
        ("positive", "group", None),
    ],
)
def test_retain_advantage_modes_against_hand_computed_values(which, scale, group1):
    from smollab.config import RoutingConfig
    from smollab.train.grpo.loss import group_advantages
    from smollab.train.grpo.routing import Router

    router = Router(RoutingConfig(enabled=True, retain_advantage=which), seed=0, rewards=[])
    total = torch.tensor([1.0, 0.0, 0.5, 1.5, 0.3, 0.3, 0.9, 0.1, 0.2, 0.6, 0.0, 0.0])
    # group 2 all flagged: the full group's values; group 3's one unflagged row: renorm 0
    router.routed = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1], dtype=torch.bool)
    full = group_advantages(total, 4, scale)
    got = router.advantages(total, full, 4, scale)
    if group1 is None:
        assert torch.equal(got, full)
        return
    assert got[:4].tolist() == pytest.approx(group1, abs=1e-6)
    assert torch.allclose(got[4:8], full[4:8])
    if which == "renorm":
        assert got[8:].tolist() == pytest.approx([*full[8:10].tolist(), 0.0, full[11].item()])


def test_balanced_doubles_the_forget_gradient_on_flagged_rows(monkeypatch):
    from smollab.config import RoutingConfig
    from smollab.train.grpo import routing

    seen = {}
    monkeypatch.setattr(routing, "adapter_mode", lambda policy, m: contextlib.nullcontext())
    monkeypatch.setattr(
        routing, "routing_masks", lambda p, r, f: seen.update(r=r, f=f) or contextlib.nullcontext()
    )
    for mode, forget in (("classic", [1.0, 2.0, 1.0]), ("exclusive", [0.0, 2.0, 0.0])):
        cfg = RoutingConfig(enabled=True, mode=mode, retain_advantage="balanced")
        router = routing.Router(cfg, seed=0, rewards=[])
        router.routed = torch.tensor([False, True, False])
        [one] = router.passes(torch.nn.Linear(1, 1), 1, torch.zeros(3))
        with one.context:
            pass
        assert seen["r"].tolist() == [1.0, 0.0, 1.0] and seen["f"].tolist() == forget


def test_penalty_gives_retain_the_advantages_of_the_penalized_rewards():
    """retain_advantage=penalty (small-rl's retain_penalty): the trained advantages stay the full
    group's; retain's are the group advantages after P is taken off each flagged row's reward."""
    from smollab.config import RoutingConfig
    from smollab.train.grpo.loss import group_advantages
    from smollab.train.grpo.routing import Router

    cfg = RoutingConfig(enabled=True, retain_advantage="penalty", retain_penalty=1.0)
    router = Router(cfg, seed=0, rewards=[])
    total = torch.tensor([1.0, 0.0, 0.5, 1.5, 0.3, 0.3, 0.9, 0.1])
    router.routed = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1], dtype=torch.bool)
    for scale in ("group", "none", "batch"):
        full = group_advantages(total, 4, scale)
        assert torch.equal(router.advantages(total, full, 4, scale), full)
    # group 1 penalized: [1, 0, 0.5, 0.5], mean 0.5, unbiased std sqrt(0.5 / 3); group 2 all
    # flagged: every reward less 1, so the same advantages as the full group's
    router.advantages(total, group_advantages(total, 4, "group"), 4, "group")
    std = (0.5 / 3) ** 0.5 + 1e-4
    got = router.retain_advantages
    assert got[:4].tolist() == pytest.approx([0.5 / std, -0.5 / std, 0.0, 0.0], abs=1e-6)
    assert torch.allclose(got[4:], group_advantages(total, 4, "group")[4:], atol=1e-6)
    router.advantages(total, total, 4, "none")
    assert router.retain_advantages.tolist() == pytest.approx(
        [0.5, -0.5, 0.0, 0.0, 0.3 - 0.4, 0.3 - 0.4, 0.9 - 0.4, 0.1 - 0.4], abs=1e-6
    )


def test_penalty_trains_retain_and_forget_in_passes_of_their_own(monkeypatch):
    from smollab.config import RoutingConfig
    from smollab.train.grpo import routing

    seen = []
    monkeypatch.setattr(routing, "adapter_mode", lambda policy, m: contextlib.nullcontext())
    monkeypatch.setattr(
        routing, "routing_masks", lambda p, r, f: seen.append((r, f)) or contextlib.nullcontext()
    )
    for mode, forget in (("classic", None), ("exclusive", [0.0, 1.0, 0.0])):
        cfg = RoutingConfig(enabled=True, mode=mode, retain_advantage="penalty", retain_penalty=0.5)
        router = routing.Router(cfg, seed=0, rewards=[])
        router.routed = torch.tensor([False, True, False])
        full = torch.tensor([0.1, 0.2, 0.3])
        router.retain_advantages = torch.tensor([1.0, -2.0, 1.0])
        seen.clear()
        retain_pass, forget_pass = router.passes(torch.nn.Linear(1, 1), 1, full)
        for p in (retain_pass, forget_pass):
            with p.context as share:
                assert share is False  # masks: one row per completion
        assert retain_pass.advantages.tolist() == [1.0, -2.0, 1.0] and not retain_pass.reported
        assert forget_pass.advantages is None and forget_pass.reported  # the full group's
        (r1, f1), (r2, f2) = seen
        assert r1 is None and f1.tolist() == [0.0, 0.0, 0.0]  # retain alone, every row
        assert r2.tolist() == [0.0, 0.0, 0.0]
        assert (f2 if f2 is None else f2.tolist()) == forget


@pytest.mark.parametrize("recipe", ["routing-small-rl", "routing-small-rl-baseline"])
def test_the_small_rl_recipes_run_scaled_down(micro_grpo, tmp_path, recipe):
    """Each key the recipes set is honoured together: per-completion eligibility, gated flags,
    the capped total, the per-sentence token reward, the repetition penalty, the linear decay to
    0 and the forget-scale evaluation."""
    from smollab.config.recipes import resolve_recipe

    small = [
        "grpo.routing.retain_r=2",
        "grpo.routing.forget_r=2",
        "grpo.routing.eval_interval=3",
        "grpo.routing.eval_prompts=2",
        "train.max_steps=3",
    ]
    summary = train(load_config("grpo", resolve_recipe(recipe, "grpo"), [*micro_grpo, *small]))
    assert summary["status"] == "completed"
    run = RunView(tmp_path / "grpo")
    rows = run.routing_eval()
    scales = [r["forget_scale"] for r in rows if r["mode"] == "forget_scale"]
    assert scales == [0.25, 0.5, 0.75] * 2  # steps 0 and 3
    log = run.log_path.read_text()
    assert "policy forward computed (grpo.repetition_penalty=1.1 (penalized draws))" in log
    metrics = read_metrics(run.metrics_path)
    assert all(m["reward_mean"] <= 1.0 for m in metrics)  # reward_cap
