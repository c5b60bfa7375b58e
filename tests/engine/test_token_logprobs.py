"""Per-token log-probs: the chunked head against plain log_softmax, values and gradients."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import smollab.engine.token_logprobs as tl  # noqa: E402
from smollab.engine.lean_llama import LeanLlama  # noqa: E402
from smollab.engine.sampler import Sampler  # noqa: E402
from smollab.engine.token_logprobs import logprobs, selected_logprobs, shared_prompts  # noqa: E402
from tests.engine.test_sampler import PROMPTS, micro_gpt2, micro_llama  # noqa: E402


def test_chunks_are_sized_by_vocabulary_and_device():
    """Cache-sized chunks of a small vocabulary on a CPU (as before), and never fewer than
    MIN_ROWS rows: a 151k head is read whole by every chunk."""
    cpu = torch.device("cpu")
    assert tl.chunk_rows(4096, cpu) == 256
    assert tl.chunk_rows(151_936, cpu) == tl.chunk_rows(49_152, cpu) == tl.MIN_ROWS
    assert tl.chunk_rows(128, cpu) == tl.CPU_CHUNK_ELEMS // 128


def naive(h, w, targets, temperature):
    logits = (h @ w.t()).float() / temperature
    return logits.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1)


@pytest.mark.parametrize("keep_logits", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("train_weight", [True, False])
def test_selected_logprobs_matches_log_softmax(monkeypatch, keep_logits, temperature, train_weight):
    monkeypatch.setattr(tl, "chunk_rows", lambda vocab, device: 3)  # 7 rows: a ragged last chunk
    monkeypatch.setattr(tl, "KEEP_LOGITS_ELEMS", 10**9 if keep_logits else 0)
    torch.manual_seed(0)
    h = torch.randn(7, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=train_weight)
    targets = torch.randint(0, 50, (7,))
    upstream = torch.randn(7)

    got = selected_logprobs(h, w, targets, temperature)
    (got * upstream).sum().backward()
    gh, gw = h.grad.clone(), None if w.grad is None else w.grad.clone()
    h.grad = w.grad = None
    want = naive(h, w, targets, temperature)
    (want * upstream).sum().backward()

    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gh, h.grad, atol=1e-5, rtol=1e-5)
    if train_weight:
        torch.testing.assert_close(gw, w.grad, atol=1e-5, rtol=1e-5)
    else:
        assert gw is None


def test_selected_logprobs_keeps_batch_shape_and_refuses_a_second_backward():
    h = torch.randn(2, 3, 8, requires_grad=True)
    w = torch.randn(20, 8)
    targets = torch.randint(0, 20, (2, 3))
    out = selected_logprobs(h, w, targets)
    assert out.shape == (2, 3) and out.dtype == torch.float32
    assert (out <= 0).all()
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        out.sum().backward()


def _policy_case(model, repeats: int = 1):
    """Left-padded prompts; with repeats, rows 0 and 1 also end early (right padding)."""
    r = Sampler(model).generate(
        [p for p in PROMPTS for _ in range(repeats)], 6, seed=0, stop_at_eos=False
    )
    if repeats > 1:
        r.completion_mask[0, 2:] = 0
        r.completion_mask[1, 4:] = 0
    P = r.prompt_ids.shape[1]
    return r, P


def test_lean_reference_shares_prompts_to_float_rounding():
    model = micro_llama()
    r, P = _policy_case(model, repeats=4)
    lean = LeanLlama.from_hf(model)
    with torch.inference_mode():
        shared = logprobs(lean, r.input_ids, r.attention_mask, P, 0.9)
        alone = logprobs(lean, r.input_ids, r.attention_mask, P, 0.9, share_prompts=False)
    m = r.completion_mask.bool()
    torch.testing.assert_close(shared[m], alone[m], atol=1e-5, rtol=0)
    torch.testing.assert_close(
        shared[m], _reference_logprobs(model, r, P, 0.9)[m].detach(), atol=1e-5, rtol=0
    )


def _reference_logprobs(model, r, P, temperature):
    """The plain path: full logits from the model's own forward, then log_softmax."""
    pos = (r.attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=r.input_ids, attention_mask=r.attention_mask, position_ids=pos).logits
    logits = logits[:, P - 1 : -1].float() / temperature
    return logits.log_softmax(-1).gather(-1, r.completion_ids[..., None]).squeeze(-1)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("repeats", [1, 4])  # 4: each prompt runs once for its 4 completions
@pytest.mark.parametrize("lora", [False, True])
def test_rollout_logprobs_and_grads_equal_the_full_logits_path(lora, repeats):
    model = micro_llama()
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False
            ),
        )
    assert tl._decoder_and_head(model) is not None
    r, P = _policy_case(model, repeats)
    assert (shared_prompts(r.input_ids, r.attention_mask, P) is not None) == (repeats > 1)
    model.train()
    got = logprobs(model, r.input_ids, r.attention_mask, P, 0.8)
    (got * r.completion_mask).sum().backward()
    g_got = _grads(model)
    model.zero_grad(set_to_none=True)
    want = _reference_logprobs(model, r, P, 0.8)
    (want * r.completion_mask).sum().backward()
    g_want = _grads(model)
    m = r.completion_mask.bool()
    torch.testing.assert_close(got[m], want[m], atol=1e-5, rtol=1e-5)
    assert_grads_close(g_got, g_want)


def assert_grads_close(got: dict, want: dict, rel: float = 1e-6) -> None:
    """Same parameters, same gradients up to fp32 sums in another order (tolerance `rel` times
    each gradient's largest entry)."""
    assert got.keys() == want.keys() and got
    for name in want:
        scale = float(want[name].abs().max())
        torch.testing.assert_close(got[name], want[name], atol=rel * scale, rtol=1e-4, msg=name)


def test_gpt2_uses_the_logits_path():
    model = micro_gpt2()
    assert tl._decoder_and_head(model) is None
    r, P = _policy_case(model)
    with torch.no_grad():
        got = logprobs(model, r.input_ids, r.attention_mask, P, 1.0)
        want = _reference_logprobs(model, r, P, 1.0)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
