"""GRPO seconds per optimizer step and reward: `smollab grpo` vs TRL's `GRPOTrainer` (never run by CI).

Both start from the same model directory (default: the SimpleStories-1.25M-shaped run /tmp/runs/ss1;
if absent, one is pretrained with configs/pretrain/simplestories-1.25m.yaml and
train.max_steps=300) and use the same settings: prompts are the first 8 tokens of stories of
`train.jsonl` (the first 20,000, as smollab draws them), each prefixed by the EOS token; TRL gets
them as plain-text prompts ("[EOS]" + decoded text, which tokenizes back to the same ids; the match
rate is printed), not conversations, so no chat template is involved. Reward `happy_binary`
(smollab's function for both), 32 completions per step = 2 prompts x 16 generations, at most 64
new tokens, temperature 1.0, beta 0.02, the same precision (`--precision`, default fp32) on the CPU, the same loss type, reward scaling,
clipping epsilon, AdamW betas/eps/weight decay, grad clip and a constant LR: 1e-5 full fine-tuning,
1e-4 LoRA r8 (alpha 16, on q, k, v, o, gate, up, down). Completions end at the tokenizer's EOS
only (TRL would also stop at any other EOS id the model's config declares). TRL runs without
bf16 and without gradient checkpointing, its CPU defaults, which are slower at this size
(docs/architecture.md, the measured CPU facts).

Per mode (full, LoRA) each implementation trains `--steps` steps from the base in a process of its
own (no shared OpenMP pool or allocator), and the two take turns step by step: after each step a
process waits on a pipe until the other has done its step. So both see the same minutes of the
machine, whose speed drifts by 10-25% over tens of seconds on a shared VM: alternating whole runs
(A B) measured 2.52x in one run and 2.86x in another, a spread larger than the change between
them. `--repeats 2` runs two such pairs.
(Two threads of one process handing over after every step slowed smollab's decoding 2.5x and
TRL's 1.4x against their standalone speeds: that measured neither.)
After training, the reward is compared on one footing: the base and both final policies (LoRA
merged) sample 16 completions for each of 64 test-split prompts through smollab's sampler with
one seed, and the mean happy_binary reward is printed with its standard error.
Printed per mode: the median seconds per optimizer step after `--warmup` steps (smollab: its
own `step_s` of metrics.csv, generation through the optimizer step; TRL: a TrainerCallback from
on_step_begin to on_step_end) and their ratio, and the same for each process's wall clock per turn
(smollab's metrics, logging and samples file included); the mean training-batch reward over the
first and the last 5 steps and the mean completion length; and where each spends its step (TRL's
split comes from timing its methods: `_generate`, `_calculate_rewards`, the no-grad reference
forward, `compute_loss`, and the rest: backward and AdamW).

    python benchmarks/grpo_vs_trl.py [--model /tmp/runs/ss1] [--data-dir /tmp/stories]
                                     [--steps 50] [--warmup 3] [--modes full,lora]
                                     [--repeats 1] [--precision fp32|bf16] [--quick]
                                     [--batch 32] [--generations 16] [--lora-r 8]
                                     [--held-out 64]

`--model` takes any HF model directory (a Qwen2.5-0.5B-shaped replica from
`tests.replicas.build_replica`, say); its weights load in fp32 on both sides. `--batch`,
`--generations` and `--lora-r` (alpha 2r, every linear) set the step's shape for both.

Needs TRL: pip install -e ".[bench]".
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PRETRAIN_RECIPE = REPO / "configs" / "pretrain" / "simplestories-1.25m.yaml"
RECIPES = {
    "full": REPO / "configs" / "grpo" / "happy.yaml",
    "lora": REPO / "configs" / "grpo" / "happy-lora.yaml",
}
LR = {"full": 1e-5, "lora": 1e-4}
LORA_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT_POOL = 20_000  # smollab's train prompts: the first 20,000 stories
HELD_OUT_SAMPLES = 16  # held-out evaluation: samples of each test-split prompt (--held-out)
IMPLS = ("smollab", "trl")


def ensure_model(args) -> Path:
    from smollab.models.loading import resolve_model_dir

    if not Path(args.model).exists():
        from smollab.config.load import load_config
        from smollab.train.pretrain import train

        print(
            f"{args.model} not found: pretraining it ({PRETRAIN_RECIPE.name}, 300 steps) ...",
            flush=True,
        )
        train(
            load_config(
                "pretrain",
                PRETRAIN_RECIPE,
                [f"data.dir={args.data_dir}", "train.max_steps=300", f"run.dir={args.model}"],
            )
        )
    return Path(resolve_model_dir(str(args.model)))


def smollab_cfg(args, mode: str, model_dir: Path, run_dir: Path):
    from smollab.config.load import load_config

    over = [
        f"model.path={model_dir}",
        f"data.dir={args.data_dir}",
        f"train.max_steps={args.steps}",
        f"train.batch_size={args.batch}",
        "train.log_interval=1",
        f"train.eval_interval={args.steps if args.held_out else 0}",  # TRL evaluates nothing
        f"train.save_interval={10**9}",
        "grpo.prompt_tokens=8",
        f"grpo.num_generations={args.generations}",
        "grpo.max_completion_length=64",
        "grpo.temperature=1.0",
        "grpo.top_p=1.0",
        "grpo.top_k=0",
        "grpo.beta=0.02",
        "grpo.num_iterations=1",
        f"optim.lr={LR[mode]}",
        "optim.schedule=constant",
        "optim.warmup_steps=0",
        "perf.device=cpu",
        f"perf.precision={args.precision}",
        "failure.action=flag",
        f"run.dir={run_dir}",
        "run.resume=never",
    ]
    if mode == "lora":
        over += [
            "model.lora.enabled=true",
            f"model.lora.r={args.lora_r}",
            f"model.lora.alpha={2 * args.lora_r}",
            "model.lora.dropout=0.0",
            "model.lora.targets=[q,k,v,o,gate,up,down]",
            "grpo.export_merged=true",
        ]
    cfg = load_config("grpo", RECIPES[mode], over)
    names = [r.name for r in cfg.reward]
    if names != ["happy_binary"]:
        raise SystemExit(f"{RECIPES[mode]}: expected the single reward happy_binary, got {names}")
    return cfg


class Turns:
    """The child's side of the turn-taking: after a step, say so and wait for the parent's go.

    `wall_s` collects each turn's wall clock, from the go to the next step's end.
    """

    def __init__(self):
        go, done = (int(x) for x in os.environ["GRPO_BENCH_FDS"].split(","))
        self.go, self.done = os.fdopen(go, "rb", buffering=0), os.fdopen(done, "wb", buffering=0)
        self.wall_s: list[float] = []
        self.t = None

    def step_done(self) -> None:
        if self.t is not None:
            self.wall_s.append(time.perf_counter() - self.t)
        self.done.write(b".")
        self.go.read(1)  # b"" if the parent is gone: go on alone
        self.t = time.perf_counter()


def held_out_reward(model, tokenizer, data_dir: str, n: int) -> list[float]:
    """happy_binary of HELD_OUT_SAMPLES samples of each of `n` test-split prompts, drawn by one
    sampler with one seed for every model: the reward after training, on the same footing."""
    from smollab.engine.sampler import Sampler
    from smollab.rewards.happy import happy_binary
    from smollab.train.prompts import story_prompts

    k = HELD_OUT_SAMPLES
    if n == 0:
        return []
    prompts = story_prompts(data_dir, "test", tokenizer, 8, n)
    eos = tokenizer.eos_token_id
    r = Sampler(model.eval(), eos_token_id=eos, pad_token_id=eos).generate(
        [p for p in prompts for _ in range(k)], 64, seed=1234
    )
    return happy_binary(r.completion_texts(tokenizer))


def run_smollab(cfg, turns: Turns, n_held_out: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import smollab.train.grpo.run as grpo
    from smollab.rundir.runs import read_metrics

    class TurnTakingProgress(grpo.Progress):
        def update(self, step, **info):  # called after every step, outside its step_s
            super().update(step, **info)
            turns.step_done()

    grpo.Progress = TurnTakingProgress
    grpo.train(cfg)
    rows = read_metrics(Path(cfg.run.dir) / "metrics.csv")
    keys = ("step_s", "gen_s", "reward_s", "ref_s", "train_s", "reward_mean", "completion_len")
    final = (
        Path(cfg.run.dir) / "checkpoints" / ("final_merged" if cfg.model.lora.enabled else "final")
    )
    model = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    held_out = held_out_reward(
        model, AutoTokenizer.from_pretrained(final), cfg.data.dir, n_held_out
    )
    return {k: [r[k] for r in rows] for k in keys} | {"wall_s": turns.wall_s, "held_out": held_out}


def trl_prompts(data_dir: str, tokenizer) -> tuple[list[str], float]:
    """smollab's prompt ids as text for TRL, and the fraction that tokenizes back to the same ids."""
    from smollab.train.prompts import story_prompts

    ids = story_prompts(data_dir, "train", tokenizer, 8, PROMPT_POOL)
    texts = [tokenizer.eos_token + tokenizer.decode(p[1:]) for p in ids]
    back = tokenizer(texts)["input_ids"]  # as TRL tokenizes plain-text prompts
    same = sum(a == list(b) for a, b in zip(ids, back, strict=True)) / len(ids)
    return texts, same


