"""Offline replicas of the Hub families users fine-tune, each built in a tenth of a second.

No hub is reachable here, and a real checkpoint costs hundreds of MB, so tests read replicas:
each family's published `config.json` with its features kept (model_type, biases, q/k norms, RoPE
type and parameters, tied head, vocabulary size, GQA, activation, head_dim) and only its sizes
scaled down; random weights saved in bf16 as safetensors, as published; a byte-level BPE trained
here on a few hundred words with the family's pre-tokenizer, special tokens, bos/eos/pad and its
published chat template. The config files are written as the hub serves them (transformers 4
keys: `rope_theta`, `rope_scaling`, `torch_dtype`), not as transformers 5 would save them,
since that is what users download.

The chat templates (`replica_templates/`) are the published bytes, as TRL stores them to
recognise models by identity, except SmolLM3's, rebuilt from public copies of it (its system
turn is left unclosed without tools, as published).

Token ids differ from the real ones (the tokenizer has about a thousand entries); every id in
config.json and generation_config.json names the same token as in the published files. The
model keeps the family's vocabulary size, larger than its tokenizer (as Qwen's is in reality),
so big-vocabulary paths run. Weights are drawn so that nothing is an identity a wrong forward
could get away with: RMSNorm gains (q/k norms included) are not ones and biases are not zeros.

    build_replica("qwen3", tmp / "qwen3")  # tiny, bf16, 10 MB
    build_replica("qwen2.5", tmp / "q", full=True, dtype="float32")  # the real 0.5B shape, 2 GB
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FAMILIES", "HUB_IDS", "build_replica", "replica_config"]

TEMPLATES = Path(__file__).with_name("replica_templates")

# The two pre-tokenizer regexes, as in the families' tokenizer.json (Llama 3 groups digits by 3).
_QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_QWEN_SPECIALS = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]
_QWEN3_SPECIALS = [
    *_QWEN_SPECIALS,
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]
_SMOLLM2_SPECIALS = [
    (t, True)
    for t in (
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<repo_name>",
        "<reponame>",
        "<file_sep>",
        "<filename>",
        "<gh_stars>",
        "<issue_start>",
        "<issue_comment>",
        "<issue_closed>",
        "<jupyter_start>",
        "<jupyter_text>",
        "<jupyter_code>",
        "<jupyter_output>",
        "<jupyter_script>",
        "<empty_output>",
    )
]


def _llama3_specials(renamed: dict[int, str]) -> list[tuple[str, bool]]:
    """Llama 3's 256 specials (ids 128000-128255), with `renamed` (offset -> token) replacing
    reserved slots, as SmolLM3 does for its ChatML and think tokens."""
    named = {
        0: "<|begin_of_text|>",
        1: "<|end_of_text|>",
        4: "<|finetune_right_pad_id|>",
        6: "<|start_header_id|>",
        7: "<|end_header_id|>",
        8: "<|eom_id|>",
        9: "<|eot_id|>",
        10: "<|python_tag|>",
    }
    out, reserved = [], 0
    for i in range(256):
        if i in renamed:
            tok = renamed[i]
        elif i in named:
            tok = named[i]
        else:
            tok = f"<|reserved_special_token_{reserved}|>"
        if i not in named:
            reserved += 1
        out.append((tok, tok not in ("<think>", "</think>")))
    return out


@dataclass(frozen=True)
class _Tokenizer:
    """What a family's tokenizer files say: its pre-tokenizer, its added tokens in id order from
    `first_id` (the published id of the first), the named specials and the chat template."""

    split: str  # "qwen" | "llama3" | "smollm2"
    specials: list[tuple[str, bool]]  # (content, special) in published id order
    first_id: int  # published id of specials[0]; 0: they precede the BPE vocabulary
    eos: str
    pad: str | None
    bos: str | None
    unk: str | None
    extra: tuple[str, ...]  # additional_special_tokens
    template: str  # file under replica_templates/
    tokenizer_class: str
    model_max_length: int
    prepend_bos: bool = False  # Llama 3's post-processor adds <|begin_of_text|>


@dataclass(frozen=True)
class _Family:
    hub_id: str
    config: dict  # the published config.json, ids as published
    tiny: dict  # the scaled-down sizes replacing the published ones
    generation: dict  # the published generation_config.json
    tokenizer: _Tokenizer


_FAMILIES: dict[str, _Family] = {
    "qwen2.5": _Family(
        hub_id="Qwen/Qwen2.5-0.5B-Instruct",
        config={
            "architectures": ["Qwen2ForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "hidden_act": "silu",
            "hidden_size": 896,
            "initializer_range": 0.02,
            "intermediate_size": 4864,
            "max_position_embeddings": 32768,
            "max_window_layers": 21,
            "model_type": "qwen2",
            "num_attention_heads": 14,
            "num_hidden_layers": 24,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "sliding_window": 32768,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.43.1",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": 151936,
        },
        # q/k/v biases are in the architecture (no config key); 2 query heads per KV head
        tiny={
            "hidden_size": 32,
            "intermediate_size": 176,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 2,
        },
        generation={
            "bos_token_id": 151643,
            "pad_token_id": 151643,
            "do_sample": True,
            "eos_token_id": [151645, 151643],
            "repetition_penalty": 1.1,
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": 20,
            "transformers_version": "4.37.0",
        },
        tokenizer=_Tokenizer(
            split="qwen",
            specials=_QWEN_SPECIALS,
            first_id=151643,
            eos="<|im_end|>",
            pad="<|endoftext|>",
            bos=None,
            unk=None,
            extra=tuple(t for t, _ in _QWEN_SPECIALS[1:14]),
            template="qwen2.5.jinja",
            tokenizer_class="Qwen2Tokenizer",
            model_max_length=131072,
        ),
    ),
    "qwen3": _Family(
        hub_id="Qwen/Qwen3-0.6B",
        config={
            "architectures": ["Qwen3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "head_dim": 128,
            "hidden_act": "silu",
            "hidden_size": 1024,
            "initializer_range": 0.02,
            "intermediate_size": 3072,
            "max_position_embeddings": 40960,
            "max_window_layers": 28,
            "model_type": "qwen3",
            "num_attention_heads": 16,
            "num_hidden_layers": 28,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000,
            "sliding_window": None,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.51.0",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": 151936,
        },
        # head_dim stays explicit and larger than hidden/heads (16 vs 8), as 128 vs 64 is
        tiny={
            "hidden_size": 32,
            "head_dim": 16,
            "intermediate_size": 96,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 2,
        },
        generation={
            "bos_token_id": 151643,
            "do_sample": True,
            "eos_token_id": [151645, 151643],
            "pad_token_id": 151643,
            "temperature": 0.6,
            "top_k": 20,
            "top_p": 0.95,
            "transformers_version": "4.51.0",
        },
        tokenizer=_Tokenizer(
            split="qwen",
            specials=_QWEN3_SPECIALS,
            first_id=151643,
            eos="<|im_end|>",
            pad="<|endoftext|>",
            bos=None,
            unk=None,
            extra=tuple(t for t, _ in _QWEN_SPECIALS[1:14]),
            template="qwen3.jinja",
            tokenizer_class="Qwen2Tokenizer",
            model_max_length=131072,
        ),
    ),
    "smollm2": _Family(
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        config={
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "hidden_act": "silu",
            "hidden_size": 576,
            "initializer_range": 0.041666666666666664,
            "intermediate_size": 1536,
            "is_llama_config": True,
            "max_position_embeddings": 8192,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": 9,
            "num_hidden_layers": 30,
            "num_key_value_heads": 3,
            "pad_token_id": 2,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-05,
            "rope_interleaved": False,
            "rope_scaling": None,
            "rope_theta": 100000,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.42.3",
            "use_cache": True,
            "vocab_size": 49152,
        },
        # 3 query heads per KV head, as 9/3
        tiny={
            "hidden_size": 48,
            "intermediate_size": 128,
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            "num_hidden_layers": 2,
        },
        generation={
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 2,
            "transformers_version": "4.42.3",
        },
        tokenizer=_Tokenizer(
            split="smollm2",
            specials=_SMOLLM2_SPECIALS,
            first_id=0,
            eos="<|im_end|>",
            pad="<|im_end|>",
            bos="<|im_start|>",
            unk="<|endoftext|>",
            extra=("<|im_start|>", "<|im_end|>"),
            template="smollm2.jinja",
            tokenizer_class="GPT2Tokenizer",
            model_max_length=8192,
        ),
    ),
    "smollm3": _Family(
        hub_id="HuggingFaceTB/SmolLM3-3B",
        config={
            "architectures": ["SmolLM3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": None,
            "eos_token_id": 128012,
            "hidden_act": "silu",
            "hidden_size": 2048,
            "initializer_range": 0.02,
            "intermediate_size": 11008,
            "max_position_embeddings": 65536,
            "max_window_layers": 28,
            "mlp_bias": False,
            "model_type": "smollm3",
            "no_rope_layer_interval": 4,
            "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(36)],
            "num_attention_heads": 16,
            "num_hidden_layers": 36,
            "num_key_value_heads": 4,
            "pad_token_id": 128004,
            "pretraining_tp": 2,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 5000000.0,
            "sliding_window": None,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.54.0.dev0",
            "use_cache": False,
            "use_sliding_window": False,
            "vocab_size": 128256,
        },
        # four layers so that one is NoPE (every 4th layer skips RoPE)
        tiny={
            "hidden_size": 32,
            "intermediate_size": 176,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 4,
        },
        generation={
            "eos_token_id": 128012,
            "pad_token_id": 128004,
            "do_sample": True,
            "temperature": 0.6,
            "top_p": 0.95,
            "transformers_version": "4.54.0.dev0",
        },
        tokenizer=_Tokenizer(
            split="llama3",
            specials=_llama3_specials(
                {2: "<think>", 3: "</think>", 11: "<|im_start|>", 12: "<|im_end|>"}
            ),
            first_id=128000,
            eos="<|im_end|>",
            pad="<|finetune_right_pad_id|>",
            bos=None,
            unk=None,
            extra=(),
            template="smollm3.jinja",
            tokenizer_class="PreTrainedTokenizerFast",
            model_max_length=65536,
        ),
    ),
    "llama3.2": _Family(
        hub_id="meta-llama/Llama-3.2-1B-Instruct",
        config={
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 128000,
            "eos_token_id": [128001, 128008, 128009],
            "head_dim": 64,
            "hidden_act": "silu",
            "hidden_size": 2048,
            "initializer_range": 0.02,
            "intermediate_size": 8192,
            "max_position_embeddings": 131072,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": 32,
            "num_hidden_layers": 16,
            "num_key_value_heads": 8,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {
                "factor": 32.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "rope_theta": 500000.0,
            "tie_word_embeddings": True,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.45.0.dev0",
            "use_cache": True,
            "vocab_size": 128256,
        },
        # head_dim 8 keeps all three llama3 bands: wavelengths 6, 167, 4443 and 118k positions
        # against the 2048-8192 band of original_max 8192 and freq factors 4 and 1
        tiny={
            "hidden_size": 48,
            "head_dim": 8,
            "intermediate_size": 192,
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            "num_hidden_layers": 2,
        },
        generation={
            "bos_token_id": 128000,
            "do_sample": True,
            "eos_token_id": [128001, 128008, 128009],
            "temperature": 0.6,
            "top_p": 0.9,
            "transformers_version": "4.45.0.dev0",
        },
        tokenizer=_Tokenizer(
            split="llama3",
            specials=_llama3_specials({}),
            first_id=128000,
            eos="<|eot_id|>",
            pad=None,  # Llama 3 ships no pad token
            bos="<|begin_of_text|>",
            unk=None,
            extra=(),
            template="llama3.2.jinja",
            tokenizer_class="PreTrainedTokenizerFast",
            model_max_length=131072,
            prepend_bos=True,
        ),
    ),
}

FAMILIES: tuple[str, ...] = tuple(_FAMILIES)
HUB_IDS: dict[str, str] = {name: f.hub_id for name, f in _FAMILIES.items()}
_DTYPES = {"bfloat16", "float32", "float16"}

# Mixed case, digits, punctuation and line breaks, so the BPE learns more than lowercase words.
_TEXT = """\
Once upon a time, in a small town by the sea, there lived a girl named Lily. Every morning
she walked 2 miles to the market with her brother Tom, who was 7 years old. "Can we buy 3
apples today?" Tom asked. Lily laughed and said: "Yes, and a loaf of bread too!"
The baker, Mr. Brown, had baked 120 rolls before sunrise. He smiled at them: "Good morning!
Would you like to try my new honey cake? It costs $4.50." They shared it on the way home.
Q: What is 12 + 30? A: Let me think step by step. 12 + 30 = 42, so the answer is 42.
Q: How many legs do 3 cats have? A: Each cat has 4 legs, and 3 x 4 = 12. The answer is 12.
The assistant said: I am happy to help. Here is a short poem about the moon and the stars.
"""


def _corpus() -> list[str]:
    from smollab.data.stories import generate_stories

    return _TEXT.splitlines() * 4 + generate_stories(40, seed=0)


def _tokenizer_object(spec: _Tokenizer):
    """The `tokenizers` Tokenizer: a byte-level BPE trained here with the family's pre-tokenizer,
    normalizer, post-processor and added tokens in the family's order."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, trainers
    from tokenizers import pre_tokenizers as pt
    from tokenizers import processors as pp

    tok = Tokenizer(models.BPE())
    byte_level = pt.ByteLevel(add_prefix_space=False, use_regex=False)
    if spec.split == "smollm2":
        tok.pre_tokenizer = pt.Sequence(
            [pt.Digits(individual_digits=True), pt.ByteLevel(add_prefix_space=False)]
        )
    else:
        regex = _QWEN_SPLIT if spec.split == "qwen" else _LLAMA3_SPLIT
        tok.pre_tokenizer = pt.Sequence([pt.Split(Regex(regex), behavior="isolated"), byte_level])
    if spec.split == "qwen":
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    added = [AddedToken(c, special=s, normalized=False) for c, s in spec.specials]
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=added if spec.first_id == 0 else [],
        initial_alphabet=pt.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    if spec.first_id:  # after the BPE vocabulary, one at a time to keep the published order
        for token in added:
            (tok.add_special_tokens if token.special else tok.add_tokens)([token])
    post = pp.ByteLevel(trim_offsets=False)
    if spec.prepend_bos:
        bos = (spec.bos, tok.token_to_id(spec.bos))
        template = pp.TemplateProcessing(
            single=f"{spec.bos} $A", pair=f"{spec.bos} $A {spec.bos}:1 $B:1", special_tokens=[bos]
        )
        post = pp.Sequence([post, template])
    tok.post_processor = post
    return tok


