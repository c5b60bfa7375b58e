"""Whole rollouts with the decode's LM head as F.linear against oneDNN's packed linear (never
run by CI).

`Sampler.generate(record=True)` as GRPO calls it (temperature 1, no EOS stop, 8-token prompts,
random weights), the head switched by `LeanLlama.use_packed_head` on one sampler, the two taking
turns for `--repeats` rounds after one warm-up call each; medians of wall and process CPU time.
Shapes: SimpleStories-1.25M (32 rows x 64 tokens), a 124M-shaped Llama (8 x 128), a
Qwen2.5-0.5B-shaped model (hidden 896, `--qwen-layers` of its 24 layers, 14 heads / 2 kv heads,
MLP 4,864, qkv bias, vocab 151,936, tied head; 16 x 64) and 8 LoRA lanes of the 1.25M model
(32 rows a lane x 64). Also per shape: one reorder (`pack_head`, paid at the first decode after
every weight load, i.e. every GRPO step) next to one `load_weights`, the packed copy's size
(the process's resident memory before and after a pack), and whether both heads drew the same
tokens from the same seed.

    python benchmarks/packed_head.py [--threads 1] [--repeats 3] [--shapes 1.25m,124m,qwen,lanes]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_vs_hf_generate import _time, simplestories_model  # noqa: E402
from static_decode import gpt2_shaped_model, lanes_model  # noqa: E402


def qwen_shaped_model(layers: int):
    """A random Qwen2 of Qwen2.5-0.5B's shape with `layers` layers (seeded)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=151_936,
        hidden_size=896,
        num_hidden_layers=layers,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return Qwen2ForCausalLM(cfg).eval()


def rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def measure(model, B: int, T: int, repeats: int, seeds=0) -> None:
    from smollab.engine.lean_llama import pack_head
    from smollab.engine.sampler import Sampler

    sampler = Sampler(model)
    lean = sampler.lean
    print(f"decode_reason: {sampler.decode_reason}")
    prompts = torch.randint(3, 4000, (B, 8))
    mask = torch.ones_like(prompts)
    out = {}

    def rollout(packed: bool):
        def run():
            lean.use_packed_head = packed
            r = sampler.generate(
                prompts, T, prompt_mask=mask, seed=seeds, stop_at_eos=False, record=True
            )
            out[packed] = r

        return run

    fns = {"F.linear": rollout(False), "oneDNN packed": rollout(True)}
    for fn in fns.values():
        _time(fn, 1)
    times: dict[str, list] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name] += _time(fn, 1)
    base = statistics.median(x[0] for x in times["F.linear"])
    print(f"{'head':16s}{'wall s':>8s}{'cpu s':>8s}{'tok/s':>8s}{'speedup':>9s}")
    for name, t in times.items():
        w = statistics.median(x[0] for x in t)
        c = statistics.median(x[1] for x in t)
        print(f"{name:16s}{w:8.3f}{c:8.3f}{B * T / w:8.0f}{base / w:8.2f}x")
    same = torch.equal(out[False].completion_ids, out[True].completion_ids)
    lp = (out[False].logprobs - out[True].logprobs).abs().max().item()
    print(f"same tokens: {same}; max |log-prob difference|: {lp:.2e}")
    with torch.inference_mode():
        pack = [_time(lambda: pack_head(lean.lm_head, B), 1)[0][0] for _ in range(3)]
        load = [_time(lambda: sampler.load_weights(model), 1)[0][0] for _ in range(3)]
        lean._head_pack = None
        before = rss_mb()
        kept = pack_head(lean.lm_head, B)
        grown = rss_mb() - before
    V, H = lean.lm_head.shape
    print(
        f"one reorder: {statistics.median(pack) * 1e3:.1f} ms (one load_weights: "
        f"{statistics.median(load) * 1e3:.1f} ms); packed copy: resident memory "
        f"+{grown:.0f} MB (the fp32 head is {V * H * 4 / 2**20:.0f} MB)"
    )
    del kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shapes", default="1.25m,124m,qwen,lanes")
    ap.add_argument("--qwen-layers", type=int, default=24)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = {
        "1.25m": ("SimpleStories-1.25M", simplestories_model, 32, 64),
        "124m": ("124M-shaped Llama", gpt2_shaped_model, 8, 128),
        "qwen": (
            f"Qwen2.5-0.5B-shaped, {args.qwen_layers} layers",
            lambda: qwen_shaped_model(args.qwen_layers),
            16,
            64,
        ),
        "lanes": ("8 LoRA lanes of SimpleStories-1.25M", lanes_model, 8 * 32, 64),
    }
    print(f"torch {torch.__version__}, {args.threads} thread(s), medians of {args.repeats}")
    for key in args.shapes.split(","):
        name, make, B, T = shapes[key]
        model = make()
        params = sum(p.numel() for p in model.parameters())
        print(f"\n{name} ({params / 1e6:.1f}M parameters): {B} rows x {T} new tokens")
        measure(model, B, T, args.repeats, seeds=list(range(8)) if key == "lanes" else 0)


if __name__ == "__main__":
    main()
