"""Pretraining tokens/s: `smollab pretrain` vs a plain PyTorch loop vs HF `Trainer` (never run by CI).

All three train the same HF `LlamaForCausalLM` (the recipe's preset, SimpleStories-1.25M by
default) at the recipe's batch (32 x 128), fp32, with the same AdamW (betas, eps, weight decay on
2-D weights, grad clip, warmup + cosine LR) on random windows of the same memmapped tokens:

- smollab: `smollab.train.pretrain.train(cfg)` in-process (its run directory in a temp dir). Its
  rate is its own figure: tokens over the per-step `train_s` clock of metrics.csv (logged every
  step here; the clock covers batch, forward, backward, clip, AdamW and excludes logging/eval).
- plain: a nanoGPT-style loop written here: `get_batch` with smollab's per-step generators (the
  very batches smollab draws), forward, cross-entropy, backward, clip, fused AdamW; the same clock.
- trainer: HF `Trainer` over a torch Dataset of random windows of the memmap (labels =
  input_ids), timed from `on_step_begin` to `on_step_end` by a callback.

The three run in one process, interleaved step by step (smollab step k, plain step k, Trainer
step k, ...: each runs in its own thread and hands the CPU on after every step, so only one ever
computes), so the load of a shared machine falls on all alike. After `--warmup` steps each, the
next `--steps` steps are timed (one more, untimed, ends each run); medians and per-step ratios are printed. A second, outer clock per
step (everything between two hand-overs: data loading, logging, the Trainer's DataLoader and log
hooks) is printed beside it. MFU uses smollab's FLOPs per token against the CPU peak smollab has
cached (the one metrics.csv uses) and against a peak measured at the end of this run.

    python benchmarks/pretrain_throughput.py [--data-dir /tmp/stories] [--steps 60] [--warmup 10]
                                             [--threads N] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "configs" / "pretrain" / "simplestories-1.25m.yaml"


class Baton:
    """Round-robin hand-over between threads: only the holder computes; a finished one drops out."""

    def __init__(self, names: list[str]):
        self.names, self.turn, self.done = list(names), names[0], set()
        self.cv = threading.Condition()

    def _next(self, me: str) -> str:
        i = self.names.index(me)
        for k in range(1, len(self.names) + 1):
            cand = self.names[(i + k) % len(self.names)]
            if cand not in self.done:
                return cand
        return me

    def wait(self, me: str) -> None:
        with self.cv:
            while self.turn != me:
                self.cv.wait()

    def hand_on(self, me: str) -> None:
        with self.cv:
            self.turn = self._next(me)
            self.cv.notify_all()
        self.wait(me)

    def finish(self, me: str) -> None:
        with self.cv:
            self.done.add(me)
            if self.turn == me:
                self.turn = self._next(me)
            self.cv.notify_all()


def make_cfg(args, run_dir: Path):
    from smollab.config.load import load_config
    from smollab.data.prepare import load_meta
    from smollab.errors import UserError

    cfg = load_config(
        "pretrain",
        args.recipe,
        [
            f"data.dir={args.data_dir}",
            f"train.max_steps={args.warmup + args.steps + 1}",
            "train.log_interval=1",
            f"train.eval_interval={10**9}",
            "train.eval_tokens=4096",
            f"train.save_interval={10**9}",
            f"run.dir={run_dir}",
            "run.resume=never",
            "perf.device=cpu",
        ],
    )
    try:  # an existing data dir is used as it was prepared, never rebuilt to the recipe's spec
        prepared = load_meta(args.data_dir)["config"]
    except (UserError, KeyError):
        return cfg
    data = type(cfg.data).model_validate({**prepared, "dir": str(args.data_dir)})
    return cfg.model_copy(update={"data": data})


def new_model(cfg, vocab_size: int):
    import torch

    from smollab.models.loading import build_model

    torch.manual_seed(cfg.run.seed)
    return build_model(cfg.model, vocab_size=vocab_size, attn_implementation="sdpa")


class Clock:
    """Per-step inner times (set by each implementation) and outer times (between hand-overs)."""

    def __init__(self):
        self.inner: list[float] = []
        self.outer: list[float] = []
        self._t = None

    def resumed(self) -> None:
        self._t = time.perf_counter()

    def handing_on(self) -> None:
        if self._t is not None:
            self.outer.append(time.perf_counter() - self._t)


def run_smollab(cfg, baton: Baton, clock: Clock) -> dict:
    import smollab.train.pretrain as pretrain
    from smollab.rundir.runs import read_metrics

    base = pretrain.Progress

    class HandOn(base):  # called once per logged step, after the step's clock stopped
        def update(self, step, **info):
            super().update(step, **info)
            clock.handing_on()
            baton.hand_on("smollab")
            clock.resumed()

    pretrain.Progress = HandOn
    try:
        pretrain.train(cfg)
    finally:
        pretrain.Progress = base
    rows = read_metrics(Path(cfg.run.dir) / "metrics.csv")
    prev = 0.0
    for r in rows:
        clock.inner.append(r["train_s"] - prev)
        prev = r["train_s"]
    return {"mfu": [r["mfu"] for r in rows]}


def run_plain(cfg, vocab_size: int, baton: Baton, clock: Clock) -> dict:
    import torch
    import torch.nn.functional as F

    from smollab.data.tokens import get_batch, open_tokens
    from smollab.train.pretrain import batch_generator
    from smollab.train.schedule import lr_at

    tc, oc = cfg.train, cfg.optim
    tokens = open_tokens(Path(cfg.data.dir) / "train.bin")
    model = new_model(cfg, vocab_size).train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": oc.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=oc.lr,
        betas=(oc.beta1, oc.beta2),
        eps=oc.eps,
        fused=True,
    )
    for step in range(tc.max_steps):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, oc, tc.max_steps)
        gen = batch_generator(cfg.run.seed, step, 0, 0)
        x, y = get_batch(tokens, tc.batch_size, tc.seq_len, gen)
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), oc.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.inner.append(time.perf_counter() - t0)
        clock.handing_on()
        baton.hand_on("plain")
        clock.resumed()
    return {}


def run_trainer(cfg, vocab_size: int, out_dir: Path, baton: Baton, clock: Clock) -> dict:
    import numpy as np
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from smollab.data.tokens import open_tokens

    tc, oc = cfg.train, cfg.optim
    tokens = open_tokens(Path(cfg.data.dir) / "train.bin")

    class Windows(torch.utils.data.Dataset):
        def __len__(self):
            return 10**7

        def __getitem__(self, i):
            rng = np.random.default_rng((cfg.run.seed, i))
            start = int(rng.integers(0, len(tokens) - tc.seq_len))
            ids = torch.from_numpy(tokens[start : start + tc.seq_len].astype(np.int64))
            return {"input_ids": ids, "labels": ids}

    class StepClock(TrainerCallback):
        t0 = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            clock.inner.append(time.perf_counter() - self.t0)
            clock.handing_on()
            baton.hand_on("trainer")
            clock.resumed()

    targs = TrainingArguments(
        output_dir=str(out_dir),
        per_device_train_batch_size=tc.batch_size,
        max_steps=tc.max_steps,
        logging_steps=10,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        dataloader_num_workers=0,
        learning_rate=oc.lr,
        weight_decay=oc.weight_decay,
        adam_beta1=oc.beta1,
        adam_beta2=oc.beta2,
        adam_epsilon=oc.eps,
        max_grad_norm=oc.grad_clip,
        lr_scheduler_type="cosine",
        warmup_steps=oc.warmup_steps,
        seed=cfg.run.seed,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=new_model(cfg, vocab_size),
        args=targs,
        train_dataset=Windows(),
        callbacks=[StepClock()],
    )
    trainer.train()
    return {"optim": str(targs.optim.value if hasattr(targs.optim, "value") else targs.optim)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="/tmp/stories", help="prepared data (built if absent)")
    ap.add_argument("--recipe", default=str(RECIPE), help="pretrain recipe: preset, batch, AdamW")
    ap.add_argument("--steps", type=int, default=60, help="timed steps per implementation")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--quick", action="store_true", help="5 warm-up + 15 timed steps")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.warmup = 15, 5

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from smollab.data.prepare import load_meta, prepare
    from smollab.device.mfu import flops_per_token, measure_cpu_peak, peak_flops

    hf_logging.set_verbosity_error()
    tmp = Path(tempfile.mkdtemp(prefix="smollab-bench-pretrain-"))
    if not (Path(args.data_dir) / "train.bin").is_file():
        print(f"{args.data_dir} has no train.bin: preparing it per {args.recipe} ...", flush=True)
        prepare(make_cfg(args, tmp / "unused").data)
    vocab = load_meta(args.data_dir)["vocab_size"]
    cfg = make_cfg(args, tmp / "smollab")
    model = new_model(cfg, vocab)
    flops_tok = flops_per_token(model.config, cfg.train.seq_len)
    n_params = sum(p.numel() for p in model.parameters())
    cached_peak = peak_flops(torch.device("cpu"), None)

    names = ["smollab", "plain", "trainer"]
    baton = Baton(names)
    clocks = {n: Clock() for n in names}
    out: dict[str, dict] = {}
    errors: dict[str, str] = {}
    jobs = {
        "smollab": lambda: run_smollab(cfg, baton, clocks["smollab"]),
        "plain": lambda: run_plain(cfg, vocab, baton, clocks["plain"]),
        "trainer": lambda: run_trainer(cfg, vocab, tmp / "trainer", baton, clocks["trainer"]),
    }

    def worker(name: str) -> None:
        try:
            baton.wait(name)
            clocks[name].resumed()
            out[name] = jobs[name]()
        except BaseException:
            errors[name] = traceback.format_exc()
        finally:
            baton.finish(name)

    load_before = os.getloadavg()
    log = io.StringIO()
    t_all = time.perf_counter()
    with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        threads = [threading.Thread(target=worker, args=(n,), name=n) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    t_all = time.perf_counter() - t_all
    load_after = os.getloadavg()
    if errors:
        sys.stderr.write(log.getvalue()[-4000:])
        for name, tb in errors.items():
            sys.stderr.write(f"--- {name} failed:\n{tb}")
        sys.exit(1)
    fresh_peak = measure_cpu_peak("float32")

    tc = cfg.train
    tok_step = tc.batch_size * tc.seq_len
    w, n = args.warmup, args.steps
    inner = {k: clocks[k].inner[w : w + n] for k in names}
    outer = {k: clocks[k].outer[w : w + n] for k in names}
    print(
        f"model {cfg.model.preset}: {n_params:,} parameters; batch {tc.batch_size} x {tc.seq_len}, "
        f"fp32, torch {torch.__version__}, {torch.get_num_threads()} threads; {w} warm-up + {n} "
        f"timed steps each, interleaved step by step ({t_all:.0f} s in all)"
    )
    print(
        f"load average 1/5/15 min: before {'/'.join(f'{x:.2f}' for x in load_before)}, after "
        f"{'/'.join(f'{x:.2f}' for x in load_after)} ({os.cpu_count()} CPUs); HF Trainer "
        f"optimizer {out['trainer']['optim']}"
    )
    print(
        "step clock: smollab = its own metrics.csv train_s per step; plain = the same span; "
        "Trainer = on_step_begin..on_step_end"
    )
    print("outer clock: all between two hand-overs (data, logging; smollab logs every step here)")
    print()

    def mfu(tps: float, peak: float | None) -> str:
        return f"{100 * flops_tok * tps / peak:.1f}%" if peak else "-"

    print(
        f"{'tokens/s (median)':22s}{'step clock':>11s}{'p25':>8s}{'p75':>8s}{'outer':>9s}"
        f"{'MFU cached':>12s}{'MFU now':>9s}"
    )
    labels = {"smollab": "smollab pretrain", "plain": "plain PyTorch loop", "trainer": "HF Trainer"}
    for k in names:
        q = statistics.quantiles([tok_step / t for t in inner[k]], n=4)
        m = tok_step / statistics.median(inner[k])
        mo = tok_step / statistics.median(outer[k])
        print(
            f"{labels[k]:22s}{m:11,.0f}{q[0]:8,.0f}{q[2]:8,.0f}{mo:9,.0f}"
            f"{mfu(m, cached_peak):>12s}{mfu(m, fresh_peak):>9s}"
        )
    print()
    for other in ("plain", "trainer"):
        pairs = [b / a for a, b in zip(inner["smollab"], inner[other], strict=True)]
        pairs_o = [b / a for a, b in zip(outer["smollab"], outer[other], strict=True)]
        print(
            f"smollab / {labels[other]:19s} tokens/s ratio, median of {len(pairs)} adjacent-step "
            f"pairs: {statistics.median(pairs):.3f} (outer clock {statistics.median(pairs_o):.3f})"
        )
    mfus = [x for x in out["smollab"]["mfu"][w : w + n] if x is not None]
    if mfus:
        print(
            f"smollab MFU as metrics.csv reports it (median of timed steps): "
            f"{100 * statistics.median(mfus):.1f}%"
        )
    print(
        f"FLOPs/token {flops_tok / 1e6:.2f}M (smollab.device.mfu); CPU fp32 peak: cached "
        f"{(cached_peak or float('nan')) / 1e9:.0f} GFLOP/s (what metrics.csv divides by), "
        f"measured after this run {fresh_peak / 1e9:.0f} GFLOP/s"
    )
    print(f"run directories under {tmp}")


if __name__ == "__main__":
    main()
