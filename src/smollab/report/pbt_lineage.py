"""A population-based sweep's lineage for its report: one row per member and generation (its
parent, the factors it was perturbed by, its metric at the generation's end) and, for each
member of the last generation, the chain of trials its weights come from.

It reads results.csv's pbt columns (member, generation, parent, parent_step, perturbed), which
`smollab.lab.sweep.results` writes from the study's user attributes.
"""

from __future__ import annotations

from typing import Any

from smollab.report.sweep_data import SweepData, Trial, _f


def lineage_section(data: SweepData) -> list[str]:
    members = [t for t in data.trials if t.row.get("generation") not in (None, "")]
    if not members:
        return []
    label = data.metric_label
    keys = [k for k in data.space] + [
        k for k in (data.spec.get("pbt") or {}).get("perturb", {}) if k not in data.space
    ]
    by_name = {t.name: t for t in members}
    members.sort(key=lambda t: (t.row["generation"], t.row["member"]))
    lines = [
        "## Population (PBT) lineage",
        "",
        "Each member trains `pbt.interval` steps per generation; at a generation's end the "
        "bottom quantile continues from a top member's checkpoint with its values perturbed "
        "(parent and factors below), the others continue themselves.",
        "",
        "| member | generation | trial | parent (at step) | perturbed | "
        + " | ".join(keys)
        + f" | {label} | status |",
        "|" + "---|" * (7 + len(keys)),
    ]
    for t in members:
        r = t.row
        parent = by_name.get(r.get("parent") or "")
        shown = (
            f"m{parent.row['member']} g{parent.row['generation']} (at {r.get('parent_step')})"
            if parent
            else "-"
        )
        cells = [r["member"], r["generation"], t.name, shown, r.get("perturbed") or "-"]
        cells += [_f(r.get(k)) for k in keys] + [_f(r.get(label)), t.status]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    last = max(t.row["generation"] for t in members)
    lines += ["", "Where each member of the last generation comes from:", ""]
    for t in [t for t in members if t.row["generation"] == last]:
        lines.append(f"- m{t.row['member']}: " + " <- ".join(_chain(t, by_name, keys)))
    lines.append("")
    return lines


def _chain(t: Trial, by_name: dict[str, Trial], keys: list[str]) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    node: Any = t
    while node is not None and node.name not in seen:
        seen.add(node.name)
        r = node.row
        values = " ".join(f"{k.split('.')[-1]}={_f(r.get(k))}" for k in keys)
        out.append(f"m{r['member']} g{r['generation']} ({values})")
        node = by_name.get(r.get("parent") or "")
    return out
