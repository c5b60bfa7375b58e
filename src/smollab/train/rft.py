"""`smollab rft`: rejection-sampling fine-tuning, rounds of generate -> score -> keep -> SFT ->
evaluate, all in one run directory, top to bottom.

Round N lives in rounds/N/: `data.jsonl` (the kept completions) and `stats.json` (what was
generated and kept), `sft/` (the round's `smollab sft` run, on the scaffold like any run), and
for LoRA `model/` (the adapters merged into full weights: the next round's model). Generation
samples the last model (round 1: model.path); the round's SFT starts from it
(`rft.restart_from=last`) or from model.path (`base`, STaR's restart). After each round the
held-out prompts (`rft.eval_prompts_file`, `data.eval_split` or `data.eval_fraction`) are sampled
and scored: metrics.csv gets one row per
round (its `step` is the round; round 0 is the base model), with `accuracy` = the fraction of
held-out completions whose `rft.accuracy_reward` value is >= 1.

Prompts come from data as GRPO's do (`rft.prompts_file`: .txt one a line, or a .jsonl, .csv or
.parquet table; `data.hf_dataset`): every column but the prompt reaches every reward, one value per
completion, and chat-message prompts go through the model's chat template. A round's data.jsonl
keeps each prompt as the model read it, and the columns a reward reads.

Resume: a round is done when its metrics row is written. A rerun (run.resume=auto) keeps those,
and a round cut short resumes from its last finished stage: stats.json written (data is kept,
not regenerated) -> its SFT resumes from its own checkpoint -> merge and evaluation are redone
(deterministic). Every draw is seeded by (run.seed, round), so a resumed run ends with the files
of an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path

from smollab.config import ModelConfig
from smollab.config import load as config_load
from smollab.config.rft import RFTConfig
from smollab.data.prompt_encode import encode_rows
from smollab.data.prompt_rows import PromptRows, held_out, load_rows
from smollab.device.runtime import setup_runtime
from smollab.engine.sampler import Sampler
from smollab.errors import UserError
from smollab.models.loading import build_model, check_model_source
from smollab.rewards.registry import check_columns, validate_specs
from smollab.rundir.atomic import read_json
from smollab.rundir.columns import RFT as COLUMNS
from smollab.rundir.runs import ROUNDS, RunView, run_path
from smollab.train import crash_record, distributed, rft_data, scaffold, sft
from smollab.train.crash_record import records_failure
from smollab.train.prompts import same_form
from smollab.train.seeds import stream_seed

_EVAL_SALT = 0xE7A1  # the held-out draws: the same for every round


def run_dir_for(cfg: RFTConfig) -> Path:
    source = Path(cfg.rft.prompts_file or cfg.data.hf_dataset or "rft").stem
    kind = f"lora{cfg.model.lora.r}" if cfg.model.lora.enabled else "full"
    return run_path(
        cfg.run.dir, "rft", [cfg.run.name or source, kind, f"r{cfg.rft.rounds}", f"s{cfg.run.seed}"]
    )


def _prompt_rows(cfg: RFTConfig) -> tuple[PromptRows, PromptRows, str]:
    """The training and held-out prompts and how the held-out ones were chosen, refused in one
    line when either is missing."""
    r = cfg.rft
    rows = load_rows(r.prompts_file, "rft.prompts_file", cfg.data)
    if rows is None:
        raise UserError(
            "rft.prompts_file or data.hf_dataset: rft needs prompts (a .txt file, one a line, "
            "or a table with a prompt column)"
        )
    rows, held, how = held_out(rows, r.eval_prompts_file, "rft.eval_prompts_file", cfg.data)
    if held is None:
        raise UserError(
            "rft.eval_prompts_file, data.eval_split or data.eval_fraction: rft measures "
            "accuracy on held-out prompts"
        )
    same_form(rows, held, "rft.eval_prompts_file")
    return rows, held, how


def sft_config(cfg: RFTConfig, data: Path, start: str, out: Path):
    """The `smollab sft` config of a round: RFT's model (LoRA), optim, train, perf and sft
    sections, the round's records (also named as the held-out file, so nothing is carved out;
    held-out loss is off), its own run directory, resumed when it exists, plots as RFT's."""
    train = config_load.to_dict(cfg.train)
    if train["epochs"] is None:
        train.pop("epochs")
    else:
        train.pop("max_steps")
    values = dict(
        model={
            "path": start,
            "dtype": cfg.model.dtype,
            "lora": config_load.to_dict(cfg.model.lora),
        },
        data={"train_file": str(data), "eval_file": str(data)},
        optim=config_load.to_dict(cfg.optim),
        train={**train, "eval_interval": 0},
        perf=config_load.to_dict(cfg.perf),
        sft=config_load.to_dict(cfg.sft),
        run={"dir": str(out), "resume": "auto", "seed": cfg.run.seed, "plots": cfg.run.plots},
    )
    return config_load.load_config("sft", None, (), config_load.flatten(values))


