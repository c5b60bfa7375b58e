"""The lean sampler's rollout, one source tree against another, in one invocation (never run by CI).

Why: a change to the lean forward must not slow the plain-Llama hot path. Two versions of smollab
cannot share a process, so each round launches one child per tree (PYTHONPATH set to it; which
goes first alternates), and each child times `--repeats` rollouts of the SimpleStories-1.25M
model (`rollout_vs_hf_generate.simplestories_model`: 32 rows, 8-token prompts, 64 new tokens,
temperature 1, no EOS stop). Printed: the median over all rollouts of each tree, wall and
process CPU time, and their ratio (with one thread CPU time is robust to other processes), and
the ATen ops one decode step dispatches, a count no load can blur.

    git worktree add /tmp/before HEAD~1
    python benchmarks/lean_decode_before_after.py --old /tmp/before/src [--new src] [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(args) -> None:
    """Time the rollouts with whatever smollab PYTHONPATH names; print them as one JSON line."""
    import torch

    sys.path.insert(0, str(HERE))
    from rollout_vs_hf_generate import _time, rollout_pair, simplestories_model

    import smollab

    torch.set_num_threads(args.threads)
    sampler, *_, ours, _ = rollout_pair(simplestories_model(), args.batch, 8, args.new_tokens)
    assert sampler.backend == "lean"
    ours()
    ours()
    times = _time(ours, args.repeats)
    print(json.dumps({"smollab": smollab.__file__, "times": times, "ops": _decode_ops(sampler)}))


def _decode_ops(sampler) -> int:
    """ATen ops one decode step dispatches (a count, free of the machine's noise)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    lean, B = sampler.lean, 32
    ids = torch.randint(3, 100, (B, 8))
    with torch.inference_mode():
        cache = lean.new_cache(B, 16)
        lean(ids, cache=cache, logits_to_keep=1)
        cos, sin = lean.rope(torch.full((B,), 8))
        cos, sin = cos[:, None], sin[:, None]
        with Count():
            lean.decode(ids[:, 0], cos, sin, cache, 8)
    return Count.n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the old tree's src directory")
    ap.add_argument("--new", default=str(HERE.parent / "src"), help="the new tree's src")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=5, help="rollouts timed per child")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--new-tokens", dest="new_tokens", type=int, default=64)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    trees = {"old": str(Path(args.old).resolve()), "new": str(Path(args.new).resolve())}
    times: dict[str, list] = {"old": [], "new": []}
    where, ops = {}, {}
    for r in range(args.rounds):
        for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
            env = {**os.environ, "PYTHONPATH": trees[name]}
            cmd = [sys.executable, __file__, "--child", "--old", args.old]
            cmd += ["--threads", str(args.threads), "--repeats", str(args.repeats)]
            cmd += ["--batch", str(args.batch), "--new-tokens", str(args.new_tokens)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            got = json.loads(out.stdout.strip().splitlines()[-1])
            times[name] += got["times"]
            where[name], ops[name] = got["smollab"], got["ops"]
    n_tok = args.batch * args.new_tokens
    print(
        f"{args.rounds} rounds x {args.repeats} rollouts per tree, alternated; {args.threads} "
        f"thread(s); SimpleStories-1.25M, batch {args.batch} x {args.new_tokens} new tokens"
    )
    med = {k: [statistics.median(t[i] for t in v) for i in (0, 1)] for k, v in times.items()}
    print(f"{'':6s}{'wall ms':>9s}{'tok/s':>8s}{'cpu ms':>9s}{'ops/step':>10s}  smollab")
    for name in ("old", "new"):
        w, c = med[name]
        row = f"{name:6s}{w * 1e3:9.1f}{n_tok / w:8.0f}{c * 1e3:9.1f}{ops[name]:10d}"
        print(f"{row}  {where[name]}")
    print(
        f"new / old time: wall {med['new'][0] / med['old'][0]:.3f}, "
        f"cpu {med['new'][1] / med['old'][1]:.3f}"
    )


if __name__ == "__main__":
    main()
