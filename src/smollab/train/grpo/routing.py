"""Gradient routing's pieces of the GRPO step (`grpo.routing`), so the step reads top to bottom.

Per step, `Router.score` takes the rewards and completions: completions not eligible for the hack
reward (drawn per prompt or per completion, `eligibility`) lose its term from the total (before
advantages; the total is then capped at `reward_cap`), the detector flags completions that show
the hack (`hack_rate`; with `gate_flags` only the eligible ones), and `routing_frac` of those are
routed (an imperfect classifier's recall); label noise routes `label_noise_frac` of the others
(false positives, not thinned). `Router.passes` gives the update the training forward(s) and
backward(s) of a micro-batch: the per-completion masks of the mode and, on ablated steps, the
forget adapter off; with retain_advantage=penalty a retain pass and a forget pass, each on its
own advantages.
`Router.evaluate` samples fixed held-out prompts in the three adapter modes and appends one row
per mode to `routing_eval.jsonl`.

Every random choice is seeded by integers only (`train.seeds.stream_seed`): eligibility by
(seed, prompt index), so a group shares it and a resumed run agrees, or (per completion) by
(seed, step, prompt index, occurrence); label noise, routing and ablation by (seed, step).
"""

from __future__ import annotations

import contextlib
import random
from collections import Counter
from collections.abc import Iterator

import torch

from smollab.config import RewardSpec, RoutingConfig
from smollab.data.prompt_rows import PromptRows
from smollab.device.runtime import release_cache
from smollab.models.routing import MODES, adapter_mode, forget_scale, masks_for, routing_masks
from smollab.rewards.registry import compute_rewards, reward_keys, validate_specs
from smollab.train.diversity import mean_pairwise_jaccard, unique_fraction
from smollab.train.grpo.loss import STD_EPS, group_advantages
from smollab.train.grpo.update import Pass
from smollab.train.prompts import PromptSet
from smollab.train.seeds import stream_seed

_ELIGIBLE, _NOISE, _ABLATE, _EVAL = 11, 12, 13, 14  # salts of the seeded draws (grpo: 0-2)


def _uniform(*key: int) -> float:
    return random.Random(stream_seed(*key)).random()


