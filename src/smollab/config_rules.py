"""What a config may not say: combinations of keys that could not be honoured, and the
environment a key needs. `config.validate` refuses either in one line that names the keys. (The
keys a command does not read at all are `config_not_read.NOT_READ`.)

- The rules across keys and the environment (`tracker_rules`: a tracker's package is installed;
  `shared_rules`, `data_rules`, `pretrain_rules`, `grpo_rules`) run on a
  validated config.
  "Set" means set in YAML or on the command line to a value other than the default
  (`Section.changed`): a default changes nothing, and `smollab config show` prints every key.

Imports nothing of smollab (config imports this) and no torch: the bench parent reads it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from typing import Any

# The rules take config sections (config.DataConfig, PretrainConfig, GRPOConfig, ...): config
# imports this module, so the types are named, not imported.


def data_rules(d: Any) -> None:
    """Rules of the data section (`config.DataConfig`), in every command."""
    hub = d.source in ("simplestories", "tinystories")
    if d.source == "files" and not d.files:
        raise ValueError("data.source=files needs data.files (a list of .txt or .jsonl paths)")
    if d.files and d.source != "files":
        raise ValueError(
            f"data.files is set but data.source={d.source} (files are read only "
            "with data.source=files)"
        )
    if d.changed("max_stories") and not hub:
        raise ValueError(
            f"data.max_stories caps a hub dataset; data.source={d.source} does not "
            "read it (the offline corpus has data.num_stories)"
        )
    if d.changed("num_stories") and d.source != "offline":
        raise ValueError(
            f"data.num_stories sizes the offline corpus; data.source={d.source} does not read it"
        )
    if d.changed("text_key") and not any(f.lower().endswith(".jsonl") for f in d.files):
        raise ValueError(
            "data.text_key names the text field of .jsonl records, and data.files "
            "holds no .jsonl file"
        )
    if hub and d.changed("seed"):
        raise ValueError(
            f"data.seed: data.source={d.source} keeps the dataset's own splits and "
            "order, so nothing is drawn at random"
        )
    if hub and d.changed("test_fraction") and d.max_stories is None:
        raise ValueError(
            f"data.test_fraction: data.source={d.source} uses the dataset's own test "
            "split (the fraction applies only with data.max_stories)"
        )


# run.report_to name -> (the package it imports, the pyproject extra that installs it)
TRACKER_PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "trackio": ("trackio", "trackio"),
}


def tracker_rules(r: Any) -> None:
    """A tracker of `run.report_to` whose package is missing is refused with the extra to install,
    when the config is read: before data, model or run directory, and once in a sweep's parent
    (which validates every trial's config). Only looked up (find_spec), never imported here."""
    for name in r.report_to:
        package, extra = TRACKER_PACKAGES[name]
        if importlib.util.find_spec(package) is None:
            raise ValueError(
                f"run.report_to {name}: the {package} package is not installed; "
                f"pip install 'smollab[{extra}]'"
            )


def shared_rules(c: Any, data: bool = True) -> None:
    """Model, data (a story corpus: `data`), optim, train and run rules of every training
    command."""
    m, o, t, r = c.model, c.optim, c.train, c.run
    if m.path and getattr(m, "preset", None) is not None and m.changed("preset"):
        raise ValueError(
            f"model.preset={m.preset} and model.path={m.path} are both set; the "
            "path wins, so drop model.preset (or set it to null)"
        )
    lora = getattr(m, "lora", None)  # fine-tuning commands only
    keys = lora.changed("r", "alpha", "dropout", "targets") if lora is not None else []
    if keys and not lora.enabled:
        raise ValueError(f"model.lora.{keys[0]} is set but model.lora.enabled is false")
    load_in = getattr(m, "load_in", "none")
    if load_in != "none" and not m.path:
        raise ValueError(
            f"model.load_in={load_in} quantizes weights as they load from "
            "model.path, and model.preset builds a fresh model (save it and set "
            "model.path)"
        )
    routing = getattr(getattr(c, "grpo", None), "routing", None)
    if load_in != "none" and routing is not None and routing.enabled:
        raise ValueError(
            f"model.load_in={load_in}: grpo.routing's adapters are built on a "
            "full-precision base; quantized loading is for model.lora"
        )
    if load_in != "none" and not lora.enabled:
        raise ValueError(
            f"model.load_in={load_in} freezes the base in {load_in}, and "
            "model.lora.enabled is false: only LoRA adapters can train on a "
            "quantized base"
        )
    if data:
        data_rules(c.data)
    if o.schedule == "constant" and o.changed("min_lr"):
        raise ValueError(
            f"optim.min_lr={o.min_lr:g} is set but optim.schedule=constant never decays"
        )
    if o.schedule != "constant" and o.min_lr > o.lr:
        raise ValueError(
            f"optim.min_lr={o.min_lr:g} is above optim.lr={o.lr:g}: the "
            f"{o.schedule} schedule would rise to it"
        )
    if o.schedule != "wsd" and o.changed("decay_fraction"):
        raise ValueError(
            f"optim.decay_fraction is the wsd schedule's; optim.schedule="
            f"{o.schedule} does not read it"
        )
    if not t.save_interval and t.changed("keep_last"):
        raise ValueError(
            "train.keep_last counts periodic checkpoints, and train.save_interval=0 writes none"
        )
    if r.dir and r.changed("name"):
        raise ValueError(
            f"run.name={r.name} names the default run directory, and run.dir={r.dir} is set"
        )
    tracker_rules(r)


def pretrain_rules(c: Any) -> None:
    """Rules of `config.PretrainConfig` beyond the shared ones."""
    t, p = c.train, c.perf
    if not t.eval_interval and t.changed("eval_tokens"):
        raise ValueError(
            "train.eval_tokens sizes each evaluation, and train.eval_interval=0 "
            "turns evaluation off"
        )
    if p.changed("compile_mode") and not p.compile:
        raise ValueError(f"perf.compile_mode={p.compile_mode} is set but perf.compile is false")


def sft_rules(c: Any) -> None:
    """Rules of `config_sft.SFTConfig` beyond the shared ones. A missing model.path or data source
    is refused when the run starts (the schema's defaults must construct)."""
    d, t, p = c.data, c.train, c.perf
    if d.train_file and d.hf_dataset:
        raise ValueError(
            f"data.train_file={d.train_file} and data.hf_dataset={d.hf_dataset} are "
            "both set: give one source of records"
        )
    if d.eval_file and not d.train_file:
        raise ValueError(
            "data.eval_file is the held-out file of data.train_file, which is not "
            "set (an HF dataset holds out data.eval_split)"
        )
    if not d.hf_dataset and (keys := d.changed("hf_name", "split", "eval_split")):
        raise ValueError(f"data.{keys[0]} is read with data.hf_dataset, which is not set")
    if (d.eval_file or d.eval_split) and (keys := d.changed("eval_fraction", "seed")):
        held = "data.eval_file" if d.eval_file else "data.eval_split"
        raise ValueError(
            f"data.{keys[0]} carves a held-out part of the training records, "
            f"and {held} is the held-out set"
        )
    if d.prefetch_factor is not None and d.num_workers == 0:
        raise ValueError(
            "data.prefetch_factor counts batches each worker loads ahead, and "
            "data.num_workers=0 loads in the training process"
        )
    if t.epochs is not None and t.changed("max_steps"):
        raise ValueError(
            f"train.epochs={t.epochs:g} and train.max_steps={t.max_steps} are both "
            "set: the run's length is one or the other"
        )
    if p.changed("compile_mode") and not p.compile:
        raise ValueError(f"perf.compile_mode={p.compile_mode} is set but perf.compile is false")


def rft_rules(c: Any) -> None:
    """Rules of `config_rft.RFTConfig` beyond the shared ones. A missing model.path, prompts
    file or reward is refused when the run starts (the schema's defaults must construct)."""
    r, t, p = c.rft, c.train, c.perf
    if t.epochs is not None and t.changed("max_steps"):
        raise ValueError(
            f"train.epochs={t.epochs:g} and train.max_steps={t.max_steps} are both "
            "set: a round's length is one or the other (train.epochs=null for "
            "steps)"
        )
    if r.keep.threshold is None and r.keep.top_k is None:
        raise ValueError(
            "rft.keep: set threshold, top_k or both (otherwise every completion would be kept)"
        )
    if r.eval_temperature == 0 and r.eval_samples > 1:
        raise ValueError(
            f"rft.eval_samples={r.eval_samples}: rft.eval_temperature=0 is greedy, "
            "so every sample of a prompt would be the same"
        )
    keys = reward_keys(x.name for x in c.reward)
    if r.accuracy_reward is not None and r.accuracy_reward not in keys:
        raise ValueError(
            f"rft.accuracy_reward={r.accuracy_reward} names no reward entry (the "
            f"keys: {', '.join(keys) or 'none'})"
        )
    if p.changed("compile_mode") and not p.compile:
        raise ValueError(f"perf.compile_mode={p.compile_mode} is set but perf.compile is false")


# grpo.loss_type: TRL 1.16's names. The clipped surrogate's family, and the loss-specific keys.
_CLIP_LOSSES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
_SAPO = ("sapo_temperature_pos", "sapo_temperature_neg")
_VESPO = ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg")


def _loss_type_rules(g: Any) -> None:
    """A loss-specific key set for a loss type that does not read it, and TRL's pitfalls."""
    readers = (
        {"epsilon": _CLIP_LOSSES, "epsilon_high": (*_CLIP_LOSSES, "cispo"), "delta": _CLIP_LOSSES}
        | dict.fromkeys(_SAPO, ("sapo",))
        | dict.fromkeys(_VESPO, ("vespo",))
    )
    if g.loss_type == "cispo" and g.epsilon_high is None:
        readers["epsilon"] = ("cispo",)  # TRL's fallback: the weight cap is epsilon
    for key in g.changed(*readers):
        if g.loss_type not in readers[key]:
            raise ValueError(
                f"grpo.{key} is read by loss_type {'/'.join(readers[key])}, and "
                f"grpo.loss_type={g.loss_type} does not read it"
            )
    if g.loss_type == "vespo" and g.importance_sampling_level == "sequence":
        raise ValueError(
            "grpo.importance_sampling_level=sequence: grpo.loss_type=vespo weighs "
            "each sequence by its own ratio and reads no importance level"
        )
    cap = g.epsilon if g.epsilon_high is None else g.epsilon_high
    if g.loss_type == "cispo" and cap < 1:
        raise ValueError(
            f"grpo.loss_type=cispo caps the importance weight at grpo.epsilon_high "
            f"(unset: grpo.epsilon) = {cap:g}, below the on-policy weight 1: set "
            "grpo.epsilon_high >= 1 (ScaleRL: 5.0)"
        )


def grpo_rules(c: Any) -> None:
    """Rules of `config.GRPOConfig` beyond the shared ones."""
    g, f = c.grpo, c.failure
    if c.train.batch_size % g.num_generations:
        raise ValueError(
            f"train.batch_size={c.train.batch_size} must be a multiple of "
            f"grpo.num_generations={g.num_generations}"
        )
    groups = c.train.batch_size // g.num_generations
    if groups % c.train.grad_accum:
        raise ValueError(
            f"train.grad_accum={c.train.grad_accum} must divide the {groups} prompt "
            "groups of a batch (train.batch_size / grpo.num_generations): each "
            "micro-batch holds whole groups"
        )
    _loss_type_rules(g)
    if g.loss_type in _CLIP_LOSSES and g.epsilon_high is not None and g.epsilon_high < g.epsilon:
        raise ValueError(
            f"grpo.epsilon_high={g.epsilon_high:g} is below grpo.epsilon="
            f"{g.epsilon:g}: the upper clip is the wider one (DAPO's "
            "clip-higher)"
        )
    off_policy = ("epsilon", "delta", *_SAPO, *_VESPO)
    off_policy += ("epsilon_high",) if g.loss_type != "cispo" else ()
    if g.num_iterations == 1 and (keys := g.changed(*off_policy)):
        raise ValueError(
            f"grpo.{keys[0]} acts on the ratio to the sampling policy, which is 1 "
            "when each batch is used once (grpo.num_iterations=1)"
        )
    if g.prompts_file and g.changed("prompt_tokens"):
        raise ValueError(
            "grpo.prompt_tokens cuts story openings into prompts, and "
            "grpo.prompts_file's prompts are used whole"
        )
    if g.beta == 0 and g.ref_on_cpu:
        raise ValueError("grpo.ref_on_cpu places the KL reference, and grpo.beta=0 builds none")
    if g.beta == 0 and f.changed("max_kl"):
        raise ValueError(
            "failure.max_kl watches the KL to the reference, and grpo.beta=0 measures none"
        )
    if g.export_merged and c.model.load_in != "none":
        raise ValueError(
            f"grpo.export_merged merges LoRA adapters into the base, and "
            f"model.load_in={c.model.load_in} holds it quantized (merging would "
            "round the adapters away)"
        )
    if g.export_merged and not c.model.lora.enabled:
        raise ValueError(
            "grpo.export_merged merges LoRA adapters, and model.lora.enabled is "
            "false (final/ already holds the full weights)"
        )
    if not c.train.eval_interval and g.eval_prompts_file and not g.routing.enabled:
        raise ValueError(
            "grpo.eval_prompts_file holds evaluation prompts, and "
            "train.eval_interval=0 turns evaluation off"
        )
    if not c.train.eval_interval and g.changed("eval_prompts"):
        raise ValueError(
            "grpo.eval_prompts sizes each evaluation, and train.eval_interval=0 "
            "turns evaluation off"
        )
    if f.stuck_grace_steps < 2 * f.baseline_steps:
        raise ValueError(
            f"failure.stuck_grace_steps={f.stuck_grace_steps} is below 2 x "
            f"failure.baseline_steps={f.baseline_steps}: `stuck` compares the "
            "first and the last baseline_steps rewards, so it could not fire that "
            "early"
        )
    routing_rules(c)


def reward_keys(names: Iterable[str]) -> list[str]:
    """The key of each reward entry, from its function name: the name, `name#2`, `name#3` when
    a name repeats. One rule for the registry (`ResolvedReward.key`, the metric columns), the
    routing rules (`grpo.routing.hack_reward`) and the routing report (task weights)."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return out


def routing_rules(c: Any) -> None:
    """Rules of `grpo.routing` (`config.RoutingConfig`)."""
    rt = c.grpo.routing
    if not rt.enabled:
        keys = rt.changed(*(k for k in type(rt).model_fields if k not in ("enabled", "detector")))
        keys += [f"detector.{k}" for k in rt.detector.changed("name", "params", "threshold")]
        if keys:
            raise ValueError(f"grpo.routing.{keys[0]} is set but grpo.routing.enabled is false")
        return
    if c.model.lora.enabled:
        raise ValueError(
            "grpo.routing.enabled brings its own retain and forget adapters: turn "
            "model.lora.enabled off"
        )
    if rt.retain_r == 0 and rt.forget_r == 0:
        raise ValueError("grpo.routing.retain_r and forget_r are both 0: no adapter to train")
    if rt.mode == "none" and rt.changed("routing_frac"):
        raise ValueError(
            "grpo.routing.routing_frac thins the detector's routed flags, and "
            "grpo.routing.mode=none routes nothing"
        )
    if rt.mode == "none" and rt.changed("label_noise_frac"):
        raise ValueError(
            "grpo.routing.label_noise_frac routes unflagged completions at random, "
            "and grpo.routing.mode=none routes nothing"
        )
    if rt.mode == "none" and rt.changed("retain_advantage"):
        raise ValueError(
            "grpo.routing.retain_advantage picks which unflagged completions "
            "update retain, and grpo.routing.mode=none routes nothing"
        )
    if rt.retain_r == 0 and rt.changed("retain_advantage"):
        raise ValueError(
            "grpo.routing.retain_advantage picks what updates the retain adapter, "
            "and grpo.routing.retain_r=0 has none"
        )
    if rt.ablated_frac > 0 and rt.forget_r == 0:
        raise ValueError(
            "grpo.routing.ablated_frac trains steps with the forget adapter off, "
            "and grpo.routing.forget_r=0 has none (the step would change nothing)"
        )
    if rt.ablated_frac > 0 and rt.retain_r == 0:
        raise ValueError(
            "grpo.routing.ablated_frac trains steps with the forget adapter off, "
            "and grpo.routing.retain_r=0 leaves nothing to train then"
        )
    if rt.ablated_frac > 0 and c.grpo.num_iterations > 1:
        raise ValueError(
            "grpo.routing.ablated_frac needs grpo.num_iterations=1: the old "
            "log-probs are sampled with both adapters, so an ablated step's first "
            "ratio would measure removing the forget adapter"
        )
    keys = reward_keys(r.name for r in c.reward)
    if rt.hack_reward is not None and rt.hack_reward not in keys:
        raise ValueError(
            f"grpo.routing.hack_reward={rt.hack_reward} names no reward entry (the "
            f"keys: {', '.join(keys)})"
        )
    if rt.hack_reward is None and rt.changed("rh_eligible_frac"):
        raise ValueError(
            "grpo.routing.rh_eligible_frac limits grpo.routing.hack_reward, which is not set"
        )
    if not rt.eval_interval and rt.changed("eval_prompts"):
        raise ValueError(
            "grpo.routing.eval_prompts sizes each routing evaluation, and "
            "grpo.routing.eval_interval=0 turns it off"
        )
