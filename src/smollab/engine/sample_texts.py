"""`smollab sample`: text from a run directory or checkpoint, through the rollout sampler."""

from __future__ import annotations

from collections.abc import Iterator

from smollab.config import ModelConfig
from smollab.device import pick_device
from smollab.engine.sampler import Sampler
from smollab.models.loading import build_model, load_tokenizer_near, resolve_model_dir


def sample_texts(path: str, prompts: list[str], n: int, max_new_tokens: int, temperature: float,
                 top_p: float, top_k: int, seed: int, device: str) -> Iterator[tuple[str, str]]:  # fmt: skip
    """(prompt, prompt + completion) pairs, `n` per prompt; prompts start after a document break."""
    where = resolve_model_dir(path)
    tokenizer = load_tokenizer_near(where)
    model = build_model(ModelConfig(preset=None, path=str(where))).to(pick_device(device)).eval()
    eos = tokenizer.eos_token_id
    ids = [[eos, *tokenizer(p, add_special_tokens=False)["input_ids"]] for p in prompts]
    batch = [x for x in ids for _ in range(n)]
    sampler = Sampler(model, eos_token_id=eos, pad_token_id=eos)
    r = sampler.generate(batch, max_new_tokens, temperature=temperature, top_p=top_p,
                         top_k=top_k, seed=seed)  # fmt: skip
    for i, text in enumerate(r.completion_texts(tokenizer)):
        yield prompts[i // n], f"{prompts[i // n]} {text}"
