"""What every run of a GRPO process shares, set up once: the runtime, the tokenizer, the training
and evaluation prompts (with their columns, which reach every reward) and their order, and the
reward pool, whose rewards are checked against the columns before the model is built and tried on
the starting policy before any run directory is written (a reward that raises, hangs or returns
NaN is bad input). A lanes worker's lanes all agree with its first config on these
(`config.lanes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from smollab.config import GRPOConfig
from smollab.data.prepare import ensure_prepared
from smollab.data.prompt_rows import PromptRows, check_prompt_files
from smollab.device.runtime import Runtime
from smollab.models.loading import check_model_source
from smollab.rewards.pool import RewardPool
from smollab.rewards.registry import check_columns, validate_specs
from smollab.train import distributed, scaffold
from smollab.train.distributed import SINGLE, Dist
from smollab.train.prompts import PromptOrder, Prompts, grpo_prompts
from smollab.train.seeds import stream_seed

if TYPE_CHECKING:
    from smollab.train.grpo.policies import Policies

REWARD_CHECK = 4  # held-out prompts the rewards are tried on


@dataclass
class Shared:
    cfg: GRPOConfig
    rt: Runtime
    d: Dist
    tokenizer: object
    prompts: Prompts
    used: set[str]  # the columns some reward names: samples.jsonl keeps them
    order: PromptOrder  # which prompts each step takes
    pool: RewardPool | None = None

    @staticmethod
    def prepare(cfg: GRPOConfig) -> None:
        """Reward names and parameters, the prompts files and the model checked, then the data
        directory prepared when the prompts are its stories: before anything else is written,
        and under torchrun on every rank before it joins the group (the directory's lock lets
        one build it), so no rank waits in a collective meanwhile."""
        from_data = cfg.grpo.prompts_file or cfg.data.hf_dataset
        # story openings have no columns: checked now, before their corpus is prepared
        validate_specs(cfg.reward, columns=None if from_data else ())
        check_prompt_files(cfg.grpo, "grpo", cfg.data.prompt_field)  # then the model
        check_model_source(cfg.model)
        if not from_data:
            quiet = distributed.launch_rank() != 0
            ensure_prepared(cfg.data, exact=False, log=(lambda _: None) if quiet else print)

    @classmethod
    def load(cls, cfg: GRPOConfig, rt: Runtime, d: Dist = SINGLE) -> Shared:
        """The tokenizer and prompts, once `prepare` has run; the rewards checked against the
        prompts' columns before the model is built."""
        tokenizer = scaffold.load_tokenizer_for(cfg.model, cfg.data, data_tokens=False)
        g = cfg.grpo
        n_eval = max(g.eval_prompts, g.routing.eval_prompts if g.routing.enabled else 0)
        prompts = grpo_prompts(cfg, tokenizer, n_eval)
        rewards = validate_specs(cfg.reward, columns=None)
        used = check_columns(rewards, prompts.train.columns, prompts.train.source)
        return cls(cfg, rt, d, tokenizer, prompts, used, PromptOrder(len(prompts.train)))

    @property
    def train_prompts(self) -> list[list[int]]:
        return self.prompts.train.ids

    @property
    def eval_prompts(self) -> list[list[int]]:
        """The held-out prompts an evaluation samples (the first grpo.eval_prompts)."""
        return self.prompts.held_out.ids[: self.cfg.grpo.eval_prompts]

    def max_steps(self, cfg: GRPOConfig) -> int:
        """A run's length: train.max_steps, or the steps train.epochs over the prompts take."""
        groups = cfg.train.batch_size // cfg.grpo.num_generations
        return (
            self.order.steps(cfg.train.epochs, groups) if cfg.train.epochs else cfg.train.max_steps
        )

    def rows(self, picked: Sequence[int]) -> PromptRows | None:
        """The training prompts' rows of a step's completions (a reward call's `rows`)."""
        return self.prompts.train.data(picked)

    def eval_rows(self, runs: int) -> PromptRows | None:
        """The held-out rows of an evaluation of `runs` runs (their prompts, run after run)."""
        return self.prompts.held_out.data(list(range(len(self.eval_prompts))) * runs)

    def sample_columns(self, picked: Sequence[int]) -> dict[str, list[Any]]:
        """The columns samples.jsonl keeps (those a reward names), for these prompts."""
        rows = self.rows(picked)
        return {} if rows is None else {k: rows.columns[k] for k in sorted(self.used)}

    def open_rewards(self, policies: Policies) -> None:
        """The reward pool, its rewards tried on completions of the first held-out prompts by the
        starting policy, drawn as an evaluation draws them."""
        g = self.cfg.grpo
        train = self.prompts.train
        self.pool = RewardPool(
            self.cfg.reward,
            workers=g.reward_workers,
            timeout_s=g.reward_timeout_s,
            columns=train.columns,
            source=train.source,
        )

        def check() -> None:
            seed = stream_seed(self.cfg.run.seed, -1, 2)
            r = policies.sample_start(self.eval_prompts[:REWARD_CHECK], seed)
            self.pool(
                r.prompt_texts(self.tokenizer),
                r.completion_texts(self.tokenizer),
                r.completion_rows(),
                self.prompts.held_out.data(range(len(r.completion_rows()))),
            )

        distributed.rank0_decides(check, self.d)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def __enter__(self) -> Shared:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
