"""`smollab grpo`: GRPO for small causal LMs, full fine-tuning, LoRA or gradient routing, top to
bottom: set up -> open or resume the run -> steps (`step.step`) until the budget, a failure rule or
an interrupt -> wrap up.

`train.max_time` counts training time (the sum of step times, kept in the checkpoint), like
pretraining's: loading and evaluation are free. Under torchrun each rank takes whole prompt groups
of every step and the ranks sum their gradients (`ranks`); rank 0 writes the run directory,
evaluates and decides the failure rules, and the ranks leave the loop together.
"""

from __future__ import annotations

import time

from smollab.config import GRPOConfig
from smollab.device.runtime import setup_runtime
from smollab.models.quantized import check_load_in
from smollab.train import distributed, scaffold
from smollab.train.crash_record import records_failure
from smollab.train.grpo import ranks
from smollab.train.grpo.policies import OnePolicy
from smollab.train.grpo.routing import Router
from smollab.train.grpo.run_state import RunState
from smollab.train.grpo.setup import Shared
from smollab.train.grpo.step import step
from smollab.train.progress import Progress


@records_failure
def train(cfg: GRPOConfig) -> dict:
    t_start = time.time()
    g = cfg.grpo
    router = Router(g.routing, cfg.run.seed, cfg.reward) if g.routing.enabled else None
    ranks.check(cfg)  # a batch torchrun's ranks cannot split into whole groups
    rt = setup_runtime(cfg.perf)
    check_load_in(cfg.model.load_in, rt.device)  # CUDA and bitsandbytes, before any data too
    Shared.prepare(cfg)  # checks, then data: every rank, before it joins the group
    d, rt.device = distributed.setup(rt.device)

    # ---- tokenizer, prompts, policy, sampler, reference, rewards (tried before any write) --
    with Shared.load(cfg, rt, d) as shared:  # closes the reward pool however it ends
        if router:
            router.use_prompts(shared.prompts.held_out)
        policies = OnePolicy(cfg, rt, shared.tokenizer, d, router)
        shared.open_rewards(policies)

        # ---- run directory and resume (rank 0 writes it; every rank resumes alike) ---------
        state = RunState.open(
            cfg,
            policies.policy,
            rt=rt,
            sampler=policies.name,
            no_replay=policies.no_replay,
            max_steps=shared.max_steps(cfg),
            prompts_note=shared.prompts.note,
            router=router,
            started=t_start,
            d=d,
        )
        if isinstance(state, dict):  # finished already: its summary
            distributed.teardown(d)
            return state
        if state.run:
            state.run.log(policies.decode_note)
        if state.run and policies.reference_note:
            state.run.log(policies.reference_note)
        progress = Progress(state.max_steps, enabled=d.main, start=state.step, label="grpo")
        state.echo = not progress.live
        interrupts = ranks.Interrupts(d)  # torchrun: SIGINT sets a flag, see `leave`
        try:
            while state.step < state.max_steps and state.ended is None:
                why = ranks.leave(state.out_of_time, interrupts.flag, d)  # all ranks together
                if why == "interrupted":
                    state.ended = ("interrupted", f"interrupted at step {state.step}")
                if why:
                    break
                step(shared, policies, [state])
                progress.update(
                    state.step,
                    reward=state.row["reward_mean"],
                    kl=state.row["kl"],
                    uniq=state.row["unique_fraction"],
                )
            scaffold.check_replicas(state.run, d, state.policy, state.optimizer, rt.scaler)
        except KeyboardInterrupt:
            state.ended = ("interrupted", f"interrupted at step {state.step}")
        finally:
            interrupts.restore()
            progress.close()

    # ---- wrap up (rank 0) ------------------------------------------------------------------
    summary = state.finish(shared.tokenizer)
    distributed.teardown(d)
    if state.ended and state.ended[0] == "interrupted":
        raise KeyboardInterrupt
    return summary
