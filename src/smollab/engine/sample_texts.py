"""`smollab sample`: text from a run directory or checkpoint, through the rollout sampler."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from smollab.config import ModelConfig
from smollab.data.prompt_encode import text_ids
from smollab.device.runtime import pick_device
from smollab.engine.sampler import Sampler
from smollab.errors import UserError
from smollab.models.loading import build_model, load_tokenizer_near, resolve_model_dir
from smollab.models.routing import load_routed_dir, saved_adapters


def load_sampler(
    path: str, device: str, mode: str | None = None, forget_scale: float | None = None
):
    """(sampler, tokenizer, where) for the model `path` names: a run directory (its final, else
    latest checkpoint), a checkpoint or HF directory, or a hub id; `where` is what was loaded.
    mode: a gradient-routing checkpoint's adapters (both, retain_only, forget_only);
    forget_scale: both, the forget adapter times it."""
    where = resolve_model_dir(path)
    tokenizer = load_tokenizer_near(where)
    if mode is not None or forget_scale is not None:
        if not (isinstance(where, Path) and saved_adapters(where)):
            flag = "--mode" if forget_scale is None else "--forget-scale"
            raise UserError(
                f"{flag} picks gradient routing's adapters, and {path} holds no "
                "routed checkpoint (retain/, forget/)"
            )
        model = load_routed_dir(where, mode or "both", scale=forget_scale)
    else:
        model = build_model(ModelConfig(preset=None, path=str(where)))
    model = model.to(pick_device(device)).eval()
    eos = tokenizer.eos_token_id
    return Sampler(model, eos_token_id=eos, pad_token_id=eos), tokenizer, where


def sample_texts(
    path: str,
    prompts: list[str],
    *,
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    top_k: int,
    seed: int,
    device: str,
    mode: str | None = None,
    forget_scale: float | None = None,
) -> Iterator[tuple[str, str]]:
    """(prompt, prompt + completion) pairs, `n` per prompt; prompts start after a document break.
    mode: a gradient-routing checkpoint's adapters (both, retain_only, forget_only);
    forget_scale: both, the forget adapter times it (in [0, 1])."""
    sampler, tokenizer, _ = load_sampler(path, device, mode, forget_scale)
    batch = [x for x in text_ids(tokenizer, prompts) for _ in range(n)]
    r = sampler.generate(
        batch, max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed
    )
    for i, text in enumerate(r.completion_texts(tokenizer)):
        yield prompts[i // n], f"{prompts[i // n]} {text}"
