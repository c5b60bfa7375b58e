"""`smollab doctor` on CUDA: every check ok, and the precisions it finds agree with the GPU."""

from __future__ import annotations

import json

import torch

from smollab.cli import main
from tests.gpu.marks import GPU, bf16_ok

pytestmark = GPU


def test_doctor_on_cuda(tmp_path, capsys):
    code = main(["doctor", "--device", "cuda", "--json", str(tmp_path / "doctor.json")])
    report = json.loads((tmp_path / "doctor.json").read_text())
    print(capsys.readouterr().out)  # the table, for the log of a GPU run
    assert code == 0 and report["ok"], report
    assert [c["item"] for c in report["checks"]] == [
        "data",
        "pretrain",
        "grpo full",
        "grpo lora",
        "sample",
        "probe k=1,2",
    ]
    by = {it["item"]: it for it in report["items"]}
    assert by["precision fp32"]["status"] == "native"
    ampere = torch.cuda.get_device_capability() >= (8, 0)
    assert by["precision tf32"]["status"] == ("native" if ampere else "no"), by["precision tf32"]
    assert by["precision bf16"]["status"] == ("native" if bf16_ok() else "emulated")
    assert by["precision fp16"]["status"] == "native"
    assert by["peak fp32"]["flops"] > 1e12  # any CUDA GPU of this decade
    assert by["MPS daemon"]["status"] in ("yes", "no")
