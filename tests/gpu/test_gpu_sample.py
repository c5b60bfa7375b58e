"""`smollab sample` on each accelerator (CUDA, Apple's MPS): the generator lives on the device,
and a seed gives the same texts."""

from __future__ import annotations

from smollab.cli import main
from smollab.engine.sample_texts import sample_texts
from tests.gpu.marks import ON_ACCELERATORS

pytestmark = ON_ACCELERATORS


def test_sample_on_the_device_is_seeded(device, micro_model):
    def texts(seed):
        return list(
            sample_texts(
                str(micro_model), ["Once upon a time", "The dog"], 3, 12, 1.0, 0.9, 0, seed, device
            )
        )

    a = texts(7)
    assert len(a) == 6 and a == texts(7)
    assert all(t.startswith(p) and len(t) > len(p) for p, t in a)
    assert a != texts(8)


def test_sample_command_on_the_device(device, micro_model, capsys):
    argv = [
        "sample",
        str(micro_model),
        "--prompt",
        "Once upon a time",
        "--n",
        "2",
        "--temperature",
        "0",
        "--device",
        device,
    ]
    assert main(argv) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[")]
    assert len(lines) == 2 and lines[0] == lines[1]  # greedy: both the same
