"""Strict device mode: what breaks on a GPU or a Mac, made to show on a CPU-only machine.

On an accelerator the default device (the CPU) is not the run's device, so code that runs fine on
a CPU breaks there in two ways, neither of which a CPU run can see:
- a tensor or a `torch.Generator` made without naming its device lands on the CPU;
- a draw whose generator lives on another device than its tensor: PyTorch refuses it ("Expected a
  'cuda' device type for generator but found 'cpu'"). GRPO seeded its sampling with
  `torch.Generator()` and drew into the model's device this way, so it stopped at the first
  token on every GPU and Mac.

`StrictDevice` records both while a command runs, in-process:
- "no device": a tensor factory (`torch.empty`, `zeros`, `full`, `arange`, `randint`, `tensor`,
  ...) or `torch.Generator` called from smollab's own code without `device=` (third-party code is
  not smollab's to fix);
- "generator device": a draw (any call with `generator=`) whose generator is not on its tensor's
  device. A generator made without a device counts as on the *default* device, which here, as on a
  GPU machine, is not the device the tensors were put on: only a factory that also leaves its
  device to the default may use it.
Violations are collected (location, what, why) rather than raised, so one run lists them all.
`install_in_process(report_path)` turns it on for a whole process (a `sitecustomize` in a child).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

import smollab

SRC = os.path.dirname(smollab.__file__) + os.sep
HERE = __file__

FACTORIES = {
    torch.empty,
    torch.zeros,
    torch.ones,
    torch.full,
    torch.arange,
    torch.rand,
    torch.randn,
    torch.randint,
    torch.randperm,
    torch.tensor,
    torch.as_tensor,
    torch.linspace,
    torch.logspace,
    torch.eye,
    torch.empty_strided,
    torch.scalar_tensor,
}
DEFAULT = "the default device"  # where a generator made without a device lives


def _caller() -> tuple[str, bool]:
    """'file:line in function' of the code that made the call (the first frame outside this
    module and torch's dispatch to it), and whether that code is smollab's own."""
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if name != HERE and not name.endswith(("torch/overrides.py", "torch/utils/_device.py")):
            inside = name.startswith(SRC)
            return (
                f"{name[len(SRC) - len('smollab/') :] if inside else name}:{f.f_lineno} in {f.f_code.co_name}",
                inside,
            )
        f = f.f_back
    return "?", False


class StrictDevice(TorchFunctionMode):
    """Records device violations (see the module docstring) while active; `violations` lists them."""

    def __init__(self):
        super().__init__()
        self.violations: list[str] = []
        self.draws = 0  # generator draws checked: a test can tell that its run drew at all
        self._generator = None
        self.on_change = None  # called at the first draw and at each new violation

    def _add(self, text: str) -> None:
        if text not in self.violations:
            self.violations.append(text)
            if self.on_change:
                self.on_change()

    # ---- torch.Generator: remember where a generator made without a device came from --------
    def _tracked_generator_class(self):
        mode, real = self, torch.Generator

        class Generator(real):
            def __new__(cls, *args, **kwargs):
                g = super().__new__(cls, *args, **kwargs)
                g.smollab_made_at, in_smollab = _caller()
                g.smollab_implicit = not args and kwargs.get("device") is None
                if g.smollab_implicit and in_smollab:
                    mode._add(
                        f"no device: torch.Generator() at {g.smollab_made_at}: a CPU "
                        "generator on a GPU or Mac"
                    )
                return g

        return real, Generator

    def __enter__(self):
        self._real_generator, tracked = self._tracked_generator_class()
        torch.Generator = tracked
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Generator = self._real_generator
        return super().__exit__(*exc)

    # ---- every torch call -------------------------------------------------------------------
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            keeps = func is torch.as_tensor and args and isinstance(args[0], torch.Tensor)
            if not keeps:
                where, in_smollab = _caller()
                if in_smollab:
                    self._add(
                        f"no device: torch.{func.__name__} at {where}: lands on the CPU "
                        "on a GPU or Mac"
                    )
        g = kwargs.get("generator")
        if g is not None:
            self._check_draw(func, args, kwargs, g)
        return func(*args, **kwargs)

    def _check_draw(self, func, args, kwargs, g) -> None:
        self.draws += 1
        if self.draws == 1 and self.on_change:
            self.on_change()
        name = getattr(func, "__name__", str(func))
        if func in FACTORIES:  # a new tensor: on `device`, else on the default device
            dev = kwargs.get("device")
            target = DEFAULT if dev is None else torch.device(dev).type
            what = f"torch.{name}"
        else:  # in place (Tensor.uniform_, ...) or shaped like its input (torch.multinomial)
            t = args[0] if args and isinstance(args[0], torch.Tensor) else None
            target = t.device.type if t is not None else DEFAULT
            what = f"Tensor.{name}" if t is not None and hasattr(torch.Tensor, name) else name
        gen_dev = DEFAULT if getattr(g, "smollab_implicit", False) else g.device.type
        if gen_dev != target:
            made = getattr(g, "smollab_made_at", "?")
            where, _ = _caller()
            self._add(
                f"generator device: {what} at {where} draws into a tensor on {target} "
                f"with a generator on {gen_dev} (made at {made}); on CUDA: Expected a "
                "'cuda' device type for generator but found 'cpu'"
            )

    def report(self) -> str:
        return "\n".join(self.violations)


def install_in_process(report_path: str | Path) -> StrictDevice:
    """Strict mode for the rest of this process; its violations go to `report_path` (JSON) at the
    first draw, at each new violation and at exit, so a child killed before its exit handlers
    run (a probe stopping a slow child on a loaded machine) still leaves its report."""
    mode = StrictDevice()
    mode.__enter__()

    def write() -> None:
        Path(report_path).write_text(
            json.dumps({"violations": mode.violations, "draws": mode.draws})
        )

    mode.on_change = write
    atexit.register(write)
    return mode
