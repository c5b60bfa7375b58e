"""What every run of a GRPO process shares, set up once: the runtime, the tokenizer, the training
and evaluation prompts and the reward pool, whose rewards are tried on the starting policy
before any run directory is written (a reward that raises, hangs or returns NaN is bad input).
A lanes worker's lanes all agree with its first config on these (`config.lanes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from smollab.config import GRPOConfig
from smollab.data.prepare import ensure_prepared
from smollab.device.runtime import Runtime
from smollab.models.loading import check_model_source
from smollab.rewards.pool import RewardPool
from smollab.rewards.registry import validate_specs
from smollab.train import distributed, scaffold
from smollab.train.distributed import SINGLE, Dist
from smollab.train.prompts import check_prompt_files, grpo_prompts
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
    train_prompts: list[list[int]]
    eval_prompts: list[list[int]]
    pool: RewardPool | None = None

    @staticmethod
    def prepare(cfg: GRPOConfig) -> None:
        """Reward names and parameters, the prompts files and the model checked, then the data
        directory prepared when the prompts are its stories: before anything else is written,
        and under torchrun on every rank before it joins the group (the directory's lock lets
        one build it), so no rank waits in a collective meanwhile."""
        validate_specs(cfg.reward)
        check_prompt_files(cfg.grpo)  # the files named, then the model: before any data
        check_model_source(cfg.model)
        if not cfg.grpo.prompts_file:
            quiet = distributed.launch_rank() != 0
            ensure_prepared(cfg.data, exact=False, log=(lambda _: None) if quiet else print)

    @classmethod
    def load(cls, cfg: GRPOConfig, rt: Runtime, d: Dist = SINGLE) -> Shared:
        """The tokenizer and prompts, once `prepare` has run."""
        tokenizer = scaffold.load_tokenizer_for(cfg.model, cfg.data, data_tokens=False)
        train_prompts, eval_prompts = grpo_prompts(cfg.grpo, cfg.data.dir, tokenizer)
        return cls(cfg, rt, d, tokenizer, train_prompts, eval_prompts)

    def open_rewards(self, policies: Policies) -> None:
        """The reward pool, its rewards tried on completions of the first held-out prompts by the
        starting policy, drawn as an evaluation draws them."""
        g = self.cfg.grpo
        self.pool = RewardPool(
            self.cfg.reward, workers=g.reward_workers, timeout_s=g.reward_timeout_s
        )

        def check() -> None:
            seed = stream_seed(self.cfg.run.seed, -1, 2)
            r = policies.sample_start(self.eval_prompts[:REWARD_CHECK], seed)
            self.pool(
                r.prompt_texts(self.tokenizer),
                r.completion_texts(self.tokenizer),
                r.completion_rows(),
            )

        distributed.rank0_decides(check, self.d)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def __enter__(self) -> Shared:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
