"""Do full-model lanes pay for pretraining on this CPU? Lanes vs packed processes (never run by CI).

The workload is the LR-sweep recipe's (src/smollab/configs/sweeps/lr-1.25m.yaml: the
SimpleStories-1.25M preset of configs/pretrain/simplestories-1.25m.yaml, 32 x 128 tokens a step,
fp32, AdamW with weight decay on 2-D weights, grad clip, warmup + cosine LR), at the recipe's
batch and at smaller ones, where per-op overhead weighs more. Measured in one invocation:

- single: one model in this process, all threads: smollab's pretraining step built from
  `smollab.train.pretrain`'s own pieces (`build_model`, `make_adamw` with the runtime's AdamW,
  `get_batch` with `pretrain.batch_generator`, `lr_at`, `scaffold.optimizer_step`).
- lanes N: N copies of the model stacked with a lane dimension (`torch.func.stack_module_state`),
  one forward/backward over all lanes (`torch.vmap` over `torch.func.functional_call` of the HF
  Llama; SDPA on its math backend, which vmap batches; the CPU flash kernel has no batching rule
  and would loop over lanes), the loss summed over lanes so each lane's gradient is its own, then
  per-lane grad clipping and one AdamW over the stacked tensors with per-lane LR (each lane its
  trial's LR schedule) and weight decay: foreach ops over [N, ...] tensors, written here, since
  torch's AdamW takes one LR per parameter group. Each lane draws its own batch.
- packed N: N processes of the single step, threads split as `smollab probe` splits them
  (max(1, threads // N) each), released together and timed over the same window.
- 2 x K lanes: 2 processes of K lanes each, one thread each: lanes without intra-op threading,
  which on 2 cores costs more than the lanes save.

Every figure is aggregate tokens/s (all lanes or all processes), the best of `--rounds` timed
windows of `--seconds` each after `--warmup` steps. A check first trains 2 lanes and the 2
standalone runs for a few steps and prints how far their weights are apart.

    python benchmarks/pretrain_lanes.py [--data-dir /tmp/stories] [--batches 32,4,1]
                                        [--lanes 2,4,8] [--seconds 8] [--rounds 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SWEEP = REPO / "src" / "smollab" / "configs" / "sweeps" / "lr-1.25m.yaml"


def sweep_cfg(data_dir: str):
    """The sweep's base recipe with its overrides, and its LR grid."""
    import yaml

    from smollab.config.load import load_config

    spec = yaml.safe_load(SWEEP.read_text())
    over = [f"{k}={v}" for k, v in spec["overrides"].items()]
    over += [f"data.dir={data_dir}", "perf.device=cpu"]
    cfg = load_config("pretrain", REPO / spec["base"], over)
    return cfg, [float(v) for v in spec["space"]["optim.lr"]]


class Single:
    """One model, one optimizer: `smollab.train.pretrain`'s step, from its own pieces."""

    def __init__(self, cfg, tokens, vocab: int, batch: int, lr: float | None = None):
        import torch

        from smollab.device.runtime import make_adamw, setup_runtime
        from smollab.models.loading import build_model

        self.cfg, self.tokens, self.batch = cfg, tokens, batch
        self.oc = cfg.optim.model_copy(update={"lr": lr}) if lr is not None else cfg.optim
        self.rt = setup_runtime(cfg.perf)
        torch.manual_seed(cfg.run.seed)
        self.model = build_model(
            cfg.model, vocab_size=vocab, attn_implementation=cfg.perf.attn_implementation
        )
        self.params = list(self.model.parameters())
        decay = [p for p in self.params if p.dim() >= 2]
        no_decay = [p for p in self.params if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": self.oc.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        self.opt = make_adamw(
            groups, self.rt, self.oc.lr, (self.oc.beta1, self.oc.beta2), self.oc.eps
        )
        self.step_i = 0
        self.tokens_per_step = batch * cfg.train.seq_len

    def step(self) -> None:
        import torch.nn.functional as F

        from smollab.data.tokens import get_batch
        from smollab.train import scaffold
        from smollab.train.pretrain import batch_generator
        from smollab.train.schedule import lr_at

        tc = self.cfg.train
        lr = lr_at(self.step_i, self.oc, tc.max_steps)
        for g in self.opt.param_groups:
            g["lr"] = lr
        x, y = get_batch(
            self.tokens,
            self.batch,
            tc.seq_len,
            batch_generator(self.cfg.run.seed, self.step_i, 0, 0),
        )
        logits = self.model(input_ids=x).logits
        F.cross_entropy(logits.float().flatten(0, 1), y.flatten()).backward()
        scaffold.optimizer_step(self.params, self.opt, None, self.oc.grad_clip)
        self.step_i += 1


