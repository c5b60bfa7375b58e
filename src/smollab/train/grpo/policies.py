"""How a GRPO process samples and trains its policies: one policy (`smollab grpo`, and each rank
under torchrun), or many as lanes of one batched model (`smollab lanes grpo`).

Both offer the step the same calls (`generate`, `forward`, `reference`), so the step, the loss and
the bookkeeping are written once (`step.py`) and only this differs:
- `OnePolicy`: any HF causal LM (full fine-tuning, LoRA, gradient routing, a quantized base,
  autocast), sampled by the lean sampler where the lean engine reads the model (else HF
  `generate`), its training forward replayed from the decode or computed (`engine.policy`).
- `Lanes`: a frozen base and each lane's policy (its LoRA adapter, or its own copy of every
  weight) read into one `LaneLlama`; one sampler call decodes every lane's rows through its own
  weights, one forward computes every lane's log-probs. What lanes refuse (`config.lanes`) is what
  this batched model cannot do.
The reference (the KL term's starting policy) is built only when a run has a KL term: at setup
for one policy (its starting weights), on first use for lanes (the frozen base never changes).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from smollab.config import GRPOConfig
from smollab.device.runtime import Runtime, release_cache
from smollab.engine.lane_llama import LaneLlama
from smollab.engine.policy import policy_logprobs, replay_blocker
from smollab.engine.reference import Reference, build_reference, shares_policy
from smollab.engine.replay import lanes_logprobs
from smollab.engine.rollout import Rollout
from smollab.engine.sampler import Sampler
from smollab.errors import UserError
from smollab.models.autocast_attention import fit_attention
from smollab.models.loading import align_special_tokens, apply_lora, build_model
from smollab.models.routing import apply_routing
from smollab.train.distributed import Dist
from smollab.train.grpo import ranks
from smollab.train.grpo.entropy import logprobs_and_entropies
from smollab.train.grpo.routing import Router
from smollab.train.grpo.update import Forward

if TYPE_CHECKING:
    from smollab.train.grpo.run_state import RunState


def build_base(cfg: GRPOConfig, rt: Runtime, tokenizer) -> nn.Module:
    """The model as loaded (or initialized from its preset, seeded by run.seed), its special
    tokens aligned with the tokenizer's, its attention fitted to the precision."""
    torch.manual_seed(cfg.run.seed)
    model = build_model(
        cfg.model,
        vocab_size=len(tokenizer),
        attn_implementation=cfg.perf.attn_implementation,
        device=rt.device,
        compute_dtype=rt.autocast_dtype,
        notes=rt.chosen,
    )
    if len(tokenizer) > model.config.vocab_size:
        raise UserError(
            f"tokenizer has {len(tokenizer)} entries, the model only {model.config.vocab_size}"
        )
    align_special_tokens(model, tokenizer)
    if note := fit_attention(model, rt.device, rt.autocast_dtype):
        rt.chosen.append(note)
    return model


