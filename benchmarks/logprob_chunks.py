"""Chunked log-probs of a large vocabulary: chunks sized by vocabulary and device
(`token_logprobs.chunk_rows`) vs the old one constant (1M logits a chunk, 6 rows of a 151k head),
forward and backward of `selected_logprobs` taking turns in one process (never run by CI).

    python benchmarks/logprob_chunks.py [--vocab 151936] [--hidden 896] [--tokens 1024]
                                        [--repeats 5]

Prints the median seconds of each and their ratio, with the CPU and its load.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

import smollab.engine.token_logprobs as tl


def old_rows(vocab: int, device: torch.device) -> int:
    return max(1, (1 << 20) // vocab)


def run(h, w, targets) -> float:
    t0 = time.perf_counter()
    out = tl.selected_logprobs(h, w, targets)
    out.sum().backward()
    h.grad = w.grad = None
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151_936)  # Qwen2.5 / Qwen3
    p.add_argument("--hidden", type=int, default=896)  # Qwen2.5-0.5B
    p.add_argument("--tokens", type=int, default=1024)  # 16 completions x 64 tokens
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    h = torch.randn(a.tokens, a.hidden, device=cpu, requires_grad=True)
    w = (0.02 * torch.randn(a.vocab, a.hidden, device=cpu)).requires_grad_(True)
    targets = torch.randint(0, a.vocab, (a.tokens,), device=cpu)
    sized = tl.chunk_rows
    times: dict[str, list[float]] = {"constant": [], "sized": []}
    for _ in range(a.repeats):
        for name, rows in (("constant", old_rows), ("sized", sized)):
            tl.chunk_rows = rows
            times[name].append(run(h, w, targets))
    tl.chunk_rows = sized
    print(
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"load {os.getloadavg()[0]:.2f}; head {a.vocab} x {a.hidden}, {a.tokens} tokens, "
        "forward + backward"
    )
    for name, rows in (("constant", old_rows), ("sized", sized)):
        print(
            f"  {name:8s} {rows(a.vocab, cpu):4d} rows a chunk: "
            f"{statistics.median(times[name]):.3f} s (median of {a.repeats})"
        )
    ratio = statistics.median(times["constant"]) / statistics.median(times["sized"])
    print(f"  sized is {ratio:.2f}x the constant's speed")


if __name__ == "__main__":
    main()