class Lanes:
    """N models as stacked weights [N, ...]: one vmapped forward/backward, one per-lane AdamW."""

    def __init__(self, cfg, tokens, vocab: int, batch: int, lrs: list[float]):
        import torch
        from torch.func import stack_module_state

        from smollab.device.runtime import setup_runtime
        from smollab.models.loading import build_model

        setup_runtime(cfg.perf)  # threads and allocator as the single run has them
        self.cfg, self.tokens, self.batch, self.n = cfg, tokens, batch, len(lrs)
        self.optims = [cfg.optim.model_copy(update={"lr": lr}) for lr in lrs]
        models = []
        for _ in lrs:  # the sweep's trials share seed 0: the same init, the same data order
            torch.manual_seed(cfg.run.seed)
            models.append(
                build_model(
                    cfg.model, vocab_size=vocab, attn_implementation=cfg.perf.attn_implementation
                )
            )
        self.params, self.buffers = stack_module_state(models)
        self.base = copy.deepcopy(models[0]).to("meta")
        self.base.tie_weights()  # .to() unties the LM head from the embedding; the lanes tie it
        self.names = list(self.params)
        self.p = [self.params[k] for k in self.names]
        self.decay = [p.dim() >= 3 for p in self.p]  # 2-D weights of a lane: [N, out, in]
        self.m = [torch.zeros_like(p) for p in self.p]
        self.v = [torch.zeros_like(p) for p in self.p]
        self.step_i = 0
        self.tokens_per_step = self.n * batch * cfg.train.seq_len

    def lane_state(self, i: int) -> dict:
        return {k: p[i] for k, p in self.params.items()}

    def _loss(self, params, buffers, x, y):
        import torch.nn.functional as F
        from torch.func import functional_call

        logits = functional_call(self.base, (params, buffers), (x,)).logits
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def step(self) -> None:
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from smollab.data.tokens import get_batch
        from smollab.train.pretrain import batch_generator
        from smollab.train.schedule import lr_at

        tc, n = self.cfg.train, self.n
        xs, ys = zip(
            *(
                get_batch(
                    self.tokens,
                    self.batch,
                    tc.seq_len,
                    batch_generator(self.cfg.run.seed, self.step_i, 0, 0),
                )
                for _ in range(n)
            ),
            strict=True,
        )
        with sdpa_kernel(SDPBackend.MATH):
            losses = torch.vmap(self._loss)(
                self.params, self.buffers, torch.stack(xs), torch.stack(ys)
            )
        losses.sum().backward()
        lr = torch.tensor([lr_at(self.step_i, oc, tc.max_steps) for oc in self.optims])
        self._adamw([p.grad for p in self.p], lr)
        for p in self.p:
            p.grad = None
        self.step_i += 1

    def _adamw(self, grads, lr) -> None:
        """torch.optim.AdamW's arithmetic, after per-lane clip_grad_norm_, with a per-lane LR."""
        import torch

        with torch.no_grad():
            self._adamw_update(grads, lr)

    def _adamw_update(self, grads, lr) -> None:
        import torch

        oc, n = self.optims[0], self.n

        def lanes(t, p):  # a per-lane scalar [N] shaped to broadcast over p [N, ...]
            return t.view(n, *([1] * (p.dim() - 1)))

        sq = torch.stack([g.pow(2).flatten(1).sum(1) for g in grads]).sum(0)
        coef = (oc.grad_clip / (sq.sqrt() + 1e-6)).clamp(max=1.0)
        if oc.grad_clip > 0:
            torch._foreach_mul_(grads, [lanes(coef, g) for g in grads])
        b1, b2, t = oc.beta1, oc.beta2, self.step_i + 1
        bc1, bc2 = 1 - b1**t, 1 - b2**t
        wd = torch.tensor([o.weight_decay for o in self.optims])
        decayed = [p for p, d in zip(self.p, self.decay, strict=True) if d]
        torch._foreach_mul_(decayed, [lanes(1 - lr * wd, p) for p in decayed])
        torch._foreach_lerp_(self.m, grads, 1 - b1)
        torch._foreach_mul_(self.v, b2)
        torch._foreach_addcmul_(self.v, grads, grads, 1 - b2)
        denom = torch._foreach_sqrt(self.v)
        torch._foreach_div_(denom, math.sqrt(bc2))
        torch._foreach_add_(denom, oc.eps)
        upd = torch._foreach_div(self.m, denom)
        torch._foreach_mul_(upd, [lanes(lr / bc1, p) for p in self.p])
        torch._foreach_sub_(self.p, upd)


