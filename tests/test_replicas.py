"""The offline replicas of the Hub families (tests/replicas.py) are what the engine's tests take
them for: each loads with transformers as published (bf16 safetensors, dtype auto), has its
family's features, generates, and its tokenizer round-trips text and renders the family's chat
markers with ids that agree with the model's config."""

from __future__ import annotations

import hashlib
import json
import time

import pytest
import torch

from tests.replicas import FAMILIES, HUB_IDS, build_replica, replica_config

# model_type, vocabulary; config.json's eos and bos tokens; the tokenizer's eos and pad tokens
PUBLISHED = {
    "qwen2.5": ("qwen2", 151936, ["<|im_end|>"], "<|endoftext|>", "<|im_end|>", "<|endoftext|>"),
    "qwen3": ("qwen3", 151936, ["<|im_end|>"], "<|endoftext|>", "<|im_end|>", "<|endoftext|>"),
    "smollm2": ("llama", 49152, ["<|im_end|>"], "<|im_start|>", "<|im_end|>", "<|im_end|>"),
    "smollm3": ("smollm3", 128256, ["<|im_end|>"], None, "<|im_end|>", "<|finetune_right_pad_id|>"),
    "llama3.2": (
        "llama",
        128256,
        ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
        "<|begin_of_text|>",
        "<|eot_id|>",
        None,  # Llama 3 ships no pad token
    ),
}

# What each family's template renders for a system + user turn and the generation prompt
# (Qwen3 with enable_thinking=False: its empty think block).
MARKERS = {
    "qwen2.5": [
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n",
        "<|im_start|>assistant\n",
    ],
    "qwen3": ["<|im_start|>user\nHi<|im_end|>\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"],
    "smollm2": ["<|im_start|>system\nBe brief.<|im_end|>\n", "<|im_start|>assistant\n"],
    "smollm3": [
        "## Metadata\n\n",
        "Reasoning Mode: /no_think",
        "<|im_start|>assistant\n<think>\n\n</think>\n",
    ],
    "llama3.2": [
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n",
        "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
    ],
}


def _load(path, dtype="auto"):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype), AutoTokenizer.from_pretrained(
        path
    )


def test_all_families_build_in_seconds_small_and_deterministic(tmp_path):
    """Each family builds in a fraction of a second once transformers is imported, a few MB
    each; the same arguments write the same weights."""
    sizes = {}
    t0 = time.perf_counter()
    for family in FAMILIES:
        out = build_replica(family, tmp_path / family)
        sizes[family] = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    took = time.perf_counter() - t0
    print(
        f"\nbuilt {len(FAMILIES)} replicas in {took:.2f} s: "
        + ", ".join(f"{f} {mb:.1f} MB" for f, mb in sizes.items())
    )
    assert all(mb < 16 for mb in sizes.values()), sizes
    again = build_replica("qwen3", tmp_path / "again")

    def digest(p):
        return hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest()

    assert digest(again) == digest(tmp_path / "qwen3")


@pytest.mark.parametrize("family", FAMILIES)
def test_loads_as_published(replica_dir, family):
    """bf16 safetensors and a config that says so; dtype auto loads bf16; the family's
    model_type and vocabulary (larger than the tokenizer); config ids name the family's tokens."""
    from safetensors.torch import load_file

    config = json.loads((replica_dir / "config.json").read_text())
    generation = json.loads((replica_dir / "generation_config.json").read_text())
    model_type, vocab, eos, bos, tok_eos, pad = PUBLISHED[family]
    assert config["torch_dtype"] == "bfloat16"
    stored = load_file(replica_dir / "model.safetensors")
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    model, tok = _load(replica_dir)
    assert model.dtype == torch.bfloat16
    assert model.config.model_type == config["model_type"] == model_type
    assert model.config.vocab_size == vocab > len(tok)
    eos_ids = config["eos_token_id"]
    assert tok.convert_ids_to_tokens(eos_ids if isinstance(eos_ids, list) else [eos_ids]) == eos
    bos_id = config["bos_token_id"]
    assert (bos_id and tok.convert_ids_to_tokens(bos_id)) == (bos and bos)
    assert (tok.eos_token, tok.pad_token) == (tok_eos, pad)
    assert generation.get("pad_token_id") == tok.pad_token_id


