"""The weighted reward of a batch, computed inline (default) or in a persistent process pool.

Inline is the default because a process pool does not pay for the built-ins. Measured on the
2-core development machine (Python 3.11, other work running), VADER on 32 completions of about 64
tokens, median (10th percentile) per batch over 280 batches, interleaved: inline 14-17 ms
(11.0-11.4), 1 worker 17-19 ms (12.0-13.1), 2 workers 13.6-14.6 ms (10.0); the round trip to a
worker costs about 0.5 ms, and each worker takes 0.5-1.5 s to start (once). Two workers on two
cores also compete with the trainer for them. Workers pay off only for slow pure-Python rewards
(a game simulator, an engine) on a machine with idle cores.

With `workers > 0` the pool starts once (spawn context: safe with torch threads and CUDA in the
parent; each worker imports smollab.rewards, the user's reward modules and, as spawn does, the
parent's main module, so a script that makes a pool must guard its entry with
`if __name__ == "__main__":`) and is reused for every batch; completions are cut into one contiguous chunk per worker and each worker runs every
function on its chunk. User functions must be importable (`module:function`), which they are by
construction of the registry.

A hang is an error, not a stuck run: each function call has `timeout_s` (SIGALRM, inline on the
main thread and inside each worker), and a worker that does not answer within the limit of all
its calls and a margin (stuck in C code a signal cannot interrupt) is killed with the pool.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch

from smollab.data.prompt_rows import PromptRows
from smollab.errors import UserError
from smollab.rewards import registry
from smollab.rewards.registry import (
    RewardError,
    RewardSpec,
    check_columns,
    compute_rewards,
    validate_specs,
)


class RewardPool:
    """`pool(prompts, completions, completion_ids, rows) -> (total [N] float32, {key: values
    [N]})`; rows: the prompts as the data holds them and their columns (`compute_rewards`).

    `total` is the weighted sum of the functions' values; `per_fn` holds each function's RAW
    (unweighted) values under its key (the spec name, `name#2` for a repeat). Any exception in a
    function, a value that is not a finite number, or a result of the wrong length raises a
    RewardError (a UserError) naming the function, and so does a call longer than `timeout_s`
    (0: no limit). `columns` (from `source`) are those every call's rows will hold: checked
    against the rewards' signatures at once, and `used` is those some reward names. Use as a
    context manager or call close().
    """

    WORKER_MARGIN_S = 10.0  # beyond the calls' own limits: the round trip, a busy machine

    def __init__(
        self,
        specs: Sequence[RewardSpec | dict[str, Any]],
        workers: int = 0,
        timeout_s: float = 0.0,
        columns: Sequence[str] = (),
        source: str = "",
    ):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
            raise UserError(f"RewardPool: workers must be an integer >= 0, got {workers!r}")
        if not timeout_s >= 0:
            raise UserError(f"RewardPool: timeout_s must be >= 0, got {timeout_s!r}")
        self.timeout_s = float(timeout_s)
        self.rewards = validate_specs(specs, columns=None)
        self.used = check_columns(self.rewards, columns, source)
        self.keys = [r.key for r in self.rewards]
        self.weights = {r.key: r.weight for r in self.rewards}
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = None
        if workers > 0:
            spec_dicts = [
                {"name": r.name, "weight": r.weight, "params": r.params} for r in self.rewards
            ]
            self._executor = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=mp.get_context("spawn"),
                initializer=registry._worker_init,
                initargs=(spec_dicts,),
            )
            # Start every worker now (imports, VADER lexicon), not inside the first step.
            for f in [self._executor.submit(registry._worker_ping) for _ in range(workers)]:
                self._result(f)

    def _result(self, future: Any, timeout: float | None = None) -> Any:
        try:
            return future.result(timeout=timeout)
        except BrokenProcessPool as e:
            self.close()
            raise RewardError(f"reward worker process died ({e}); try reward workers=0") from e
        except FutureTimeout:
            self._kill()
            raise RewardError(
                f"rewards {', '.join(self.keys)}: a worker did not answer within {timeout:g} s "
                f"(grpo.reward_timeout_s={self.timeout_s:g} per call); it was stopped"
            ) from None

    def _kill(self) -> None:
        """Stop the workers now, one stuck in a call included (shutdown alone waits for it)."""
        ex, self._executor = self._executor, None
        if ex is None:
            return
        procs = list(getattr(ex, "_processes", {}).values())  # no public handle before 3.14
        ex.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            with contextlib.suppress(Exception):
                p.kill()

    def __call__(
        self,
        prompts: list[str] | None,
        completions: list[str],
        completion_ids: list[list[int]] | None = None,
        rows: PromptRows | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        n = len(completions)
        for what, seq in (("prompts", prompts), ("completion_ids", completion_ids)):
            if seq is not None and len(seq) != n:
                raise ValueError(f"RewardPool: {len(seq)} {what} for {n} completions")
        if self._executor is None and self.workers > 0:
            raise RuntimeError("RewardPool is closed")
        if self._executor is None or n < 2:
            values = compute_rewards(
                self.rewards, prompts, completions, completion_ids, 0, self.timeout_s, rows
            )
        else:
            chunks = min(self.workers, n)
            bounds = [n * i // chunks for i in range(chunks + 1)]
            futures = [
                self._executor.submit(
                    registry._worker_run,
                    None if prompts is None else prompts[a:b],
                    completions[a:b],
                    None if completion_ids is None else completion_ids[a:b],
                    a,
                    self.timeout_s,
                    None if rows is None else rows.select(range(a, b)),
                )
                for a, b in zip(bounds[:-1], bounds[1:], strict=True)
            ]
            wait = (
                self.timeout_s * len(self.rewards) + self.WORKER_MARGIN_S
                if self.timeout_s
                else None
            )
            parts = [self._result(f, wait) for f in futures]  # in order: the first error wins
            values = {k: [x for p in parts for x in p[k]] for k in self.keys}
        cpu = torch.device("cpu")  # rewards are host values; the loop copies the advantages over
        per_fn = {k: torch.tensor(v, dtype=torch.float64, device=cpu) for k, v in values.items()}
        total = torch.zeros(n, dtype=torch.float64, device=cpu)
        for k, v in per_fn.items():
            total += self.weights[k] * v
        return total.float(), {k: v.float() for k, v in per_fn.items()}

    def close(self) -> None:
        """Stop the worker processes (no-op inline); the pool cannot be called afterwards."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        ex = getattr(self, "_executor", None)
        if ex is not None:
            with contextlib.suppress(Exception):  # at interpreter shutdown, nothing to clean
                ex.shutdown(wait=False, cancel_futures=True)