def timed(trainer, warmup: int, seconds: float) -> float:
    """Tokens/s over whole steps run for at least `seconds` (and 3 steps) after `warmup` steps."""
    for _ in range(warmup):
        trainer.step()
    return timed_window(trainer, seconds)


def timed_window(trainer, seconds: float) -> float:
    steps, t0 = 0, time.perf_counter()
    while steps < 3 or time.perf_counter() - t0 < seconds:
        trainer.step()
        steps += 1
    return steps * trainer.tokens_per_step / (time.perf_counter() - t0)


# ---- packed processes: workers released together over one timed window ------------------------


def worker(args) -> None:
    """One packed process: build, warm up, say ready, wait for go, time a window, print tokens/s."""
    import torch

    torch.set_num_threads(args.threads)
    cfg, lrs = sweep_cfg(args.data_dir)
    cfg = cfg.model_copy(update={"perf": cfg.perf.model_copy(update={"threads": args.threads})})
    tokens, vocab = open_data(args.data_dir)
    if args.lanes_per > 1:
        lo = args.index * args.lanes_per  # each process its own slice of the LR grid
        trainer = Lanes(cfg, tokens, vocab, args.batch, lrs[lo : lo + args.lanes_per])
    else:
        trainer = Single(cfg, tokens, vocab, args.batch)
    for _ in range(args.warmup):
        trainer.step()
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps({"tokens_per_s": timed_window(trainer, args.seconds)}), flush=True)


