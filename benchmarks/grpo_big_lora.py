"""LoRA GRPO on a Qwen2-0.5B-shaped model: step time and peak memory with and without gradient
accumulation and gradient checkpointing (never run by CI).

The model is built from a transformers `Qwen2Config` with Qwen2-0.5B's shape (24 layers, hidden
896, MLP 4864, 14 query / 2 key-value heads, tied embeddings) and random weights; its vocabulary
is cut to the project's tokenizer (the data dir's, 4,096 WordPiece entries by default) instead of
Qwen's 151,936, which keeps the head and the embedding (and the step) small: ~360M parameters
stay. It is saved once as an HF directory (fp32, with the tokenizer) and every variant runs
`smollab grpo` on it with model.path, in a process of its own, so `peak_mem_mb` (the process's
peak RSS on the CPU) is that variant's alone. Before them a process that only loads the model
prints its peak RSS beside the weights' size: transformers 5 always builds the model on the meta
device and loads the weights into it (what `low_cpu_mem_usage=True` did in 4.x; the argument is
gone), so the load should cost about one copy of the weights.

Printed per variant: the median `step_s` and `train_s` of metrics.csv over the steps after the
first, and the run's `peak_mem_mb`.

    python benchmarks/grpo_big_lora.py [--work /tmp/big_lora] [--steps 3] [--batch 8]
                                       [--generations 2] [--completion 32] [--layers 24]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

VARIANTS = [
    ("baseline", 1, False),
    ("grad_accum", 2, False),
    ("grad_ckpt", 1, True),
    ("accum+ckpt", 2, True),
]


def build(work: Path, layers: int) -> Path:
    """The random-weight Qwen2-0.5B-shaped model directory (and the data dir it draws prompts
    and its tokenizer from)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from smollab.config import DataConfig
    from smollab.data.prepare import prepare
    from smollab.data.tokenizer import load_tokenizer

    data, model_dir = work / "data", work / f"qwen2-0.5b-shape-{layers}l"
    if not (data / "meta.json").is_file():
        prepare(DataConfig(dir=str(data), num_stories=2000), log=print)
    if (model_dir / "config.json").is_file():
        return model_dir
    tok = load_tokenizer(data / "tokenizer")
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    n = sum(p.numel() for p in model.parameters())
    print(f"built {model_dir}: {n:,} parameters ({n * 4 / 2**20:,.0f} MiB fp32)")
    return model_dir


LOAD_PROBE = """
import resource, sys, time
from smollab.config import ModelConfig
from smollab.models.loading import build_model
t = time.perf_counter()
m = build_model(ModelConfig(path=sys.argv[1]))
mib = sum(p.numel() * p.element_size() for p in m.parameters()) / 2**20
print(f"load: {time.perf_counter() - t:.1f}s, weights {mib:,.0f} MiB, process peak RSS "
      f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")
"""


def run_variant(work, model_dir, name, accum, ckpt, args) -> dict:
    run = work / "runs" / name  # sentence_length: a reward that varies on random text
    over = [
        f"model.path={model_dir}",
        f"data.dir={work / 'data'}",
        f"run.dir={run}",
        "run.resume=never",
        f"train.max_steps={args.steps}",
        f"train.batch_size={args.batch}",
        f"grpo.num_generations={args.generations}",
        f"grpo.max_completion_length={args.completion}",
        "train.eval_interval=0",
        "train.save_interval=0",
        "model.lora.enabled=true",
        "model.lora.r=8",
        "optim.lr=1e-4",
        "optim.warmup_steps=0",
        "grpo.beta=0.04",
        f"train.grad_accum={accum}",
        f"perf.grad_checkpointing={str(ckpt).lower()}",
        "reward=[{name: sentence_length}]",
    ]
    subprocess.run(
        [sys.executable, "-m", "smollab", "grpo", *over], check=True, stdout=subprocess.DEVNULL
    )
    from smollab.rundir.rows import read_metrics

    rows = read_metrics(run / "metrics.csv")
    later = rows[1:] or rows
    return {
        "variant": name,
        "grad_accum": accum,
        "grad_ckpt": ckpt,
        "step_s": statistics.median(r["step_s"] for r in later),
        "train_s": statistics.median(r["train_s"] for r in later),
        "peak_mem_mb": rows[-1]["peak_mem_mb"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/big_lora")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--generations", type=int, default=2)
    ap.add_argument("--completion", type=int, default=32)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--variants", default=",".join(v[0] for v in VARIANTS))
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model_dir = build(work, args.layers)
    env = dict(os.environ)
    subprocess.run([sys.executable, "-c", LOAD_PROBE, str(model_dir)], check=True, env=env)
    print(
        f"batch {args.batch} = {args.batch // args.generations} prompts x {args.generations}, "
        f"{args.completion} new tokens, LoRA r8 on all linears, beta 0.04, {args.steps} steps"
    )
    wanted = args.variants.split(",")
    results = []
    for name, accum, ckpt in VARIANTS:
        if name in wanted:
            results.append(run_variant(work, model_dir, name, accum, ckpt, args))
            r = results[-1]
            print(
                f"{name:12s} grad_accum={accum} ckpt={ckpt!s:5s} step {r['step_s']:.2f}s "
                f"(train {r['train_s']:.2f}s)  peak RSS {r['peak_mem_mb']:,.0f} MiB",
                flush=True,
            )
    (work / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
