"""report.md of `smollab demo`, written from the demo's summary dict alone (no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from smollab.rundir.atomic import atomic_write_text


def _num(v: Any, fmt: str = ".3f") -> str:
    return "n/a" if v is None else format(v, fmt)


def _cell(text: str) -> str:
    """One markdown table cell: no pipes or line breaks."""
    return " ".join(str(text).split()).replace("|", "\\|")


def render(summary: dict[str, Any]) -> str:
    s, sec = summary, summary.get("seconds", {})
    pre, rl, data = s.get("pretrain", {}), s.get("grpo", {}), s.get("data", {})
    reused = s.get("reused", {})
    plots = set(s.get("plots", []))
    every = s.get("seconds_all_runs") or {}
    resumed = bool(every) and any(abs(every.get(k, 0) - sec.get(k, 0)) > 0.5 for k in every)

    def _secs(k: str) -> str:
        return f"{_num(sec.get(k), '.1f')} | " + (
            f"{_num(every.get(k), '.1f')} | " if resumed else ""
        )

    lines = ["# smollab demo", ""]
    if s.get("quick"):
        lines += [
            "> **--quick**: micro settings that only check the pipeline; the figures below "
            "mean nothing.",
            "",
        ]
    lines += [
        "A SimpleStories-shaped language model pretrained from scratch on the bundled offline "
        "story corpus, then fine-tuned with GRPO (full fine-tuning) so that its story "
        'continuations mention "happy" (reward `happy_binary`), while diversity is watched.',
        "",
        f"**Reward on held-out prompts: {_num(s.get('base_reward'), '.2f')} before RL -> "
        f"{_num(s.get('final_reward'), '.2f')} after {rl.get('steps', 'n/a')} GRPO steps; "
        f"unique completions in the last training batches: "
        f"{_num(s.get('final_unique_fraction'), '.2f')}.** {_total_line(sec, every)}",
        "",
        f"| stage | seconds |{' all runs |' if resumed else ''} result |",
        f"|---|---:|{'---:|' if resumed else ''}---|",
        f"| data | {_secs('data')}{_fmt_tokens(data)}{' (reused)' if reused.get('data') else ''} |",
        f"| pretrain | {_secs('pretrain')}{pre.get('steps', 'n/a')} steps, val loss "
        f"{_num(pre.get('final_val_loss'))}, {_num(pre.get('tokens_per_s'), ',.0f')} tokens/s"
        f"{' (reused)' if reused.get('pretrain') else ''} |",
        f"| grpo | {_secs('grpo')}{rl.get('steps', 'n/a')} steps "
        f"({_num(rl.get('seconds_per_step'), '.2f')} s each), reward "
        f"{_num(s.get('base_reward'), '.2f')} -> {_num(s.get('final_reward'), '.2f')}, "
        f"status {rl.get('status')}{' (reused)' if reused.get('grpo') else ''} |",
        f"| report | {_secs('report')}samples, plots, this file |",
        f"| **total** | {_secs('total')} |",
        "",
    ]
    if rl.get("evidence"):
        lines += [f"GRPO stopped: {rl['evidence']}", ""]

    lines += ["## Pretraining", ""]
    if "pretrain_loss.png" in plots:
        lines += ["![pretraining loss](pretrain_loss.png)", ""]
    lines += [
        f"Final train loss {_num(pre.get('final_train_loss'))}, validation loss "
        f"{_num(pre.get('final_val_loss'))}; {pre.get('params_total') or 0:,} parameters; "
        f"run directory `{pre.get('run_dir')}`.",
        "",
    ]

    lines += ["## GRPO", ""]
    for name, alt in (
        ("grpo_reward.png", "reward"),
        ("grpo_kl.png", "KL to the reference"),
        ("grpo_diversity.png", "diversity"),
    ):
        if name in plots:
            lines += [f"![{alt}]({name})", ""]
    if rl.get("eval_steps"):
        pairs = ", ".join(
            f"step {st}: {r:.2f}"
            for st, r in zip(rl["eval_steps"], rl["eval_rewards"], strict=False)
        )
        lines += [f"Held-out reward by evaluation: {pairs}.", ""]
    lines += [
        f"Training reward {_num(s.get('train_reward_start'), '.2f')} (first step) -> "
        f"{_num(s.get('train_reward_end'), '.2f')} (last steps); final KL "
        f"{_num(rl.get('final_kl'), '.4f')}; unique fraction of held-out completions "
        f"{_num(s.get('final_eval_unique_fraction'), '.2f')}; run directory "
        f"`{rl.get('run_dir')}`.",
        "",
    ]

    samples = s.get("samples") or []
    if samples:
        lines += [
            "## Samples before and after RL",
            "",
            "One completion per held-out prompt, same seed, from the pretrained model "
            "(before) and the GRPO model (after); the number is the reward.",
            "",
            "| prompt | before RL | r | after RL | r |",
            "|---|---|---:|---|---:|",
        ]
        for x in samples:
            lines.append(
                f"| {_cell(x.get('prompt', ''))} | {_cell(x.get('before', ''))} | "
                f"{_num(x.get('before_reward'), '.0f')} | {_cell(x.get('after', ''))} | "
                f"{_num(x.get('after_reward'), '.0f')} |"
            )
        lines.append("")

    cmds = s.get("commands") or {}
    if cmds:
        lines += ["## Reproduce a stage with the ordinary commands", "", "```bash"]
        lines += [cmds[k] for k in ("data", "pretrain", "grpo") if k in cmds]
        lines += ["```", ""]
    return "\n".join(lines)


def _total_line(sec: dict[str, Any], every: dict[str, Any]) -> str:
    line = f"Total {_num(sec.get('total'), '.0f')} s"
    if every.get("total") and abs(every["total"] - (sec.get("total") or 0)) > 0.5:
        line += (
            f" in this run, which reused finished stages; {_num(every['total'], '.0f')} s "
            "over every run on this directory"
        )
    return line + "."


def _fmt_tokens(data: dict[str, Any]) -> str:
    tok, st = data.get("tokens") or {}, data.get("stories") or {}
    if not tok:
        return "n/a"
    return (
        f"{st.get('train', 0):,} stories, {tok.get('train', 0):,} train tokens, "
        f"vocab {data.get('vocab_size')}"
    )


def write_report(path: str | Path, summary: dict[str, Any]) -> Path:
    path = Path(path)
    atomic_write_text(path, render(summary))
    return path
