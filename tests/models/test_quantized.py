"""`model.load_in` (bitsandbytes 8-bit / 4-bit loading): refused where it cannot be honoured,
each in one line naming the key and the reason. The loading itself is tests/gpu's
test_gpu_quantized.py."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from smollab.config.load import load_config
from smollab.engine.lean_config import check_lean_compatible
from smollab.errors import UserError
from smollab.models.presets import preset_config
from smollab.models.quantized import QUANT_EXTRA, check_load_in, quantized_load_kwargs

LORA = ["model.path=some/run", "model.lora.enabled=true"]


@pytest.mark.parametrize("kind", ["cpu", "mps"])
def test_quantized_loading_off_cuda_names_the_device_and_the_key(kind):
    with pytest.raises(UserError) as e:
        check_load_in("8bit", torch.device(kind))
    assert str(e.value).startswith("model.load_in=8bit:") and f"device is {kind}" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="model.load_in=4bit"):
        quantized_load_kwargs("4bit", torch.device(kind), None)


def test_a_missing_bitsandbytes_names_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "bitsandbytes" else real(name, *a),
    )
    with pytest.raises(UserError) as e:
        check_load_in("4bit", torch.device("cuda", 0))
    assert "bitsandbytes" in str(e.value) and f"smollab[{QUANT_EXTRA}]" in str(e.value)


def test_none_loads_as_before():
    check_load_in("none", torch.device("cpu"))
    assert quantized_load_kwargs("none", torch.device("mps"), None) == {}


@pytest.mark.parametrize(
    "extra, culprit",
    [
        ([], "model.lora.enabled is false"),  # the quantized base cannot train
        (["grpo.routing.enabled=true"], "grpo.routing"),
        (["model.lora.enabled=true", "grpo.export_merged=true"], "grpo.export_merged"),
    ],
)
def test_config_rules_refuse_what_a_quantized_base_cannot_do(extra, culprit):
    with pytest.raises(UserError, match=culprit):
        load_config("grpo", None, ["model.path=some/run", "model.load_in=4bit", *extra])
    cfg = load_config("grpo", None, [*LORA, "model.load_in=4bit"])
    assert cfg.model.load_in == "4bit"


def test_the_lean_forward_refuses_a_quantized_model():
    config = preset_config("micro")
    check_lean_compatible(config)
    config.quantization_config = {"load_in_4bit": True}
    with pytest.raises(NotImplementedError, match="quantized"):
        check_lean_compatible(config)


def test_bitsandbytes_is_an_extra_and_not_a_dev_dependency():
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()  # no tomllib on 3.10
    extras = dict(re.findall(r"(?m)^(\w+) = \[(.*?)\]$", text, re.DOTALL))
    assert '"bitsandbytes>=' in extras[QUANT_EXTRA]
    assert "dev" in extras and "bitsandbytes" not in extras["dev"] and "quant" not in extras["dev"]
