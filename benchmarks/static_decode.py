"""Decode tokens/s: the eager step, the static step, the static step compiled, and HF `generate`
(never run by CI).

Two shapes, random weights, temperature 1, no EOS stop, 8-token prompts: SimpleStories-1.25M
(`rollout_vs_hf_generate.simplestories_model`, 32 rows x 64 new tokens) and a GPT-2-124M-shaped
Llama (hidden 768, 12 layers, 12 heads, MLP 2048, vocab 50,304; 8 rows x 128 new tokens), and
8 LoRA lanes (r8 on every linear) of the 1.25M model in one `LaneLlama`, 32 rows a lane x 64
tokens (no HF `generate` there). Per shape the decodes take turns, `--repeats` rounds after one warm-up call each (the compiled
one's warm-up is its compile, timed and printed), and the medians of wall and process CPU time
are printed with tokens/s of wall time. Also printed: the compiled graphs made (a second prompt
length in the same 16-slot cache bucket must not add one), and whether every decode drew the same
tokens as the eager one (same seed). The samplers record their decode (`record=True`), as GRPO's.

    TORCHINDUCTOR_CACHE_DIR=/tmp/inductor python benchmarks/static_decode.py [--threads 1]
        [--repeats 5] [--shapes 1.25m,124m,lanes]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_vs_hf_generate import _time, simplestories_model  # noqa: E402

DECODES = ("eager", "static", "compiled")


def gpt2_shaped_model():
    """A random Llama of GPT-2 small's size (124M-shaped; seeded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=50_304,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        intermediate_size=2048,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return LlamaForCausalLM(cfg).eval()


def lanes_model(n: int = 8):
    """n LoRA lanes (r8, alpha 16, every linear; random adapters) of the 1.25M model."""
    import copy

    import peft

    from smollab.engine.lane_llama import LaneLlama

    base = simplestories_model()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    policies = []
    for _ in range(n):
        cfg = peft.LoraConfig(r=8, lora_alpha=16, target_modules=targets)
        policy = peft.get_peft_model(copy.deepcopy(base), cfg)
        with torch.no_grad():
            for name, p in policy.named_parameters():
                if "lora_" in name:
                    p.normal_(0, 0.02)
        policies.append(policy)
    lanes = LaneLlama.from_hf(base, adapters=False)
    with torch.no_grad():
        lanes.load_lanes(policies)
    return lanes


def measure(hf, B: int, T: int, repeats: int, seeds=0) -> None:
    """hf: an HF model (also timed through `generate`) or a `LaneLlama` (seeds: one a lane)."""
    from torch._dynamo.utils import counters

    from smollab.engine.sampler import Sampler

    prompts = torch.randint(3, 4000, (B, 8))
    mask = torch.ones_like(prompts)
    samplers = {d: Sampler(hf, decode=d) for d in DECODES}
    tokens = {}

    def ours(d):
        def run():
            r = samplers[d].generate(
                prompts, T, prompt_mask=mask, seed=seeds, stop_at_eos=False, record=True
            )
            tokens[d] = r.completion_ids

        return run

    def theirs():
        with torch.inference_mode():
            hf.generate(
                input_ids=prompts,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=T,
                min_new_tokens=T,
                pad_token_id=0,
            )

    fns = {d: ours(d) for d in DECODES}
    if hasattr(hf, "generate"):
        fns["HF generate"] = theirs
    first = {name: _time(fn, 1)[0][0] for name, fn in fns.items()}
    times: dict[str, list] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name] += _time(fn, 1)
    graphs = counters["stats"]["unique_graphs"]
    longer = torch.cat([torch.full((B, 1), 5), prompts], 1)  # 9 tokens: the same cache bucket
    samplers["compiled"].generate(longer, T, seed=seeds, stop_at_eos=False, record=True)
    print(f"{'':14s}{'wall s':>8s}{'tok/s':>8s}{'cpu s':>8s}{'first s':>9s}  same tokens as eager")
    for name, t in times.items():
        w = statistics.median(x[0] for x in t)
        c = statistics.median(x[1] for x in t)
        same = "" if name not in tokens else str(torch.equal(tokens[name], tokens["eager"]))
        print(f"{name:14s}{w:8.3f}{B * T / w:8.0f}{c:8.3f}{first[name]:9.2f}  {same}")
    print(
        f"compiled graphs: {graphs} after the timed calls, "
        f"{counters['stats']['unique_graphs']} after a 9-token prompt (same bucket)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--shapes", default="1.25m,124m,lanes")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = {
        "1.25m": ("SimpleStories-1.25M", simplestories_model, 32, 64),
        "124m": ("124M-shaped Llama", gpt2_shaped_model, 8, 128),
        "lanes": ("8 LoRA lanes of SimpleStories-1.25M", lanes_model, 8 * 32, 64),
    }
    print(f"torch {torch.__version__}, {args.threads} thread(s), medians of {args.repeats}")
    for key in args.shapes.split(","):
        name, make, B, T = shapes[key]
        hf = make()
        params = sum(p.numel() for p in hf.parameters())
        print(f"\n{name} ({params / 1e6:.1f}M parameters): {B} rows x {T} new tokens")
        measure(hf, B, T, args.repeats, seeds=list(range(8)) if key == "lanes" else 0)


if __name__ == "__main__":
    main()