def load_sampler(path: str | Path, device, dtype: str):
    model = build_model(ModelConfig(preset=None, path=str(path), dtype=dtype)).to(device).eval()
    tokenizer = scaffold.load_tokenizer_for(ModelConfig(preset=None, path=str(path)), None, False)
    eos = tokenizer.eos_token_id
    return Sampler(model, eos_token_id=eos, pad_token_id=eos), tokenizer


def merge_lora(start: str, sft_run: Path, out: Path, dtype: str) -> None:
    """A LoRA round's adapters (trained on `start`) merged into full weights at `out`, the next
    round's model and the one evaluated, written under a temporary name and renamed. PEFT merges:
    transformers' own adapter loading keeps them apart, and would save the adapters alone."""
    from peft import PeftModel

    from smollab.models.loading import peft_wrapping, resolve_model_dir

    where = resolve_model_dir(str(sft_run))
    with peft_wrapping():
        base = build_model(ModelConfig(preset=None, path=start, dtype=dtype))
        model = PeftModel.from_pretrained(base, where)
    tokenizer = scaffold.load_tokenizer_for(
        ModelConfig(preset=None, path=str(sft_run)), None, False
    )
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.merge_and_unload().save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


@records_failure
def train(cfg: RFTConfig) -> dict:
    """Run (or resume, or report the finished result of) one RFT run; returns its summary."""
    t_start = time.time()
    distributed.single_process_only("rft")
    r = cfg.rft
    if not cfg.model.path:
        raise UserError(
            "model.path: rft fine-tunes a trained model (a run directory, HF model "
            "directory or hub id) and samples it with its own tokenizer"
        )
    if not cfg.reward:
        raise UserError(
            "reward: rft scores completions with at least one reward (a checker's "
            "name or module:function)"
        )
    rewards = validate_specs(cfg.reward, columns=None)
    acc_key = r.accuracy_reward or rewards[0].key
    base = str(cfg.model.path)
    train_rows, held_rows, held_note = _prompt_rows(cfg)
    check_model_source(cfg.model)  # after the prompts named, before anything is written
    used = check_columns(rewards, list(train_rows.columns), train_rows.source)
    tokenizer = scaffold.load_tokenizer_for(ModelConfig(preset=None, path=base), None, False)
    prompts = encode_rows(train_rows, tokenizer, base, r.system_prompt, "rft.system_prompt")
    held_out = encode_rows(held_rows, tokenizer, base, r.system_prompt, "rft.system_prompt")
    device = setup_runtime(cfg.perf).device

    # ---- run directory: resume or start ---------------------------------------------------
    run, finished = scaffold.open_run(run_dir_for(cfg), cfg, "rft")
    if finished is not None:
        return finished
    rows = RunView(run.path).metrics()  # rounds finished before an interruption
    done = max((int(x["step"]) for x in rows), default=-1)
    if done < 0:  # nothing finished: a fresh start, rounds/ from a run cut short go too
        shutil.rmtree(run.path / ROUNDS, ignore_errors=True)
    run.open_metrics(COLUMNS, resume_step=done if done >= 0 else None)
    run.update_summary(
        status="running",
        prompts=len(train_rows),
        eval_prompts=len(held_rows),
        accuracy_reward=acc_key,
        device=str(device),
    )
    run.log(f"prompts: {train_rows.describe()}; held out: {held_note}", echo=True)
    run.log(
        f"rft: {r.rounds} rounds of {len(train_rows)} prompts x {r.oversample} completions; "
        f"keep total reward >= {r.keep.threshold} (top {r.keep.top_k or 'all'} per prompt, "
        f"dedup {r.dedup}); held out: {len(held_rows)} prompts x {r.eval_samples}; accuracy "
        f"= fraction with {acc_key} >= 1; SFT from the {r.restart_from} model",
        echo=True,
    )

    def model_of(n: int) -> str:
        """The model after round n (0: the base)."""
        if n == 0:
            return base
        d = run.path / ROUNDS / str(n)
        return str(d / "model" if cfg.model.lora.enabled else d / "sft")

    def evaluate(n: int) -> tuple[float, float]:
        sampler, tokenizer = load_sampler(model_of(n), device, cfg.model.dtype)
        scored, _ = rft_data.sample_scored(
            sampler,
            tokenizer,
            held_out,
            held_rows,
            rewards,
            n=r.eval_samples,
            batch_prompts=r.gen_batch_size,
            max_new_tokens=r.max_new_tokens,
            temperature=r.eval_temperature,
            top_p=r.top_p,
            seed=stream_seed(cfg.run.seed, _EVAL_SALT),
        )
        mean = sum(s.reward for s in scored) / len(scored)
        return rft_data.accuracy(scored, acc_key), mean

    if done < 0:
        acc, mean = evaluate(0)
        run.metrics.append(
            dict(step=0, accuracy=acc, eval_reward_mean=mean, wall_s=time.time() - t_start)
        )
        run.log(f"round 0 (base {base}): accuracy {acc:.3f}, eval reward {mean:.3f}", echo=True)
        done = 0

    # ---- the rounds -----------------------------------------------------------------------
    status, evidence = "completed", None
    for n in range(done + 1, r.rounds + 1):
        d = run.path / ROUNDS / str(n)
        d.mkdir(parents=True, exist_ok=True)
        data, stats_path = d / "data.jsonl", d / "stats.json"
        if stats_path.exists():  # generated and kept before an interruption: reused
            stats = read_json(stats_path)
            run.log(f"round {n}: data reused ({stats['kept']} kept)", echo=True)
        else:
            sampler, tokenizer = load_sampler(model_of(n - 1), device, cfg.model.dtype)
            scored, gen_s = rft_data.sample_scored(
                sampler,
                tokenizer,
                prompts,
                train_rows,
                rewards,
                n=r.oversample,
                batch_prompts=r.gen_batch_size,
                max_new_tokens=r.max_new_tokens,
                temperature=r.temperature,
                top_p=r.top_p,
                seed=stream_seed(cfg.run.seed, n),
            )
            del sampler
            kept = rft_data.select(scored, r.keep.threshold, r.keep.top_k, r.dedup)
            stats = rft_data.round_stats(scored, kept, len(train_rows), gen_s)
            columns = {k: train_rows.columns[k] for k in sorted(used)}
            rft_data.write_records(data, kept, columns)
            rft_data.write_stats(stats_path, stats)  # last: marks the data stage finished
            run.log(
                f"round {n}: generated {stats['generated']} in {gen_s:.1f}s, kept "
                f"{stats['kept']} ({stats['kept_fraction']:.1%}); prompts with one kept "
                f"{stats['prompts_with_kept']}/{len(train_rows)}; rewards "
                f"{stats['reward_histogram']}",
                echo=True,
            )
        if stats["kept"] == 0:
            status = "stuck"
            evidence = (
                f"round {n}: none of {stats['generated']} completions kept (total reward "
                f">= {r.keep.threshold}; best {stats['reward_max']}); see "
                f"{stats_path.relative_to(run.path)}"
            )
            run.log(f"stuck: {evidence}", echo=True)
            break

        start = base if r.restart_from == "base" else model_of(n - 1)
        round_sft = sft.train(sft_config(cfg, data, start, d / "sft"))
        if round_sft["status"] != "completed":
            status, evidence = round_sft["status"], f"round {n} SFT: {round_sft.get('evidence')}"
            run.log(f"{status}: {evidence}", echo=True)
            break
        if cfg.model.lora.enabled and not (d / "model").exists():
            merge_lora(start, d / "sft", d / "model", cfg.model.dtype)
        acc, mean = evaluate(n)
        run.metrics.append(
            dict(
                step=n,
                accuracy=acc,
                eval_reward_mean=mean,
                generated=stats["generated"],
                kept=stats["kept"],
                kept_fraction=stats["kept_fraction"],
                prompts_with_kept=stats["prompts_with_kept"],
                gen_s=stats["gen_seconds"],
                completions_per_s=stats["completions_per_s"],
                sft_steps=round_sft.get("steps"),
                sft_train_loss=round_sft.get("final_train_loss"),
                wall_s=time.time() - t_start,
            )
        )
        run.log(f"round {n}: accuracy {acc:.3f}, eval reward {mean:.3f}", echo=True)

    # ---- wrap up ------------------------------------------------------------------------
    return _finish(run, status, evidence, t_start, cfg.run.plots)


def _finish(run, status: str, evidence: str | None, t_start: float, plots: bool) -> dict:
    """Summary (accuracy per round, base, final, best), report.md with its table and plots
    (`run.plots`; `smollab report` writes it later)."""
    from smollab.report.run_report import write_run_report

    rows = RunView(run.path).metrics()
    acc = [x["accuracy"] for x in rows]
    summary = run.update_summary(
        status=status,
        evidence=evidence,
        rounds_done=len(rows) - 1 if rows else 0,
        accuracy_per_round=acc,
        base_accuracy=acc[0] if acc else None,
        final_accuracy=acc[-1] if acc else None,
        best_accuracy=max(acc) if acc else None,
        wall_seconds=time.time() - t_start,
    )
    run.log(f"{status}: accuracy per round {', '.join(f'{a:.3f}' for a in acc)}", echo=True)
    run.close()
    crash_record.closed(run)
    if plots:
        with contextlib.suppress(Exception):  # a view: the run's result stands without it
            write_run_report(run.path)
    print(f"run directory: {run.path}", flush=True)
    return summary