def run_trl(cfg, mode: str, model_dir: Path, out_dir: Path, turns: Turns, n_held_out: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from smollab.rewards.happy import happy_binary

    g, oc = cfg.grpo, cfg.optim
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    texts, same = trl_prompts(cfg.data.dir, tokenizer)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="sdpa"
    )
    # TRL stops a completion at every EOS id the model's generation config declares, besides the
    # tokenizer's. smollab stops only at the tokenizer's EOS: give TRL that one alone.
    eos = tokenizer.eos_token_id
    declared = model.generation_config.eos_token_id
    eos_note = None
    if declared not in (eos, [eos]):
        names = tokenizer.convert_ids_to_tokens(
            declared if isinstance(declared, list) else [declared]
        )
        eos_note = (
            f"the model declares eos_token_id {declared} ({', '.join(map(str, names))}), "
            f"the tokenizer {eos} ({tokenizer.eos_token}): TRL given {eos} only"
        )
        model.generation_config.eos_token_id = eos
        model.config.eos_token_id = eos
    peft_config = None
    if mode == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=cfg.model.lora.r,
            lora_alpha=cfg.model.lora.alpha,
            lora_dropout=0.0,
            target_modules=LORA_MODULES,
            task_type="CAUSAL_LM",
        )
    targs = GRPOConfig(
        output_dir=str(out_dir),
        per_device_train_batch_size=cfg.train.batch_size,
        num_generations=cfg.grpo.num_generations,
        max_completion_length=64,
        beta=0.02,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        num_iterations=1,
        loss_type=g.loss_type,
        scale_rewards=g.scale_rewards,
        epsilon=g.epsilon,
        epsilon_high=g.epsilon_high or g.epsilon,
        mask_truncated_completions=g.mask_truncated_completions,
        learning_rate=LR[mode],
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=oc.beta1,
        adam_beta2=oc.beta2,
        adam_epsilon=oc.eps,
        weight_decay=oc.weight_decay,
        max_grad_norm=oc.grad_clip or 1e9,
        max_steps=cfg.train.max_steps,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=cfg.perf.precision == "bf16",
        fp16=False,
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        seed=cfg.run.seed,
        disable_tqdm=True,
        log_completions=False,
    )

    split: dict[str, list[float]] = defaultdict(list)
    cur: dict[str, float] = defaultdict(float)
    rewards: list[float] = []
    lengths: list[float] = []
    inner: list[float] = []

    class StepClock(TrainerCallback):
        t0 = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            cur.clear()
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            inner.append(time.perf_counter() - self.t0)
            for k in ("gen", "reward", "ref", "score", "loss"):
                split[k].append(cur.get(k, 0.0))
            turns.step_done()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))
                lengths.append(float(logs.get("completions/mean_length", float("nan"))))

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=happy_binary,
        args=targs,
        train_dataset=Dataset.from_dict({"prompt": texts}),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[StepClock()],
    )

    def timed(name: str, key_fn=None):
        fn = getattr(trainer, name)

        def wrapper(*a, **k):
            key = key_fn() if key_fn else name
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                if key:
                    cur[key] += time.perf_counter() - t

        setattr(trainer, name, wrapper)

    timed("_generate", lambda: "gen")
    timed("_calculate_rewards", lambda: "reward")
    timed("_get_per_token_logps_and_entropies", lambda: None if torch.is_grad_enabled() else "ref")
    timed("_generate_and_score_completions", lambda: "score")
    timed("compute_loss", lambda: "loss")
    trainer.train()
    held_out = held_out_reward(trainer.model, tokenizer, cfg.data.dir, n_held_out)
    return {
        "step_s": inner,
        "wall_s": turns.wall_s,
        "split": dict(split),
        "reward_mean": rewards,
        "completion_len": lengths,
        "prompt_match": same,
        "eos_note": eos_note,
        "n_prompts": len(texts),
        "held_out": held_out,
    }