def _save_tokenizer(spec: _Tokenizer, out: Path):
    """Save the HF tokenizer into `out` with the family's tokenizer class; return it."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=_tokenizer_object(spec),
        bos_token=spec.bos,
        eos_token=spec.eos,
        pad_token=spec.pad,
        unk_token=spec.unk,
        additional_special_tokens=list(spec.extra),
        model_max_length=spec.model_max_length,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = (TEMPLATES / spec.template).read_text()
    tok.save_pretrained(out)
    path = out / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = spec.tokenizer_class
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return tok


def replica_config(
    family: str,
    *,
    layers: int | None = None,
    full: bool = False,
    dtype: str = "bfloat16",
    tie: bool | None = None,
    overrides: dict | None = None,
    token_ids: dict[int, int] | None = None,
) -> tuple[dict, dict]:
    """(config.json, generation_config.json) of a replica: the published files with the tiny
    sizes (or, `full`, the published ones), `layers` layers, weights of `dtype`, the head tied or
    not (`tie`; None: as published) and `overrides` last. `token_ids` maps published token ids
    to the replica tokenizer's (build_replica passes it); None keeps the published ids."""
    if family not in _FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r}: one of {sorted(_DTYPES)}")
    spec = _FAMILIES[family]
    config = json.loads(json.dumps(spec.config))  # a deep copy
    if not full:
        config.update(spec.tiny)
    if layers is not None:
        config["num_hidden_layers"] = layers
    n = config["num_hidden_layers"]
    if "max_window_layers" in config:
        config["max_window_layers"] = min(config["max_window_layers"], n)
    if "no_rope_layers" in config:
        every = config["no_rope_layer_interval"]
        config["no_rope_layers"] = [int((i + 1) % every != 0) for i in range(n)]
    if tie is not None:
        config["tie_word_embeddings"] = tie
    config["torch_dtype"] = dtype
    config.update(overrides or {})
    generation = dict(spec.generation)
    if token_ids is not None:
        for d in (config, generation):
            for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
                if isinstance(d.get(key), list):
                    d[key] = [token_ids[i] for i in d[key]]
                elif d.get(key) is not None:
                    d[key] = token_ids[d[key]]
    return config, generation