class Router:
    """One run's routing state: the detector, this step's flags, the evaluation prompts."""

    def __init__(self, cfg: RoutingConfig, seed: int, rewards: list[RewardSpec]):
        self.cfg, self.seed = cfg, seed
        keys = reward_keys(r.name for r in rewards)  # the reward pool's keys
        self.weights = {k: r.weight for k, r in zip(keys, rewards, strict=True)}
        det = cfg.detector  # validated like a reward, before any work
        self.detector = validate_specs([RewardSpec(name=det.name, params=det.params)])[0]
        self.prompts: list[list[int]] = []
        self.rows: PromptRows | None = None  # their data's rows, for the rewards
        self.routed = torch.zeros(0, dtype=torch.bool)
        self.retain_advantages: torch.Tensor | None = None  # penalty: this step's, for retain
        self.row: dict[str, float] = {}

    def replay_blocker(self) -> str | None:
        """Why the routed training forward cannot replay the decode (None: it can)."""
        if self.cfg.mode != "none":
            return "gradient routing (per-completion masks)"
        if self.cfg.ablated_frac > 0:
            return "gradient routing's ablated steps (forget adapter off)"
        return None

    def use_prompts(self, held_out: PromptSet) -> None:
        """Its `eval_prompts` fixed evaluation prompts: the first held-out ones, where GRPO's
        evaluation takes its own."""
        n = min(self.cfg.eval_prompts, len(held_out))
        self.prompts, self.rows = held_out.ids[:n], held_out.data(range(n))

    def detect(self, prompts: list[str], completions: list[str], rows) -> torch.Tensor:
        """bool [B]: the detector's value >= threshold."""
        values = compute_rewards([self.detector], prompts, completions, rows)[self.detector.key]
        return torch.tensor(values, dtype=torch.float64) >= self.cfg.detector.threshold

    def score(
        self,
        step: int,
        *,
        picked: list[int],
        total: torch.Tensor,
        per_fn: dict[str, torch.Tensor],
        prompts: list[str],
        completions: list[str],
        rows,
    ) -> torch.Tensor:
        """The total reward with the hack term removed for ineligible completions and capped at
        `reward_cap`; sets this step's routed completions and metrics. picked: each completion's
        prompt index."""
        c, n = self.cfg, len(completions)
        eligible = torch.tensor(
            [u < c.rh_eligible_frac for u in self.eligibility_draws(step, picked)]
        )
        if c.hack_reward is not None:
            drop = self.weights[c.hack_reward] * per_fn[c.hack_reward]
            total = torch.where(eligible, total, total - drop.to(total.dtype))
        if c.reward_cap is not None:
            total = total.clamp(max=c.reward_cap)
        hack = self.detect(prompts, completions, rows)
        flagged = hack & eligible if c.gate_flags else hack
        gen = torch.Generator().manual_seed(stream_seed(self.seed, step, _NOISE))
        noise = torch.rand(n, generator=gen, dtype=torch.float64) < c.label_noise_frac
        caught = torch.rand(n, generator=gen, dtype=torch.float64) < c.routing_frac
        routed = (flagged & caught) | (~flagged & noise)  # routing_frac: the detector's recall
        self.routed = routed if c.mode != "none" else torch.zeros(n, dtype=torch.bool)
        self.row = {
            "hack_rate": float(hack.float().mean()),
            "routed_frac": float(self.routed.float().mean()),
            "eligible_frac": float(eligible.float().mean()),
        }
        return total

    def eligibility_draws(self, step: int, picked: list[int]) -> list[float]:
        """One uniform draw per completion, compared with rh_eligible_frac. eligibility=prompt:
        keyed by the prompt alone, so a group shares it and every step agrees. completion: keyed
        by (step, prompt, its k-th completion this step), so siblings draw apart and every rank
        draws the same for a completion whichever rows it holds."""
        if self.cfg.eligibility == "prompt":
            return [_uniform(self.seed, i, _ELIGIBLE) for i in picked]
        seen: Counter[int] = Counter()
        draws = []
        for i in picked:
            draws.append(_uniform(self.seed, step, i, seen[i], _ELIGIBLE))
            seen[i] += 1
        return draws

    def advantages(
        self, total: torch.Tensor, advantages: torch.Tensor, G: int, scale: str
    ) -> torch.Tensor:
        """The advantages `retain_advantage` trains on, from the full-group ones (all, positive:
        unchanged). renorm: each unflagged row re-centred on the mean of its group's unflagged
        rows and scaled by their std, so a hacking sibling's bonus does not push the unflagged
        ones below zero; flagged rows keep the full-group value. balanced: every row's baseline
        is the mean of its group's unflagged rows, its scale the whole group's std (forget's
        doubled gradient on flagged rows is in `passes`). A group with no unflagged row keeps
        the full-group values. penalty: unchanged, and retain's own (`retain_advantages`) are
        the group advantages of the total with `retain_penalty` taken off each flagged row, so
        the retain adapter learns to avoid what it is not allowed to carry. scale:
        grpo.scale_rewards (renorm and balanced: group or none)."""
        mode = self.cfg.retain_advantage
        if mode == "penalty":
            penalized = total.detach().double() - self.cfg.retain_penalty * self.routed.double()
            self.retain_advantages = group_advantages(penalized, G, scale).to(advantages.dtype)
        if mode not in ("renorm", "balanced"):
            return advantages
        r = total.detach().double().view(-1, G)
        ok = (~self.routed).view(-1, G).to(r.dtype)
        n_ok = ok.sum(1, keepdim=True)
        mean_ok = torch.where(
            n_ok > 0, (r * ok).sum(1, keepdim=True) / n_ok.clamp(min=1), r.mean(1, keepdim=True)
        )
        centred = r - mean_ok
        if mode == "balanced":
            if scale == "group":
                centred = centred / (r.std(1, keepdim=True) + STD_EPS)
            return centred.reshape(-1).to(advantages.dtype)
        if scale == "group":  # unbiased, as group_advantages; one unflagged row: 0 / eps = 0
            var_ok = (centred.square() * ok).sum(1, keepdim=True) / (n_ok - 1).clamp(min=1)
            centred = centred / (var_ok.sqrt() + STD_EPS)
        renormed = centred.reshape(-1).to(advantages.dtype)
        return torch.where(ok.reshape(-1).bool(), renormed, advantages)

    def ablated(self, step: int) -> bool:
        return (
            self.cfg.ablated_frac > 0 and _uniform(self.seed, step, _ABLATE) < self.cfg.ablated_frac
        )

    def passes(
        self, policy, step: int, advantages: torch.Tensor, rows: slice | torch.Tensor = slice(None)
    ) -> list[Pass]:
        """The training pass(es) of a micro-batch: the mode's masks on this step's routed
        completions (with retain_advantage=positive, retain also skips the rows whose advantage
        is not above 0; with balanced, forget's gradient is doubled on flagged rows: a mask of
        2), the forget adapter off on an ablated step. penalty: two passes over every row, as
        small-rl's separate passes: retain alone on `retain_advantages`, then forget alone on
        the full-group ones and the mode's rows (classic: all; exclusive: the flagged); the
        second is the reported one. rows: the completions of this forward (a gradient
        accumulation micro-batch); advantages: all."""
        flags = self.routed[rows]
        retain, forget = masks_for(flags, self.cfg.mode)
        which = self.cfg.retain_advantage
        if retain is not None and which == "positive":
            retain = retain * (advantages[rows].detach().cpu() > 0).to(retain.dtype)
        if which == "balanced":  # forget's gradient doubled on flagged rows
            forget = (torch.ones(len(flags)) if forget is None else forget) + flags.float()
        if which != "penalty":
            return [Pass(self._masked(policy, step, retain, forget))]
        off = torch.zeros(len(flags))
        retain_adv = self.retain_advantages.to(advantages.device)
        return [
            Pass(self._masked(policy, step, None, off), retain_adv, reported=False),
            Pass(self._masked(policy, step, off, forget)),
        ]

    @contextlib.contextmanager
    def _masked(
        self, policy, step: int, retain: torch.Tensor | None, forget: torch.Tensor | None
    ) -> Iterator[bool]:
        """Around one training forward and its backward: the masks, the forget adapter off on an
        ablated step. Yields whether the forward may share prompts (not under masks: they need
        one row per completion)."""
        dev = next(policy.parameters()).device
        retain, forget = (
            None if m is None or bool((m == 1).all()) else m.to(dev) for m in (retain, forget)
        )
        mode = "retain_only" if self.ablated(step) else "both"
        with adapter_mode(policy, mode), routing_masks(policy, retain, forget):
            yield retain is None and forget is None

    def due(self, step: int, max_steps: int) -> bool:
        every = self.cfg.eval_interval
        return bool(every) and (step % every == 0 or step == max_steps)

    @torch.no_grad()
    def evaluate(self, step: int, sampler, policy, g, pool, tokenizer) -> list[dict]:
        """One row per adapter mode on the fixed held-out prompts, then one per
        `eval_forget_scales` entry (mode forget_scale, its `forget_scale`): mean total reward,
        each reward's mean (every prompt gets every reward here), the detector's hack rate and
        the completions' diversity. The sampler is left loaded with the last mode: the loop loads
        the policy again before it samples."""
        policy.eval()
        out = []
        runs = [(m, None) for m in MODES] + [("both", s) for s in self.cfg.eval_forget_scales]
        for mode, scale in runs:
            with adapter_mode(policy, mode), forget_scale(policy, 1.0 if scale is None else scale):
                sampler.load_weights(policy)
            r = sampler.generate(
                self.prompts,
                g.max_completion_length,
                temperature=g.temperature,
                top_p=g.top_p,
                top_k=g.top_k,
                repetition_penalty=g.repetition_penalty,
                seed=stream_seed(self.seed, -1, _EVAL),
            )
            release_cache(sampler.device)
            texts, prompts, rows = (
                r.completion_texts(tokenizer),
                r.prompt_texts(tokenizer),
                r.completion_rows(),
            )
            total, per_fn = pool(prompts, texts, rows, self.rows)
            row = {"step": step, "mode": mode, "reward_mean": float(total.mean())}
            if scale is not None:
                row.update(mode="forget_scale", forget_scale=scale)
            row.update({f"reward/{k}": float(v.mean()) for k, v in per_fn.items()})
            row.update(
                hack_rate=float(self.detect(prompts, texts, rows).float().mean()),
                unique_fraction=unique_fraction(texts),
                jaccard=mean_pairwise_jaccard(texts),
            )
            out.append(row)
        return out


def eval_line(rows: list[dict]) -> str:
    """The log line of one routing evaluation."""
    parts = [f"{_label(r)} reward {r['reward_mean']:.3f} hack {r['hack_rate']:.2f}" for r in rows]
    return f"routing eval step {rows[0]['step']}: " + " | ".join(parts)


def _label(row: dict) -> str:
    return f"forget x{row['forget_scale']:g}" if "forget_scale" in row else row["mode"]
