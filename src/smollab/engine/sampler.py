"""Batched rollout sampler for GRPO and `smollab sample`.

`Sampler` is built once and reused: each step `load_weights(policy)` copies the policy's weights
(LoRA merged) into a `LeanLlama` (~1M parameters: about a millisecond), then `generate(prompts)`
samples completions under `torch.inference_mode()`. Models the lean engine does not read (GPT-2,
sliding-window attention, dynamic RoPE: `lean_config` decides) fall back to HF `generate`, the
reason in `hf_reason`; the same `Rollout` comes back either way. The lean copy holds the
policy's own dtype (`LeanLlama.from_hf`), and so do its KV cache and decode record; under
autocast the cache takes the autocast dtype and nothing is recorded.

Sampling semantics (TRL's, so GRPO ratios and KL are consistent with it)
- `logprobs` are log-softmax(logits / temperature) of the sampled tokens over the full vocabulary,
  i.e. before top-k / top-p filtering: the policy is the temperature-scaled model, and the
  filters only restrict where samples land. Masked positions hold 0.
- `temperature=0` is greedy (argmax); its logprobs are at temperature 1.
- top-k then top-p, as HF applies them (top-p on the renormalized top-k distribution, keeping the
  smallest prefix whose mass reaches top_p, at least one token).
- Draws (`token_draw.TokenDraw`) use inverse-CDF sampling (cumsum + searchsorted, two-level) with
  one uniform per row per step from an explicit `torch.Generator`: same seed, same batch, same
  weights -> same samples. Much faster than `torch.multinomial` (5 ms for 32 x 4096).
- The generator lives on the sampler's device: `generate(seed=)` makes it there (what the loops
  pass), or `generator=` hands one made with `torch.Generator(device=sampler.device)`. On a GPU
  the uniforms are then drawn by one kernel per token, queued with the decode's own; drawing them
  on the CPU would add a host-to-device copy per token (CPU runs: the same stream as ever).
- A row stops at its first EOS: tokens after it are `pad_token_id` and masked; the loop exits as
  soon as every row has finished, so `completion_ids` may be shorter than `max_new_tokens`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields

import torch

from smollab.engine.decode_record import DecodeRecord
from smollab.engine.lean_config import check_lean_compatible
from smollab.engine.lean_llama import LeanLlama, positions_from_mask
from smollab.engine.rollout import Rollout, finish_at_eos, left_pad
from smollab.engine.static_decode import choose_decode, compiled_step, static_step
from smollab.engine.token_draw import TokenDraw
from smollab.models.hf_weights import unwrap_hf


class Sampler:
    """Batched sampler over a lean copy of a Llama policy (HF `generate` for other models).

    sampler = Sampler(policy, eos_token_id=tok.eos_token_id)
    each step: sampler.load_weights(policy); rollout = sampler.generate(prompts, 64, seed=s)
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
        backend: str = "auto",
        adapters: bool = True,
        num_threads: int | None = None,
        decode: str = "auto",
    ):
        """model: HF causal LM, PEFT model of one, or a `LeanLlama` (used as is).

        eos/pad default to the model's generation/model config; pad falls back to EOS, then 0.
        backend: "auto" (lean for supported Llama configs, else HF), "lean" or "hf".
        adapters: merge LoRA adapters (False: sample from the base with adapters off).
        num_threads: torch intra-op threads while generating (restored after); None leaves the
        process setting. On a CPU shared with other busy processes, 1 avoids OpenMP stalls that
        made 2-thread decoding 5-20x slower on the dev machine.
        decode: the lean engine's decode step, "eager", "static", "compiled" (the static step
        through torch.compile) or "auto" (the measured best on the device): `engine.static_decode`;
        which one and why in `decode_reason`, with the LM head the decode runs
        (`LeanLlama.decode_logits`: oneDNN's packed linear on the CPU, or F.linear).
        """
        if backend not in ("auto", "lean", "hf"):
            raise ValueError(f"backend must be auto, lean or hf, not {backend!r}")
        self.adapters = adapters
        self.num_threads = num_threads
        self.lean: LeanLlama | None = None
        self.hf_model = None
        self.hf_reason: str | None = None  # why HF `generate` samples (None: the lean engine)
        self._cache = None
        cfg = model.config
        if isinstance(model, LeanLlama):
            self.lean = model
        else:
            if backend != "hf":
                try:
                    check_lean_compatible(model.config)  # a PEFT model's is its base's
                    cfg = unwrap_hf(model).config
                except (TypeError, NotImplementedError) as e:
                    if backend == "lean":
                        raise
                    self.hf_reason = str(e)
                else:
                    self.lean = LeanLlama.from_hf(model, adapters=adapters)
            if self.lean is None:
                self.hf_model = model
                self.hf_reason = self.hf_reason or "backend='hf'"
        self.backend = "lean" if self.lean is not None else "hf"
        self.decode, self.decode_reason = choose_decode(decode, self.device)
        if self.lean is None:
            self.decode_reason = f"HF generate decodes ({self.hf_reason})"
        else:
            self.decode_reason += f"; {self.lean.head_reason(self.decode)}"
        gen_cfg = getattr(model, "generation_config", None)
        if eos_token_id is None:
            eos_token_id = getattr(gen_cfg, "eos_token_id", None)
            if eos_token_id is None:
                eos_token_id = getattr(cfg, "eos_token_id", None)
        if eos_token_id is None:
            self.eos_ids: list[int] = []
        elif isinstance(eos_token_id, int):
            self.eos_ids = [eos_token_id]
        else:
            self.eos_ids = [int(e) for e in eos_token_id]
        if pad_token_id is None:
            pad_token_id = getattr(gen_cfg, "pad_token_id", None)
            if pad_token_id is None:
                pad_token_id = getattr(cfg, "pad_token_id", None)
        if pad_token_id is None:
            pad_token_id = self.eos_ids[0] if self.eos_ids else 0
        self.pad_token_id = int(pad_token_id)

    @property
    def device(self) -> torch.device:
        if self.lean is not None:
            return self.lean.embed.device
        return next(self.hf_model.parameters()).device

    def load_weights(self, model: torch.nn.Module | None = None) -> None:
        """Refresh the lean copy from `model` (the policy, possibly PEFT); HF backend: use it."""
        if self.lean is not None:
            if model is not None and model is not self.lean:
                self.lean.load_from_hf(model, adapters=self.adapters)
        elif model is not None:
            self.hf_model = model

    def _generator(self, generator, seed):
        if generator is not None and seed is not None:
            raise ValueError("Sampler.generate: give a generator or a seed, not both")
        if generator is not None:
            return generator
        if isinstance(seed, (list, tuple)):
            if self.lean is None:
                raise ValueError(
                    "Sampler.generate: a seed per block of rows needs the lean backend"
                )
            return [torch.Generator(device=self.device).manual_seed(int(s)) for s in seed]
        if seed is not None:
            return torch.Generator(device=self.device).manual_seed(int(seed))
        return None

    def generate(
        self,
        prompts: Sequence[Sequence[int]] | torch.Tensor,
        max_new_tokens: int,
        *,
        prompt_mask: torch.Tensor | None = None,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        generator: torch.Generator | None = None,
        seed: int | Sequence[int] | None = None,
        stop_at_eos: bool = True,
        record: bool = False,
        repetition_penalty: float = 1.0,
    ) -> Rollout:
        """Sample up to `max_new_tokens` per prompt.

        prompts: token-id lists (left-padded here) or a left-padded tensor [B, P] with
        `prompt_mask`. seed: draw from a generator made on the sampler's device from it (a list
        of seeds: the rows in that many equal blocks, each block from its own generator);
        generator: one already on that device (ValueError otherwise); neither: torch's global one.
        stop_at_eos=False ignores EOS (all tokens kept, `truncated` all True).
        Runs under `torch.inference_mode()`; the returned tensors are ordinary tensors, usable
        in autograd computations (losses) afterwards.
        record: keep the decode's matmul outputs and draw probabilities in `Rollout.record`, for
        `engine.replay` (lean backend, temperature > 0, no autocast, no repetition penalty;
        otherwise the record is None).
        repetition_penalty: HF's: before the draw, the logits of tokens already in the prompt or
        the completion are divided by it where positive, multiplied where negative. The
        returned log-probs stay the unpenalized policy's (what the loss trains, as small-rl's
        runs did), so a penalized decode keeps no record: its draw probabilities are not the
        policy's.
        """
        if not repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")
        threads = torch.get_num_threads()
        if self.num_threads and self.num_threads != threads:
            torch.set_num_threads(self.num_threads)
        try:
            with torch.inference_mode():
                r = self._generate(
                    prompts,
                    max_new_tokens,
                    prompt_mask,
                    temperature,
                    top_p,
                    top_k,
                    generator,
                    seed,
                    stop_at_eos,
                    record,
                    repetition_penalty,
                )
        finally:
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
        tensors = (getattr(r, f.name).clone() for f in fields(Rollout) if f.name != "record")
        return Rollout(*tensors, record=r.record)

    def _generate(
        self,
        prompts,
        max_new_tokens,
        prompt_mask,
        temperature,
        top_p,
        top_k,
        generator,
        seed,
        stop_at_eos,
        record,
        penalty,
    ) -> Rollout:
        device = self.device
        if isinstance(prompts, torch.Tensor):
            ids = prompts.to(device)
            mask = torch.ones_like(ids) if prompt_mask is None else prompt_mask.to(device).long()
            if (mask[:, 1:] < mask[:, :-1]).any():
                raise ValueError("prompt_mask must be left-padded (zeros before the tokens)")
        else:
            ids, mask = left_pad(prompts, self.pad_token_id, device)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        gen = self._generator(generator, seed)
        if self.lean is None:
            return self._hf_generate(
                ids, mask, max_new_tokens, temperature, top_p, top_k, gen, stop_at_eos, penalty
            )
        rec = None
        if (
            record
            and temperature > 0
            and penalty == 1
            and not torch.is_autocast_enabled(device.type)
        ):
            with torch.inference_mode(False):  # ordinary tensors: autograd may use them later
                rec = DecodeRecord.empty(self.lean, ids.shape[0], max_new_tokens - 1)
        return self._lean_generate(
            ids, mask, max_new_tokens, temperature, top_p, top_k, gen, stop_at_eos, rec, penalty
        )

    def _get_cache(self, B: int, max_len: int):
        lean = self.lean
        if self.decode != "eager":  # the static step's shapes: nearby prompt lengths share them
            max_len = -(-max_len // 16) * 16
        dtype = lean.embed.dtype
        dev = lean.embed.device
        if torch.is_autocast_enabled(dev.type):
            dtype = torch.get_autocast_dtype(dev.type)
        c = self._cache
        if c is None or c.batch_size != B or c.max_len < max_len or c.dtype != dtype:
            c = self._cache = lean.new_cache(B, max_len, dtype=dtype)
        return c

    def _lean_generate(
        self, ids, mask, T, temperature, top_p, top_k, gen, stop_at_eos, rec, penalty
    ):
        lean = self.lean
        B, P = ids.shape
        dev = ids.device
        cache = self._get_cache(B, P + T)
        draw = TokenDraw(temperature, top_k, top_p, gen, B, dev)
        stop = stop_at_eos and bool(self.eos_ids)
        eos = torch.as_tensor(self.eos_ids, device=dev)
        single_eos = len(self.eos_ids) == 1

        # Positions of the T new tokens and their rope rows, [T, B, 1, D] so a step is one select.
        pos = positions_from_mask(mask)[:, -1:] + 1 + torch.arange(T, device=dev)  # [B, T]
        cos, sin = lean.rope(pos.t().contiguous())
        cos, sin = cos.unsqueeze(2).to(cache.dtype), sin.unsqueeze(2).to(cache.dtype)

        out_ids = torch.full((B, T), self.pad_token_id, dtype=torch.long, device=dev)
        out_lp = torch.zeros(B, T, dtype=torch.float32, device=dev)
        finished = torch.zeros(B, 1, dtype=torch.bool, device=dev)
        check_every = 1 if dev.type == "cpu" else 8  # .all() syncs an accelerator

        logits = lean.prefill_logits(ids, mask, cache)
        if self.decode == "eager":

            def decode(t, tok):
                return lean.decode(tok.view(B), cos[t], sin[t], cache, P + t, rec, t)

        else:
            cache.start_static(P)
            step = torch.zeros(1, dtype=torch.long, device=dev)
            slot = torch.full((1,), P, dtype=torch.long, device=dev)
            if rec is not None:
                rec.scratch()  # made before a compiled step reads it
            run = compiled_step() if self.decode == "compiled" else static_step

            def decode(t, tok):
                return run(lean, tok.view(B), cos, sin, cache, rec, step, slot)

        seen = None
        if penalty != 1:  # the prompt's tokens (pads left out), then each drawn one
            seen = torch.zeros(B, logits.shape[-1], device=dev)
            seen = seen.scatter_add_(1, ids, mask.to(seen.dtype)) > 0
        steps = T
        for t in range(T):
            if seen is None:
                tok, lp = draw(logits, None if rec is None else rec.probs[t])
            else:
                tok, lp = penalized_draw(draw, logits, seen, penalty, temperature)
                seen.scatter_(1, tok, True)
            out_ids[:, t : t + 1] = tok
            out_lp[:, t : t + 1] = lp
            if stop:
                finished |= (tok == eos) if single_eos else torch.isin(tok, eos)
                if (t + 1) % check_every == 0 and bool(finished.all()):
                    steps = t + 1
                    break
            if t + 1 < T:
                logits = decode(t, tok)
        r = finish_at_eos(
            ids, mask, out_ids[:, :steps], out_lp[:, :steps], self.eos_ids, self.pad_token_id, stop
        )
        if rec is not None:
            rec.steps = steps - 1
            r.record = rec
        return r

    def _hf_generate(self, ids, mask, T, temperature, top_p, top_k, gen, stop_at_eos, penalty):
        model = self.hf_model
        stop = stop_at_eos and bool(self.eos_ids)
        # Every knob explicit: in transformers 5 an unset (None) field falls back to the model's
        # generation config (e.g. top_k=50), which would silently change the distribution.
        kw = dict(
            max_new_tokens=T,
            min_new_tokens=0,
            num_beams=1,
            num_return_sequences=1,
            repetition_penalty=penalty,
            no_repeat_ngram_size=0,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_ids if stop else None,
            output_logits=True,
            return_dict_in_generate=True,
            do_sample=temperature > 0,
        )
        if temperature > 0:
            kw.update(temperature=temperature, top_p=top_p, top_k=top_k, min_p=None, typical_p=1.0)
        seed = None
        if gen is not None:
            seed = int(torch.randint(0, 2**62, (1,), generator=gen, device=gen.device))
        dev = ids.device  # HF draws from the global streams: fork the CPU's and the device's
        accelerator = dev.type in ("cuda", "mps")
        with torch.random.fork_rng(
            devices=[dev.index or 0] if accelerator else [],
            enabled=seed is not None,
            device_type=dev.type if accelerator else None,
        ):
            if seed is not None:
                torch.manual_seed(seed)
            out = model.generate(input_ids=ids, attention_mask=mask, **kw)
        comp = out.sequences[:, ids.shape[1] :]
        # [B, T, V] raw (before the repetition penalty and the warpers): the policy's log-probs
        logits = torch.stack(out.logits, dim=1).float()
        if temperature > 0 and temperature != 1:
            logits = logits / temperature
        lps = logits.log_softmax(-1).gather(-1, comp[..., None]).squeeze(-1)
        return finish_at_eos(ids, mask, comp, lps, self.eos_ids, self.pad_token_id, stop)


def penalized_draw(
    draw: TokenDraw, logits: torch.Tensor, seen: torch.Tensor, penalty: float, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A token drawn from the logits with HF's repetition penalty on the `seen` tokens [B, V],
    and its log-prob under the unpenalized policy (at the temperature; greedy: T = 1)."""
    logits = logits.float()
    penalized = torch.where(
        seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits
    )
    tok, _ = draw(penalized)
    scaled = logits if temperature in (0, 1) else logits / temperature
    return tok, scaled.log_softmax(-1).gather(1, tok)
