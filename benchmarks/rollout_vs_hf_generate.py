"""Our rollout sampler vs HF `generate` on the same weights and prompts (never run by CI).

Default shape: SimpleStories-1.25M (random init), 32 rows, 8-token prompts, 64 new tokens, no EOS
stop, temperature 1. The two are timed alternately in one process (the machine is shared and
noisy) and medians are printed, with the ratio. `--model DIR` takes any HF model directory instead
(a Qwen2.5-0.5B-shaped replica: `tests.replicas.build_replica`), in fp32 unless `--dtype` says. Also: `load_weights` per step, and the no-grad
log-prob forward over prompt + completion (reference / old log-probs), lean vs HF.

    python benchmarks/rollout_vs_hf_generate.py [--model DIR] [--dtype fp32|bf16] [--batch 32] [--new 64] [--repeats 7] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def _time(fn, repeats: int) -> list[tuple[float, float]]:
    """(wall, process CPU) seconds per call. With one thread, CPU time is robust to other
    processes on a shared machine; wall time is what a user waits."""
    out = []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        fn()
        out.append((time.perf_counter() - w, time.process_time() - c))
    return out


def _med(ts: list[tuple[float, float]], i: int) -> float:
    return statistics.median(t[i] for t in ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="an HF model directory (default: random 1.25M)")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="--model's weights")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--hf-only-once", action="store_true", help="fewer HF repeats (slow machine)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from smollab.engine.lean_llama import LeanLlama
    from smollab.engine.sampler import Sampler
    from smollab.engine.token_logprobs import logprobs

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=4096,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=341,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    hf = LlamaForCausalLM(cfg).eval()
    if args.model:
        dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
        hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval()
        cfg = hf.config
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0
    B, P, T = args.batch, args.prompt, args.new
    prompts = torch.randint(3, min(cfg.vocab_size, 32_000), (B, P))
    mask = torch.ones_like(prompts)

    sampler = Sampler(hf)

    def ours():
        sampler.load_weights(hf)
        r = sampler.generate(prompts, T, prompt_mask=mask, seed=0, stop_at_eos=False)
        assert r.completion_ids.shape == (B, T)

    def theirs():
        with torch.inference_mode():
            out = hf.generate(
                input_ids=prompts,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=T,
                min_new_tokens=T,
                pad_token_id=pad,
            )
        assert out.shape == (B, P + T)

    def load():
        sampler.load_weights(hf)

    for f in (ours, theirs, ours, theirs):  # warm up
        f()
    t_ours, t_hf = [], []
    for _ in range(args.repeats):
        t_ours += _time(ours, 1)
        t_hf += _time(theirs, 1)
    t_load = _time(load, 21)

    # Log-prob forward over prompt + completion, no grad (reference / old log-probs).
    lean_ref = LeanLlama.from_hf(hf)
    r = sampler.generate(prompts, T, prompt_mask=mask, seed=1, stop_at_eos=False)
    ids, am = r.input_ids, r.attention_mask

    def lp_lean():
        with torch.inference_mode():
            return logprobs(lean_ref, ids, am, P)

    def lp_hf():
        with torch.inference_mode():
            return logprobs(hf, ids, am, P)

    diff = (lp_lean() - lp_hf()).abs().max().item()
    f_lean, f_hf = [], []
    for _ in range(args.repeats):
        f_lean += _time(lp_lean, 1)
        f_hf += _time(lp_hf, 1)

    n_tok = B * T
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, backend {sampler.backend}"
    )
    params = sum(p.numel() for p in hf.parameters())
    print(
        f"model {args.model or 'random SimpleStories-1.25M'} ({cfg.model_type}, {params:,} "
        f"parameters, {next(hf.parameters()).dtype}); batch {B}, prompt {P}, new tokens {T}, "
        f"vocab {cfg.vocab_size}, no EOS stop"
    )
    print(
        f"medians of {args.repeats}, the two alternated; wall = what you wait, cpu = process time"
    )
    print(f"{'':18s}{'wall s':>8s}{'ms/step':>9s}{'tok/s':>8s}{'cpu s':>8s}{'ms/step':>9s}")
    for name, t in (("smollab Sampler", t_ours), ("HF generate", t_hf)):
        w, c = _med(t, 0), _med(t, 1)
        print(f"{name:18s}{w:8.3f}{w / T * 1e3:9.2f}{n_tok / w:8.0f}{c:8.3f}{c / T * 1e3:9.2f}")
    print(
        f"speedup (HF / ours): wall {_med(t_hf, 0) / _med(t_ours, 0):.2f}x, "
        f"cpu {_med(t_hf, 1) / _med(t_ours, 1):.2f}x"
    )
    print(f"load_weights: {_med(t_load, 0) * 1e3:.2f} ms")
    fl, fh = _med(f_lean, 0), _med(f_hf, 0)
    print(
        f"log-prob forward {B}x{P + T}, no grad (wall): lean {fl * 1e3:.1f} ms, HF {fh * 1e3:.1f} ms,"
        f" speedup {fh / fl:.2f}x (cpu {_med(f_hf, 1) / _med(f_lean, 1):.2f}x), "
        f"max |diff| {diff:.1e}"
    )


if __name__ == "__main__":
    main()
