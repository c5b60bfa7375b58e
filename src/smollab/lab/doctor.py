"""`smollab doctor`: what this machine's device supports, and a micro run of every command on it.

First the device (`doctor_device`: name, memory, versions, the precisions that run natively, the
CUDA MPS daemon, the matmul peak), then the micro checks (`doctor_checks`: data, pretrain, GRPO
full and LoRA, sample, a probe at k = 1, 2), each `ok` or `failed` with a one-line reason, in a
temporary directory removed afterwards. Exit 0 when nothing failed: a precision the device lacks
(`no`, `emulated`, `n/a`) is a fact about the device, not a failure.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smollab.errors import UserError
from smollab.rundir.atomic import atomic_write_json

STATUS_STYLE = {
    "ok": "green",
    "native": "green",
    "yes": "green",
    "failed": "bold red",
    "emulated": "yellow",
    "no": "yellow",
    "n/a": "dim",
}
DEFAULT_TIMEOUT_S = 300.0


def run_doctor(
    device: str = "auto",
    json_path: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
    keep: str | None = None,
    out: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Report on `device` (auto|cpu|cuda|mps); writes `json_path` when given. `keep`: run the
    checks in that directory and leave it, for a look at each check's child.log."""
    from smollab.lab.doctor_checks import run_checks

    out = out or (lambda m: print(m, flush=True))
    if keep and Path(keep).exists() and not Path(keep).is_dir():
        raise UserError(f"--keep {keep}: not a directory")
    if json_path and Path(json_path).is_dir():
        raise UserError(f"--json {json_path}: a directory; give a file path")
    t0 = time.time()
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="smollab-doctor-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        facts, device_items = _device(work, device, timeout, out)
        checks = run_checks(work, facts["kind"], timeout, out)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    items = device_items + checks
    report = {
        "ok": not any(it["status"] == "failed" for it in items),
        "device": facts,
        "items": device_items,
        "checks": checks,
        "seconds": round(time.time() - t0, 1),
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(Path(json_path), report)
    return report


def _device(work: Path, want: str, timeout: float, out) -> tuple[dict[str, Any], list[dict]]:
    """The device child's facts and lines; a device that is not there is bad input (one line);
    a device child that crashed or hung is one failed line, and the checks still run."""
    from smollab.lab.doctor_checks import DEVICE_JSON, device_check, run_stage

    check = device_check(work, want)
    [result] = run_stage([check], timeout, out)
    try:
        report = json.loads((check.out_dir / DEVICE_JSON).read_text())
    except (OSError, ValueError):
        report = {}
    if "error" in report:
        raise UserError(report["error"])
    if result["status"] == "ok":
        return report["device"], report["items"]
    from smollab.lab.probe.cache import device_kind

    kind = device_kind(want)
    return {"kind": kind, "name": kind}, [result]


def render(report: dict[str, Any], console=None) -> None:
    """The report as one table: the device's facts first, then the checks with their time."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    t = Table(
        title=f"smollab doctor: {report['device']['kind']} ({report['device']['name']})",
        title_justify="left",
        show_lines=False,
    )
    t.add_column("item", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("s", justify="right", no_wrap=True)
    t.add_column("detail", overflow="fold")
    for i, it in enumerate(report["items"] + report["checks"]):
        if i == len(report["items"]):
            t.add_section()
        style = STATUS_STYLE.get(it["status"], "")
        secs = f"{it['seconds']:.0f}" if "seconds" in it else ""
        t.add_row(it["item"], f"[{style}]{it['status']}[/]", secs, escape(it["detail"]))
    console.print(t)
    failed = [it["item"] for it in report["items"] + report["checks"] if it["status"] == "failed"]
    if failed:
        console.print(
            f"[bold red]{len(failed)} failed[/]: {', '.join(failed)} ({report['seconds']:.0f} s)"
        )
    else:
        console.print(f"[green]all ok[/] in {report['seconds']:.0f} s")