def _initial(name: str, shape, generator, live: int):
    """A random tensor for parameter `name`, drawn so that each parameter changes the logits:
    RMSNorm gains in [0.5, 1.5], biases around zero, linear weights scaled by fan-in.

    Embeddings (and an untied head) have unit variance: the logits spread over several units,
    well above the near-zero rows from `live` on (ids no tokenizer entry has, like the padding
    rows of Qwen's vocabulary, untrained), so sampled ids decode to text. The blocks' writes to
    the residual stream (o_proj, down_proj) are 5x larger, else the input embedding dominates
    the last hidden state and a tied head repeats the last token: greedy decodes would be one
    token over and over, hiding position and cache bugs."""
    import torch

    if name.endswith("norm.weight"):
        return 0.5 + torch.rand(shape, generator=generator)
    if name.endswith(".bias"):
        return 0.3 * torch.randn(shape, generator=generator)
    if "embed_tokens" in name or name == "lm_head.weight":
        w = torch.randn(shape, generator=generator)
        w[live:] *= 0.02
        return w
    gain = 5.0 if name.endswith(("o_proj.weight", "down_proj.weight")) else 1.0
    return torch.randn(shape, generator=generator) * (gain / math.sqrt(shape[-1]))


def _save_weights(out: Path, dtype: str, seed: int, live: int) -> None:
    """Random weights for the config in `out`, in `dtype`, as one model.safetensors (a tied
    head is stored once, under the embedding's name, as published); `live`: the tokenizer's
    length."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(out)
    with torch.device("meta"):  # names and shapes only, no initialisation
        model = AutoModelForCausalLM.from_config(config)
    shapes = {name: t.shape for name, t in model.state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    generator = torch.Generator().manual_seed(seed)
    to = getattr(torch, dtype)
    tensors = {n: _initial(n, s, generator, live).to(to) for n, s in sorted(shapes.items())}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def build_replica(
    family: str,
    out: str | Path,
    *,
    layers: int | None = None,
    full: bool = False,
    dtype: str = "bfloat16",
    tie: bool | None = None,
    seed: int = 0,
    overrides: dict | None = None,
) -> Path:
    """Write a replica of `family` (one of FAMILIES) into `out` and return it: config.json,
    generation_config.json, model.safetensors and the tokenizer files, loadable offline with
    `AutoModelForCausalLM.from_pretrained(out)` and `AutoTokenizer.from_pretrained(out)`.

    Tiny by default (2-4 layers, hidden 32-48, the family's vocabulary: 5-13 MB in bf16);
    `full` keeps the published sizes (the real parameter count, random weights). `layers`
    overrides the depth, `dtype` the stored precision (bfloat16 as published, float32, float16),
    `tie` whether the head shares the embedding, `overrides` any config key. Same arguments, same
    bytes."""
    if family not in _FAMILIES:
        raise ValueError(f"unknown family {family!r}; one of {', '.join(FAMILIES)}")
    spec = _FAMILIES[family]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = _save_tokenizer(spec.tokenizer, out)
    first = spec.tokenizer.first_id
    ids = {
        first + i: tok.convert_tokens_to_ids(c) for i, (c, _) in enumerate(spec.tokenizer.specials)
    }
    config, generation = replica_config(
        family,
        layers=layers,
        full=full,
        dtype=dtype,
        tie=tie,
        overrides=overrides,
        token_ids=ids,
    )
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    _save_weights(out, dtype, seed, len(tok))
    return out
