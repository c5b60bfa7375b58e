"""The decode's LM head through oneDNN's packed linear: the same logits, draws and log-probs as
F.linear, rebuilt from every weight load, and the sampler's reason says which head ran."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from smollab.engine.lean_llama import LeanLlama, head_choice  # noqa: E402
from smollab.engine.sampler import Sampler  # noqa: E402
from tests.engine.test_families import load  # noqa: E402
from tests.engine.test_lean_llama import batch  # noqa: E402

oneDNN = pytest.mark.skipif(
    not head_choice(torch.zeros(4096, 8))[0], reason="this torch has no oneDNN linear"
)
PROMPTS = [[1, 5, 6, 7, 8], [1, 9], [1, 10, 11], [1, 12, 13, 14]]


def head_llama(seed: int = 0, head_scale: float = 1.0, vocab: int = 4096):
    """A random Llama with the SimpleStories-1.25M head (vocab 4,096 x hidden 128), 2 layers;
    `head_scale` > 1 peaks its distributions like a trained model's."""
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model


def assert_packed_logits_equal(lean: LeanLlama, h: torch.Tensor) -> None:
    with torch.inference_mode():
        want = lean.logits_of(h)
        lean._head_pack = None
        got = lean.decode_logits(h)
    assert lean._head_pack is not None and lean._head_pack[0] == h.shape[0]  # the packed path ran
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * scale)


@oneDNN
def test_packed_head_logits_equal_f_linear_at_the_1_25m_shape():
    lean = LeanLlama.from_hf(head_llama())
    assert lean.use_packed_head
    g = torch.Generator().manual_seed(0)
    for rows in (32, 5):  # a second row count packs again
        assert_packed_logits_equal(lean, torch.randn(rows, 128, generator=g))


@oneDNN
@pytest.mark.parametrize("family", ["qwen2.5", "llama3.2"])
def test_packed_head_logits_equal_f_linear_on_a_tied_replica(replicas, family):
    hf = load(replicas(family))
    assert hf.config.tie_word_embeddings
    lean = LeanLlama.from_hf(hf)
    ids, mask = batch(vocab=900)
    with torch.inference_mode():
        h = lean.hidden(ids, mask)[:, -1]
    assert_packed_logits_equal(lean, h)


def rollout(sampler, packed: bool, **kw):
    sampler.lean.use_packed_head = packed
    kw = {"seed": 3, "stop_at_eos": False, "record": True, **kw}
    return sampler.generate(PROMPTS, 12, **kw)


@oneDNN
@pytest.mark.parametrize("decode", ["eager", "static"])
def test_packed_head_draws_the_same_tokens_as_f_linear(decode):
    """A peaked distribution: fp32 rounding of another summation order (~1e-6 of the logits)
    cannot move a draw unless its uniform lands that close to a CDF boundary, which these seeds
    do not; the log-probs agree to rounding."""
    sampler = Sampler(head_llama(head_scale=30.0), eos_token_id=2, decode=decode)
    plain, packed = rollout(sampler, False), rollout(sampler, True)
    assert sampler.lean._head_pack is not None
    assert torch.equal(plain.completion_ids, packed.completion_ids)
    torch.testing.assert_close(packed.logprobs, plain.logprobs, rtol=0, atol=1e-4)
    torch.testing.assert_close(packed.record.probs, plain.record.probs, rtol=0, atol=1e-5)


@oneDNN
def test_packed_head_is_rebuilt_from_each_weight_load():
    first, second = head_llama(seed=0, head_scale=30.0), head_llama(seed=1, head_scale=30.0)
    sampler = Sampler(first, eos_token_id=2)
    rollout(sampler, True)  # packs the first model's head
    sampler.load_weights(second)
    packed = rollout(sampler, True)
    plain = rollout(Sampler(second, eos_token_id=2), False)
    assert torch.equal(packed.completion_ids, plain.completion_ids)
    torch.testing.assert_close(packed.logprobs, plain.logprobs, rtol=0, atol=1e-4)


def test_the_reason_says_which_head_decodes():
    packs = head_choice(torch.zeros(4096, 8))[0]
    model = head_llama()
    reason = Sampler(model, eos_token_id=2, decode="eager").decode_reason
    if packs:
        assert reason.endswith(
            "; lm head: oneDNN packed (whole rollouts measured 1.13-1.26x faster than with F.linear on CPU heads of 4k-152k words)"
        )
    else:
        assert "lm head: F.linear (this torch has no oneDNN linear)" in reason
    compiled = Sampler(model, eos_token_id=2, decode="compiled").decode_reason
    assert "lm head: F.linear (" in compiled and ("decode=compiled" in compiled or not packs)
    bf16 = Sampler(model.to(torch.bfloat16), eos_token_id=2).decode_reason
    assert "lm head: F.linear (the packed head is measured and used in float32 only" in bf16
    narrow = Sampler(head_llama(vocab=64), eos_token_id=2).decode_reason
    assert "lm head: F.linear (vocab 64 < 4096" in narrow
    off = Sampler(head_llama(), eos_token_id=2)
    off.lean.use_packed_head = False
    assert off.lean.head_reason("eager").startswith("lm head: F.linear")
