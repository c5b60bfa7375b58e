"""Our rollout sampler vs HF `generate` on the same weights and prompts (never run by CI).

Default shape: SimpleStories-1.25M (random init), 32 rows, 8-token prompts, 64 new tokens, no EOS
stop, temperature 1. The two are timed alternately in one process (the machine is shared and
noisy) and medians are printed, with the ratio. `--model DIR` takes any HF model directory instead
(a Qwen2.5-0.5B-shaped replica: `tests.replicas.build_replica`), in fp32 unless `--dtype` says.
Also: `load_weights` per step, and the no-grad log-prob forward over prompt + completion
(reference / old log-probs), lean vs HF. `--families` prints instead a table over the tiny offline
replica of every Hub family the lean engine reads (family, lean tok/s, HF tok/s, ratio); run it
from the repository root (it imports `tests.replicas`).

    python benchmarks/rollout_vs_hf_generate.py [--model DIR] [--dtype fp32|bf16] [--batch 32]
        [--new 64] [--repeats 7] [--threads N] [--families]
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


def simplestories_model():
    """A random HF Llama of the SimpleStories-1.25M shape (seeded: the same weights every time)."""
    from transformers import LlamaConfig, LlamaForCausalLM

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
    return LlamaForCausalLM(cfg).eval()


def rollout_pair(hf, B: int, P: int, T: int):
    """(sampler, ours, theirs): a lean `Sampler` of `hf` and two closures that each sample B
    rows of T new tokens after the same random P-token prompts, ours and HF `generate`, at
    temperature 1 with no EOS stop."""
    from smollab.engine.sampler import Sampler

    cfg = hf.config
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0
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
                repetition_penalty=1.0,
                max_new_tokens=T,
                min_new_tokens=T,
                pad_token_id=pad,
            )
        assert out.shape == (B, P + T)

    return sampler, prompts, mask, ours, theirs


def interleaved(ours, theirs, repeats: int):
    """Timings of ours and theirs, alternated (after two warm-up calls each)."""
    for f in (ours, theirs, ours, theirs):
        f()
    t_ours, t_hf = [], []
    for _ in range(repeats):
        t_ours += _time(ours, 1)
        t_hf += _time(theirs, 1)
    return t_ours, t_hf


def families(args) -> None:
    """Per family, its tiny offline replica (tests/replicas.py, loaded in --dtype): lean
    rollout vs HF `generate`, tokens per second of wall time, alternated."""
    import tempfile

    from transformers import AutoModelForCausalLM

    from tests.replicas import FAMILIES, build_replica

    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    B, P, T = args.batch, args.prompt, args.new
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES:
            path = build_replica(family, f"{tmp}/{family}")
            hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
            sampler, *_, ours, theirs = rollout_pair(hf, B, P, T)
            assert sampler.backend == "lean", sampler.hf_reason
            t_ours, t_hf = interleaved(ours, theirs, args.repeats)
            rows.append((family, B * T / _med(t_ours, 0), B * T / _med(t_hf, 0), hf.config))
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}; batch {B}, prompt {P}, "
        f"new tokens {T}, {args.dtype}, medians of {args.repeats} alternated rollouts (wall)"
    )
    print(f"{'family':10s}{'lean tok/s':>12s}{'HF tok/s':>10s}{'ratio':>8s}  shape")
    for family, lean, hf_tps, c in rows:
        shape = f"{c.num_hidden_layers} layers, hidden {c.hidden_size}, vocab {c.vocab_size}"
        print(f"{family:10s}{lean:12.0f}{hf_tps:10.0f}{lean / hf_tps:7.2f}x  {shape}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="an HF model directory (default: random 1.25M)")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="--model's weights")
    ap.add_argument("--families", action="store_true", help="a table over the tiny replicas")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.families:
        return families(args)

    from transformers import AutoModelForCausalLM

    from smollab.engine.lean_llama import LeanLlama
    from smollab.engine.token_logprobs import logprobs

    hf = simplestories_model()
    if args.model:
        dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
        hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval()
    cfg = hf.config
    B, P, T = args.batch, args.prompt, args.new
    sampler, prompts, mask, ours, theirs = rollout_pair(hf, B, P, T)

    def load():
        sampler.load_weights(hf)

    t_ours, t_hf = interleaved(ours, theirs, args.repeats)
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
