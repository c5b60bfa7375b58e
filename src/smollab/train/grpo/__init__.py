"""GRPO: one core for `smollab grpo` (one process, or its ranks under torchrun) and `smollab lanes
grpo` (many runs as lanes of one batched model).

  run.py        `smollab grpo`, top to bottom: set up, open or resume, steps, wrap up
  lanes.py      `smollab lanes grpo`: the lanes worker (lanes join and leave; a sweep's inbox)
  step.py       one step of every run of the process: rollouts, rewards, advantages, reference,
                update, metrics, evaluation
  update.py     the loss and backward: micro-batches, each run's loss weighted, stats merged
  loss.py       the loss math (TRL's loss types and settings), each run's typed `LossOptions`,
                the entropy bonus's controller
  entropy.py    the training forward that also gives each position's entropy (from the logits)
  run_state.py  one run's own state: its run directory, resume, the after-step block, wrap-up
  setup.py      what a process's runs share: tokenizer, prompts, the reward pool and its check
  policies.py   one policy, or many as lanes: sampling, the training forward, the reference
  ranks.py      what torchrun adds: each rank's prompt groups, gathered rewards, summed gradients
  routing.py    gradient routing's eligibility, flags, masks and evaluations
"""