def policy_forward(
    policy: nn.Module,
    temperature: float,
    autocast: Callable = contextlib.nullcontext,
    entropies: bool = False,
) -> Forward:
    """One policy's training forward: its log-probs with grad, under the run's autocast; with
    `entropies`, through the model's logits with each position's entropy too (`entropy`)."""

    def logp(part: Rollout, share_prompts: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        with autocast():
            if entropies:
                return logprobs_and_entropies(policy, part, temperature)
            return policy_logprobs(policy, part, temperature, share_prompts=share_prompts), None

    return logp


def lanes_forward(model: LaneLlama, policies: list[nn.Module], temperature: float) -> Forward:
    """Every lane's training forward at once: each lane's log-probs through its own weights
    (read under grad), replayed while the rollout holds the decode of these very weights."""

    def logp(part: Rollout, share_prompts: bool) -> tuple[torch.Tensor, None]:
        model.load_lanes(policies)
        out = lanes_logprobs(model, part, temperature)
        part.record = None  # used once: the graph keeps what the backward needs
        return out, None

    return logp


def _sampling(cfg: GRPOConfig) -> dict:
    g = cfg.grpo
    return dict(
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=g.top_k,
        repetition_penalty=g.repetition_penalty,
    )


def decode_note(sampler: Sampler) -> str:
    """The run log's line on how the sampler decodes, and why."""
    return f"sampler decode: {sampler.decode} ({sampler.decode_reason})"


class OnePolicy:
    """One trainable policy and its sampler."""

    def __init__(self, cfg: GRPOConfig, rt: Runtime, tokenizer, d: Dist, router: Router | None):
        g, tc = cfg.grpo, cfg.train
        lora, routed = cfg.model.lora.enabled, g.routing.enabled
        policy = build_base(cfg, rt, tokenizer)
        if lora:
            policy = apply_lora(policy, cfg.model.lora)
        elif routed:  # retain and forget adapters, both trained
            policy = apply_routing(policy, g.routing)
        if cfg.model.load_in == "none":  # a quantized base is on the device (bitsandbytes)
            policy.to(rt.device)
        # as DDP starts: rank 0's weights on every rank (a quantized base is the same file on each)
        ranks.broadcast_weights(policy, d, trainable_only=cfg.model.load_in != "none")
        if cfg.perf.grad_checkpointing:
            policy.activation_checkpointing_enable()  # the name since transformers 5
        eos = tokenizer.eos_token_id
        self.cfg, self.rt, self.policy = cfg, rt, policy
        self.sampler = Sampler(policy, eos_token_id=eos, pad_token_id=eos, decode=g.decode)
        self.name = self.sampler.backend
        self.decode_note = decode_note(self.sampler)
        self.no_replay = replay_blocker(
            policy,
            self.sampler,
            enabled=g.replay,
            autocast=rt.autocast_dtype is not None,
            batch_size=tc.batch_size,
            max_new_tokens=g.max_completion_length,
            repetition_penalty=g.repetition_penalty,
        )
        self.no_replay = self.no_replay or (router.replay_blocker() if router else None)
        steps = (g.steps_per_generation or tc.grad_accum) // tc.grad_accum
        if steps > 1 and self.no_replay is None:  # the record would be of the whole generation
            self.no_replay = f"grpo.steps_per_generation={g.steps_per_generation} (several steps)"
        self.entropies = g.top_entropy_quantile < 1 or g.entropy_coef != 0 or g.use_adaptive_entropy
        if self.entropies and self.no_replay is None:  # the logits give each position's entropy
            self.no_replay = "per-token entropies (grpo.entropy_coef, use_adaptive_entropy, top_entropy_quantile)"
        if tc.grad_accum > 1 and self.no_replay is None:  # the record holds the whole batch's
            self.no_replay = f"train.grad_accum={tc.grad_accum} (micro-batches)"
        self._reference = (
            build_reference(policy, lora or routed, g.ref_on_cpu) if g.beta > 0 else None
        )
        why = shares_policy(policy, lora or routed, g.ref_on_cpu) if g.beta > 0 else None
        # said in the run log where the reference is not a copy
        self.reference_note = why and f"KL reference: the policy with its adapters off ({why})"

    def generate(
        self, runs: Sequence[RunState], prompts: list[list[int]], seeds: Sequence[int], record=False
    ) -> Rollout:
        """Completions of `prompts` by the policy as it is now, drawn from a generator of its
        run's seed. record: keep the decode for the replay."""
        (seed,) = seeds
        self.policy.eval()
        self.sampler.load_weights(self.policy)
        r = self.sampler.generate(
            prompts,
            self.cfg.grpo.max_completion_length,
            seed=seed,
            record=record,
            **_sampling(self.cfg),
        )
        release_cache(self.rt.device)  # MPS: the decode's temporaries, before the next pass
        return r

    def sample_start(self, prompts: list[list[int]], seed: int) -> Rollout:
        """Completions by the starting policy (the reward check, before the first step)."""
        return self.generate([], prompts, [seed])

    def forward(self, runs: Sequence[RunState]) -> Forward:
        self.policy.train()
        return policy_forward(
            self.policy, self.cfg.grpo.temperature, self.rt.autocast, entropies=self.entropies
        )

    def reference(self) -> Reference | None:
        return self._reference


class Lanes:
    """Many policies of one base model as lanes of one `LaneLlama`."""

    def __init__(self, cfg: GRPOConfig, rt: Runtime, tokenizer):
        g = cfg.grpo
        self.cfg, self.rt = cfg, rt
        self.base = build_base(cfg, rt, tokenizer).to(rt.device).requires_grad_(False)
        try:
            self.model = LaneLlama.from_hf(self.base, adapters=False)
        except (TypeError, NotImplementedError) as e:
            raise UserError(
                f"model {cfg.model.path or cfg.model.preset}: lanes need a "
                f"Llama-shaped model the lean engine reads ({e})"
            ) from None
        eos = tokenizer.eos_token_id
        self.sampler = Sampler(self.model, eos_token_id=eos, pad_token_id=eos, decode=g.decode)
        self.name = "lanes"
        self.decode_note = decode_note(self.sampler)
        # per lane, the budget its run alone has (lanes stand for that many processes): its
        # share of the decode record and of the lane-major copy the replay reads
        self.no_replay = replay_blocker(
            self.base,
            self.sampler,
            enabled=g.replay,
            autocast=False,
            batch_size=cfg.train.batch_size,
            max_new_tokens=g.max_completion_length,
            layer_copies=2,
            repetition_penalty=g.repetition_penalty,
        )
        if cfg.train.grad_accum > 1 and self.no_replay is None:
            self.no_replay = f"train.grad_accum={cfg.train.grad_accum} (micro-batches)"
        self._reference: Reference | None = None

    def new_policy(self, cfg: GRPOConfig) -> nn.Module:
        """A lane's policy: the base with its own adapter (seeded by its run.seed, as its run alone
        seeds before its adapter's init), or without LoRA its own trainable copy of the base."""
        torch.manual_seed(cfg.run.seed)
        if cfg.model.lora.enabled:
            frozen = {id(t): t for t in (*self.base.parameters(), *self.base.buffers())}
            return apply_lora(copy.deepcopy(self.base, memo=frozen), cfg.model.lora)
        return copy.deepcopy(self.base).requires_grad_(True)

    def generate(
        self, runs: Sequence[RunState], prompts: list[list[int]], seeds: Sequence[int], record=False
    ) -> Rollout:
        """Completions of `prompts` (lane-major) through the lanes' policies, each lane's rows
        drawn from a generator of its own seed."""
        with torch.no_grad():
            self.model.load_lanes([run.policy for run in runs])
        r = self.sampler.generate(
            prompts,
            self.cfg.grpo.max_completion_length,
            seed=list(seeds),
            record=record,
            **_sampling(self.cfg),
        )
        release_cache(self.rt.device)
        return r

    def sample_start(self, prompts: list[list[int]], seed: int) -> Rollout:
        """Completions by the base (every lane's starting policy), through a plain sampler."""
        eos = self.sampler.pad_token_id
        sampler = Sampler(self.base, eos_token_id=self.sampler.eos_ids, pad_token_id=eos)
        g = self.cfg.grpo
        return sampler.generate(prompts, g.max_completion_length, seed=seed, **_sampling(self.cfg))

    def forward(self, runs: Sequence[RunState]) -> Forward:
        return lanes_forward(self.model, [run.policy for run in runs], self.cfg.grpo.temperature)

    def reference(self) -> Reference:
        if self._reference is None:
            self._reference = build_reference(self.base, True, self.cfg.grpo.ref_on_cpu)
        return self._reference


Policies = OnePolicy | Lanes