@pytest.mark.parametrize("family", FAMILIES)
def test_has_its_family_features(replica_dir, family):
    """The features the lean engine must read: GQA (kv heads > 1, fewer than query heads), tied
    heads, non-trivial norm gains, and each family's own: Qwen2.5's q/k/v biases (no o bias),
    Qwen3's per-head q/k RMSNorm with an explicit head_dim, SmolLM3's NoPE layers, Llama 3.2's
    llama3 RoPE scaling."""
    model, _ = _load(replica_dir)
    cfg = model.config
    attn = model.model.layers[0].self_attn
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert 1 < cfg.num_key_value_heads < cfg.num_attention_heads
    assert attn.k_proj.out_features == cfg.num_key_value_heads * head_dim
    assert cfg.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert not torch.all(model.model.norm.weight == 1)
    biased = [
        n for n in ("q_proj", "k_proj", "v_proj", "o_proj") if getattr(attn, n).bias is not None
    ]
    assert biased == (["q_proj", "k_proj", "v_proj"] if family == "qwen2.5" else [])
    assert all(getattr(attn, n).bias.abs().sum() > 0 for n in biased)
    has_qk_norm = hasattr(attn, "q_norm")
    assert has_qk_norm == (family == "qwen3")
    if family == "qwen3":
        assert attn.q_norm.weight.shape == (head_dim,) and not torch.all(attn.k_norm.weight == 1)
        assert cfg.num_attention_heads * head_dim > cfg.hidden_size
    rope = cfg.rope_parameters
    if family == "llama3.2":
        assert rope["rope_type"] == "llama3" and rope["factor"] == 32.0
        assert (rope["low_freq_factor"], rope["high_freq_factor"]) == (1.0, 4.0)
        assert rope["original_max_position_embeddings"] == 8192 and rope["rope_theta"] == 500000.0
    else:
        assert rope["rope_type"] == "default"
    if family == "smollm3":
        assert cfg.no_rope_layers == [1, 1, 1, 0]
        assert [layer.self_attn.use_rope for layer in model.model.layers] == [1, 1, 1, 0]
    theta = {"qwen2.5": 1e6, "qwen3": 1e6, "smollm2": 1e5, "smollm3": 5e6, "llama3.2": 5e5}
    assert rope["rope_theta"] == theta[family]


@pytest.mark.parametrize("family", FAMILIES)
def test_generates_text_that_varies(replica_dir, family):
    """HF `generate` runs; greedy tokens decode (ids within the tokenizer) and are not one token
    repeated, so decode parity tests see positions and the cache at work."""
    model, tok = _load(replica_dir, torch.float32)
    ids = tok("What is 12 + 30?", return_tensors="pt")
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out = model.generate(
        **ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=pad
    )
    new = out[0, ids.input_ids.shape[1] :].tolist()
    assert len(new) == 12 and max(new) < len(tok) and len(set(new)) > 2, new


@pytest.mark.parametrize("family", FAMILIES)
def test_tokenizer_round_trips_and_renders_the_family_template(replica_dir, family):
    """Text (digits, accents, newlines, emoji) round-trips; the HF tokenizer encodes as its
    tokenizer.json does; specials are single ids; the chat template renders the family's markers
    and tokenizes to ids the model can embed."""
    from tokenizers import Tokenizer

    _, tok = _load(replica_dir)
    raw = Tokenizer.from_file(str(replica_dir / "tokenizer.json"))
    text = "Lily paid $4.50 for 12345 apples, café au lait!\n  Then: 🙂 don't STOP."
    ids = tok(text).input_ids
    assert ids == raw.encode(text).ids
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert (ids[0] == tok.bos_token_id) == (family == "llama3.2")  # only Llama 3 prepends bos
    assert len(tok(tok.eos_token, add_special_tokens=False).input_ids) == 1
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    if family == "qwen3":
        messages = messages[1:]
    kwargs = {"enable_thinking": False} if family in ("qwen3", "smollm3") else {}
    rendered = tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )
    for marker in MARKERS[family]:
        assert marker in rendered, (marker, rendered)
    if family == "qwen2.5":  # the default system prompt
        alone = tok.apply_chat_template(messages[1:], tokenize=False)
        assert alone.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    chat = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=True, **kwargs)
    assert tok.decode(chat["input_ids"]) == rendered
    if family == "llama3.2":  # the template writes <|begin_of_text|>, the tokenizer adds none
        assert chat["input_ids"].count(tok.bos_token_id) == 1


def test_full_shape_is_the_published_one():
    """`full=True` keeps the published sizes: Qwen2.5-0.5B's 24 layers, hidden 896, 14/2 heads,
    intermediate 4864, about 494M parameters (counted on the meta device, nothing allocated)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config, _ = replica_config("qwen2.5", full=True, dtype="float32")
    shape = [config[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads")]
    assert shape + [config["num_key_value_heads"], config["intermediate_size"]] == [
        24,
        896,
        14,
        2,
        4864,
    ]
    assert config["torch_dtype"] == "float32" and HUB_IDS["qwen2.5"] == "Qwen/Qwen2.5-0.5B-Instruct"
    cfg = AutoConfig.for_model(**config)
    with torch.device("meta"):
        n = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
    assert 490e6 < n < 500e6, n


def test_untied_variant_stores_its_own_head(replicas):
    """`tie=False` (Qwen2.5-7B's, Qwen3-8B's heads): lm_head.weight is stored and loaded apart."""
    model, _ = _load(replicas("qwen2.5", tie=False))
    assert not model.config.tie_word_embeddings
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