def run_pair(args, mode: str, model_dir: Path, tmp: Path, rep: int) -> dict[str, dict]:
    """Both implementations in processes of their own, one step each in turn; figures as JSON.

    Their first steps overlap (each starts on its own), then smollab and TRL alternate, the one
    to go first swapping every round.
    """
    procs, pipes, outs = {}, {}, {}
    for impl in IMPLS:
        outs[impl] = tmp / f"{impl}-{mode}-{rep}.json"
        go_r, go_w = os.pipe()
        done_r, done_w = os.pipe()
        cmd = [
            sys.executable,
            __file__,
            "--child",
            impl,
            "--modes",
            mode,
            "--model",
            str(model_dir),
            "--data-dir",
            args.data_dir,
            "--steps",
            str(args.steps),
            "--precision",
            args.precision,
            "--threads",
            str(args.threads),
            "--batch",
            str(args.batch),
            "--generations",
            str(args.generations),
            "--lora-r",
            str(args.lora_r),
            "--held-out",
            str(args.held_out),
            "--out",
            str(outs[impl]),
        ]
        env = dict(os.environ, GRPO_BENCH_FDS=f"{go_r},{done_w}")
        log = open(tmp / f"{impl}-{mode}-{rep}.log", "w")  # a file, not a pipe nobody reads mid-run
        procs[impl] = subprocess.Popen(
            cmd, env=env, pass_fds=(go_r, done_w), stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        os.close(go_r)
        os.close(done_w)
        pipes[impl] = (os.fdopen(go_w, "wb", buffering=0), os.fdopen(done_r, "rb", buffering=0))
    running = [impl for impl in IMPLS if pipes[impl][1].read(1)]  # first steps done
    turn = 0
    while running:
        for impl in running if turn % 2 == 0 else running[::-1]:
            go, done = pipes[impl]
            go.write(b".")
            if not done.read(1):  # the process ended instead of finishing another step
                running = [x for x in running if x != impl]
        turn += 1
    for impl in IMPLS:
        if procs[impl].wait():
            sys.stderr.write((tmp / f"{impl}-{mode}-{rep}.log").read_text()[-6000:])
            raise SystemExit(f"{impl} ({mode}) failed with exit code {procs[impl].returncode}")
    return {impl: json.loads(outs[impl].read_text()) for impl in IMPLS}


def child(args) -> None:
    mode, tmp = args.modes, Path(args.out).parent
    cfg = smollab_cfg(args, mode, Path(args.model), tmp / f"smollab-{mode}-{Path(args.out).stem}")
    turns = Turns()
    with contextlib.redirect_stdout(io.StringIO()):
        if args.child == "smollab":
            res = run_smollab(cfg, turns, args.held_out)
        else:
            out = tmp / f"trl-{Path(args.out).stem}"
            res = run_trl(cfg, mode, Path(args.model), out, turns, args.held_out)
    Path(args.out).write_text(json.dumps(res))


def merge(runs: list[dict], w: int) -> dict:
    """Repeats of one implementation -> their post-warm-up steps pooled (rewards from the first)."""
    out = {k: v for k, v in runs[0].items()}
    out["step_s"] = [x for r in runs for x in r["step_s"][w:]]
    out["wall_s"] = [x for r in runs for x in r["wall_s"][max(w - 1, 0) :]]  # turns start at step 2
    for key in ("gen_s", "reward_s", "ref_s", "train_s"):
        if key in out:
            out[key] = [x for r in runs for x in r[key][w:]]
    if "split" in out:
        out["split"] = {k: [x for r in runs for x in r["split"][k][w:]] for k in out["split"]}
    return out


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def report(
    mode: str, s: dict, t: dict, runs: dict, wall: float, loads, base_held_out, lora_r: int
) -> None:
    n = len(runs["smollab"][0]["reward_mean"])
    k = 5
    title = (
        "full fine-tuning, lr 1e-5"
        if mode == "full"
        else f"LoRA r{lora_r} alpha {2 * lora_r} (q,k,v,o,gate,up,down), lr 1e-4"
    )
    print(
        f"== {title}: {n} steps each x {len(runs['smollab'])}, taking turns step by step "
        f"({wall:.0f} s); load average 1/5/15 min before "
        f"{'/'.join(f'{x:.2f}' for x in loads[0])}, after "
        f"{'/'.join(f'{x:.2f}' for x in loads[1])}"
    )
    print(
        f"{'':10s}{'s/step':>8s}{'p25':>7s}{'p75':>7s}"
        f"{f'reward 1-{k}':>13s}{f'reward {n - k + 1}-{n}':>14s}{'mean len':>10s}"
    )
    for name, r, reps in (("smollab", s, runs["smollab"]), ("TRL", t, runs["trl"])):
        steps = r["step_s"]
        q = statistics.quantiles(steps, n=4) if len(steps) > 1 else [med(steps)] * 3
        first = mean([mean(x["reward_mean"][:k]) for x in reps])
        last = mean([mean(x["reward_mean"][n - k : n]) for x in reps])
        length = mean([mean(x["completion_len"][:n]) for x in reps])
        print(
            f"{name:10s}{med(steps):8.3f}{q[0]:7.3f}{q[2]:7.3f}{first:13.3f}{last:14.3f}"
            f"{length:10.1f}"
        )
    if base_held_out:  # --held-out 0: no reward check
        n_p, k_s = len(base_held_out) // HELD_OUT_SAMPLES, HELD_OUT_SAMPLES
        line = [
            f"held-out reward after {n} steps ({n_p} test prompts x {k_s}, one sampler and seed):"
        ]
        for name, reps in (
            ("base", [{"held_out": base_held_out}]),
            ("smollab", runs["smollab"]),
            ("TRL", runs["trl"]),
        ):
            vals = reps[0]["held_out"]  # repeats train the same weights: one sample, not several
            se = statistics.pstdev(vals) / len(vals) ** 0.5
            line.append(f"{name} {mean(vals):.3f} +- {se:.3f}")
        print(" ".join(line[:1]) + " " + ", ".join(line[1:]))
    print(
        f"TRL / smollab seconds per step: {med(t['step_s']) / med(s['step_s']):.2f}x "
        f"(ratio of medians); wall clock per turn, everything included: TRL {med(t['wall_s']):.3f} s, "
        f"smollab {med(s['wall_s']):.3f} s, {med(t['wall_s']) / med(s['wall_s']):.2f}x"
    )
    sm = {key: mean(s[key]) for key in ("gen_s", "reward_s", "ref_s", "train_s", "step_s")}
    print(
        f"smollab split (mean s): gen {sm['gen_s']:.3f}, reward {sm['reward_s']:.3f}, "
        f"ref {sm['ref_s']:.3f}, train {sm['train_s']:.3f} of {sm['step_s']:.3f}"
    )
    sp = {key: mean(v) for key, v in t["split"].items()}
    total = mean(t["step_s"])
    if sp:
        other_score = sp["score"] - sp["gen"] - sp["reward"] - sp["ref"]
        rest = total - sp["score"] - sp["loss"]
        parts = [
            ("generate", sp["gen"]),
            ("reward", sp["reward"]),
            ("ref fwd", sp["ref"]),
            ("other scoring", other_score),
            ("policy fwd+loss", sp["loss"]),
            ("backward+AdamW+rest", rest),
        ]
        print(
            "TRL split (mean s): "
            + ", ".join(f"{label} {v:.3f} ({100 * v / total:.0f}%)" for label, v in parts)
            + f" of {total:.3f}"
        )
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", default="/tmp/runs/ss1", help="run dir or HF model dir (made if absent)"
    )
    ap.add_argument("--data-dir", default="/tmp/stories", help="prepared data dir with train.jsonl")
    ap.add_argument("--steps", type=int, default=50, help="optimizer steps per implementation")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the timing")
    ap.add_argument("--modes", default="full,lora", help="comma list of full, lora")
    ap.add_argument("--repeats", type=int, default=1, help="turn-taking pairs of runs per mode")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"], help="for both")
    ap.add_argument("--batch", type=int, default=32, help="completions per step")
    ap.add_argument("--generations", type=int, default=16, help="completions per prompt")
    ap.add_argument("--lora-r", type=int, default=8, help="LoRA rank (alpha twice it)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument(
        "--held-out", type=int, default=64, help="test prompts of the reward check (0: none)"
    )
    ap.add_argument("--quick", action="store_true", help="8 steps per implementation")
    ap.add_argument("--child", choices=["smollab", "trl"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.steps = min(args.steps, 8)
    args.warmup = min(args.warmup, args.steps - 1)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not set(modes) <= {"full", "lora"}:
        raise SystemExit(f"--modes: expected full and/or lora, got {args.modes}")

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        import trl
    except ImportError:
        raise SystemExit('TRL is not installed: pip install -e ".[bench]"') from None
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if args.child:
        child(args)
        return
    model_dir = ensure_model(args)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_held_out = held_out_reward(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        AutoTokenizer.from_pretrained(model_dir),
        args.data_dir,
        args.held_out,
    )
    tmp = Path(tempfile.mkdtemp(prefix="smollab-bench-grpo-"))
    print(
        f"model {model_dir}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"transformers {transformers.__version__}, trl {trl.__version__}; {os.cpu_count()} CPUs; "
        f"batch {args.batch} = {args.batch // args.generations} prompts x {args.generations}, "
        f"<= 64 new tokens, T 1.0, beta 0.02, {args.precision}"
    )
    print(
        "s/step: smollab = metrics.csv step_s; TRL = on_step_begin..on_step_end. "
        f"Medians after {args.warmup} warm-up steps; rewards = training-batch means\n"
    )
    for mode in modes:
        runs: dict[str, list[dict]] = {"smollab": [], "trl": []}
        load0, t0 = os.getloadavg(), time.perf_counter()
        for rep in range(args.repeats):
            pair = run_pair(args, mode, model_dir, tmp, rep)
            for impl in IMPLS:
                runs[impl].append(pair[impl])
        s, t = merge(runs["smollab"], args.warmup), merge(runs["trl"], args.warmup)
        wall = time.perf_counter() - t0
        report(mode, s, t, runs, wall, (load0, os.getloadavg()), base_held_out, args.lora_r)
        if mode == modes[-1]:
            print(
                f"TRL prompts: {t['n_prompts']:,} texts, {100 * t['prompt_match']:.1f}% tokenize "
                f"back to smollab's ids; run directories under {tmp}"
            )
            if t["eos_note"]:
                print(f"note: {t['eos_note']}")


if __name__ == "__main__":
    main()