def packed(args, n: int, batch: int, lanes_per: int = 1) -> float:
    """Aggregate tokens/s of n processes (each the single step, or `lanes_per` lanes), threads
    split as `smollab probe` splits them."""
    threads = max(1, args.threads // n)
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        "--data-dir",
        args.data_dir,
        "--batch",
        str(batch),
        "--threads",
        str(threads),
        "--warmup",
        str(args.warmup),
        "--seconds",
        str(args.seconds),
        "--lanes-per",
        str(lanes_per),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    procs = [
        subprocess.Popen(
            [*cmd, "--index", str(i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(n)
    ]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"packed worker failed (exit {p.wait()})")
        for p in procs:  # all are built and warm: release them together
            p.stdin.write("go\n")
            p.stdin.flush()
        rates = [json.loads(p.stdout.readline())["tokens_per_s"] for p in procs]
    finally:
        for p in procs:
            p.wait()
    return sum(rates)


# ---- the check, the measurements, the table --------------------------------------------------


def open_data(data_dir: str):
    from smollab.data.prepare import load_meta
    from smollab.data.tokens import open_tokens

    return open_tokens(Path(data_dir) / "train.bin"), load_meta(data_dir)["vocab_size"]


def check_lanes(cfg, tokens, vocab: int, lrs: list[float], steps: int = 3) -> str:
    """2 lanes vs their 2 standalone runs after `steps` steps: the largest weight difference.

    The standalone runs use SDPA's math kernel too: the CPU flash kernel's rounding differs by
    ~1e-8, which AdamW's first step (g / (|g| + eps)) blows up on gradients near eps."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    pick = [lrs[len(lrs) // 2], lrs[-2]]
    lanes = Lanes(cfg, tokens, vocab, 4, pick)
    alone = [Single(cfg, tokens, vocab, 4, lr) for lr in pick]
    for _ in range(steps):
        lanes.step()
        with sdpa_kernel(SDPBackend.MATH):  # the lanes' attention kernel: same arithmetic
            for a in alone:
                a.step()
    diff = max(
        (lanes.lane_state(i)[k] - w).abs().max().item()
        for i, a in enumerate(alone)
        for k, w in a.model.state_dict().items()
        if k in lanes.params
    )
    moved = max(w.abs().max().item() for w in lanes.p)
    return (
        f"check: 2 lanes (lr {pick[0]:g}, {pick[1]:g}) vs their standalone runs (math SDPA) after "
        f"{steps} steps at batch 4: max |weight difference| {diff:.2e} (largest weight "
        f"{moved:.2f})"
    )


def machine() -> list[str]:
    import torch

    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next(
        (ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?"
    )
    return [
        f"cpu: {model}, {os.cpu_count()} CPUs; torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads",
        f"load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="/tmp/stories", help="prepared data (built if absent)")
    ap.add_argument("--batches", default="32,4,1", help="batch sizes (the recipe's is 32)")
    ap.add_argument("--lanes", default="2,4,8", help="lane counts and process counts")
    ap.add_argument("--seconds", type=float, default=8.0, help="timed window per measurement")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--rounds", type=int, default=2, help="timed windows per figure (best kept)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="threads in all")
    ap.add_argument("--out", default=None, help="also write the output to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=32, help=argparse.SUPPRESS)
    ap.add_argument("--lanes-per", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    import torch

    torch.set_num_threads(args.threads)
    lines: list[str] = []

    def say(line: str = "") -> None:
        print(line, flush=True)
        lines.append(line)

    if not (Path(args.data_dir) / "train.bin").is_file():
        from smollab.data.prepare import prepare

        print(f"{args.data_dir} has no train.bin: preparing it per {SWEEP.name} ...", flush=True)
        prepare(sweep_cfg(args.data_dir)[0].data)
    cfg, lrs = sweep_cfg(args.data_dir)
    tokens, vocab = open_data(args.data_dir)
    counts = [int(c) for c in args.lanes.split(",")]
    say(
        f"pretrain lanes vs packing: {SWEEP.relative_to(REPO)} ({cfg.model.preset}, "
        f"seq_len {cfg.train.seq_len}, fp32, AdamW); tokens/s in all, best of {args.rounds} "
        f"x {args.seconds:g}s windows"
    )
    for ln in machine():
        say(ln)
    say(check_lanes(cfg, tokens, vocab, lrs))
    if max(counts) > len(lrs):
        raise SystemExit(f"--lanes: at most {len(lrs)} (the sweep's LR grid)")

    # (label, models trained, how): lanes in one process, processes of one model, and 2
    # processes of N/2 lanes each (lanes without intra-op threading: one thread per process)
    cols = [
        ("single", 1, lambda b: timed(Single(cfg, tokens, vocab, b), args.warmup, args.seconds))
    ]
    for n in counts:
        cols.append(
            (
                f"lanes{n}",
                n,
                lambda b, n=n: timed(
                    Lanes(cfg, tokens, vocab, b, lrs[:n]), args.warmup, args.seconds
                ),
            )
        )
        cols.append((f"pack{n}", n, lambda b, n=n: packed(args, n, b)))
        if n >= 4 and n % 2 == 0 and args.threads >= 2:
            cols.append((f"2x{n // 2}lanes", n, lambda b, n=n: packed(args, 2, b, n // 2)))
    batches = [int(b) for b in args.batches.split(",")]
    results: dict[tuple[str, int], float] = {}
    for batch in batches:
        for r in range(args.rounds):  # rounds in alternating order: a load spike hits all kinds
            for label, _, run in cols if r % 2 == 0 else cols[::-1]:
                rate = run(batch)
                results[label, batch] = max(results.get((label, batch), 0.0), rate)
                print(f"  batch {batch} {label}: {rate:,.0f} tok/s", flush=True)
    say(f"load after: {machine()[1].split('load average:')[-1].strip()} (1, 5, 15 min)")
    say()
    say(f"{'batch':>5} " + " ".join(f"{label:>9}" for label, _, _ in cols) + f" {'lanes/pack':>10}")
    for batch in batches:
        row = [results[label, batch] for label, _, _ in cols]
        best_lanes = max(results[lb, batch] for lb, _, _ in cols if "lanes" in lb)
        best_pack = max(results[lb, batch] for lb, _, _ in cols if "lanes" not in lb)
        say(
            f"{batch:>5} "
            + " ".join(f"{v:>9,.0f}" for v in row)
            + f" {best_lanes / best_pack:>10.2f}"
        )
    say(
        "tokens/s of all models together; lanesN: N models in one process, all threads; packN: N "
        "processes of one model, threads split; 2xKlanes: 2 processes of K lanes, 1 thread each; "
        "lanes/pack: best of any lanes column over best of single and packN"
    )
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
