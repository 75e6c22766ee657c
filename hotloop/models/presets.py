"""Named model shapes for ``--load-format dummy``: real architectures without any files.

``preset_dir(name)`` writes, once, a Hugging Face folder into the cache holding the model's
``config.json`` and a byte-level BPE tokenizer with exactly the model's vocabulary size (built
offline: the preset's special tokens at their ids, the 256 byte symbols, then synthetic merges), so
random token ids detokenize like real ones. A vision-language preset (``llava-1.5-7b``) also gets
its image processor's ``preprocessor_config.json`` and a ``processor_config.json``, and its tokenizer
holds the image placeholder token at the id the config names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hotloop.utils.env import cache_dir

_FORMAT = 1

_ENDOFTEXT = "<|endoftext|>"
_SIMPLE_CHAT_TEMPLATE = (
    "{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}"
)
# LLaVA-1.5's conversation format ("USER: <image>\n... ASSISTANT:"), as llava-hf's template writes
# it; contents may be strings or lists of {"type": "text"/"image"} parts.
_LLAVA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['content'] is string %}{% set text = m['content'] %}{% else %}{% set text = namespace(s='') %}"
    "{% for p in m['content'] %}{% if p['type'] == 'image' %}{% set text.s = text.s + '<image>\n' %}"
    "{% elif p['type'] == 'text' %}{% set text.s = text.s + p['text'] %}{% endif %}{% endfor %}"
    "{% set text = text.s %}{% endif %}"
    "{% if m['role'] == 'system' %}{{ text }}\n"
    "{% elif m['role'] == 'user' %}USER: {{ text }} "
    "{% else %}ASSISTANT: {{ text }}{{ eos_token }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


@dataclass(frozen=True)
class PresetTokenizer:
    """A preset's synthetic tokenizer: tokens at fixed ids (registered as special tokens), the
    tokenizer's roles among them, and its chat template. Every other id is a synthetic BPE token."""

    specials: Mapping[int, str]
    bos: str
    eos: str
    unk: str | None = None
    pad: str | None = None
    extra: tuple[str, ...] = ()  # further special tokens (e.g. an image placeholder)
    chat_template: str = _SIMPLE_CHAT_TEMPLATE


@dataclass(frozen=True)
class Preset:
    """``config.json``, the tokenizer, and (vision-language models) the image processor's settings."""

    config: dict[str, Any]
    tokenizer: PresetTokenizer
    preprocessor: dict[str, Any] | None = None
    processor: dict[str, Any] | None = None  # processor_config.json (transformers' LlavaProcessor)

    @property
    def vocab_size(self) -> int:
        text = self.config.get("text_config", self.config)
        return int(text["vocab_size"])


def _text_preset(config: dict[str, Any]) -> Preset:
    """A text model whose last id is ``<|endoftext|>`` (BOS and EOS)."""
    eos = int(config["vocab_size"]) - 1
    cfg = {**config, "bos_token_id": eos, "eos_token_id": eos}
    return Preset(cfg, PresetTokenizer({eos: _ENDOFTEXT}, bos=_ENDOFTEXT, eos=_ENDOFTEXT))


_LLAMA3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}
_QWEN25_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}
_SMOLLM2_135M: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}

# llava-hf/llava-1.5-7b-hf: CLIP ViT-L/14 at 336 px (features of the second to last layer, CLS
# dropped: 576 image tokens), a 2-layer GELU projector, and Vicuna-7B (Llama, MHA) whose vocabulary
# is padded to 32064 with <image> at 32000 and <pad> at 32001.
LLAVA_IMAGE_TOKEN = "<image>"
LLAVA_IMAGE_TOKEN_ID = 32000
_LLAVA15_7B: dict[str, Any] = {
    "architectures": ["LlavaForConditionalGeneration"],
    "model_type": "llava",
    "image_token_index": LLAVA_IMAGE_TOKEN_ID,
    "image_seq_length": 576,
    "pad_token_id": 32001,
    "projector_hidden_act": "gelu",
    "multimodal_projector_bias": True,
    "vision_feature_layer": -2,
    "vision_feature_select_strategy": "default",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vision_config": {
        "model_type": "clip_vision_model",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_channels": 3,
        "image_size": 336,
        "patch_size": 14,
        "projection_dim": 768,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
    },
    "text_config": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32064,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 32001,
        "torch_dtype": "bfloat16",
    },
}
_LLAVA15_PREPROCESSOR: dict[str, Any] = {  # CLIPImageProcessor of openai/clip-vit-large-patch14-336
    "image_processor_type": "CLIPImageProcessor",
    "processor_class": "LlavaProcessor",
    "do_resize": True,
    "size": {"shortest_edge": 336},
    "resample": 3,
    "do_center_crop": True,
    "crop_size": {"height": 336, "width": 336},
    "do_rescale": True,
    "rescale_factor": 1 / 255,
    "do_normalize": True,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "do_convert_rgb": True,
}
_LLAVA15_PROCESSOR: dict[str, Any] = {
    "processor_class": "LlavaProcessor",
    "patch_size": 14,
    "vision_feature_select_strategy": "default",
    "num_additional_image_tokens": 1,
}
_LLAVA15_TOKENIZER = PresetTokenizer(
    {0: "<unk>", 1: "<s>", 2: "</s>", LLAVA_IMAGE_TOKEN_ID: LLAVA_IMAGE_TOKEN, 32001: "<pad>"},
    bos="<s>",
    eos="</s>",
    unk="<unk>",
    pad="<pad>",
    extra=(LLAVA_IMAGE_TOKEN,),
    chat_template=_LLAVA_CHAT_TEMPLATE,
)

PRESETS: dict[str, Preset] = {
    "llama3-8b": _text_preset(_LLAMA3_8B),
    "qwen2.5-7b": _text_preset(_QWEN25_7B),
    "smollm2-135m": _text_preset(_SMOLLM2_135M),
    "llava-1.5-7b": Preset(_LLAVA15_7B, _LLAVA15_TOKENIZER, _LLAVA15_PREPROCESSOR, _LLAVA15_PROCESSOR),
}


def is_preset(name: str | None) -> bool:
    return name is not None and name.lower() in PRESETS


def preset_dir(name: str) -> Path:
    """The cache folder of preset ``name`` (config.json + tokenizer [+ image processor]), written
    the first time."""
    key = name.lower()
    if key not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    folder = cache_dir() / "presets" / f"{key}-v{_FORMAT}"
    if (folder / "tokenizer.json").is_file() and (folder / "config.json").is_file():
        return folder
    write_preset(folder, PRESETS[key])
    return folder


def write_preset(folder: Path, preset: Preset) -> None:
    """Write ``preset``'s files into ``folder``; config.json goes last (it marks the folder complete).
    Also used for made-up shapes (e.g. a tiny LLaVA for a CPU smoke test of a benchmark)."""
    folder.mkdir(parents=True, exist_ok=True)
    _write_tokenizer(folder, preset.vocab_size, preset.tokenizer)
    for file, data in (
        ("preprocessor_config.json", preset.preprocessor),
        ("processor_config.json", preset.processor),
    ):
        if data is not None:
            (folder / file).write_text(json.dumps(data, indent=2))
    tmp = folder / "config.json.tmp"
    tmp.write_text(json.dumps(preset.config, indent=2))
    tmp.replace(folder / "config.json")


def _write_tokenizer(folder: Path, vocab_size: int, spec: PresetTokenizer) -> None:
    """A byte-level BPE of exactly ``vocab_size`` ids: ``spec.specials`` at their ids, the other
    ids filled in order with the byte symbols and then synthetic merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if any(not 0 <= i < vocab_size for i in spec.specials):
        raise ValueError(f"special token ids {sorted(spec.specials)} must lie in [0, {vocab_size})")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {tok: i for i, tok in spec.specials.items()}
    free = (i for i in range(vocab_size) if i not in spec.specials)
    for c in alphabet:
        vocab[c] = next(free)
    merges: list[tuple[str, str]] = []
    tokens = list(alphabet)
    i = 0
    while len(vocab) < vocab_size:  # each new token is an existing token plus one symbol
        left = tokens[i // len(alphabet)]
        right = alphabet[i % len(alphabet)]
        i += 1
        tok = left + right
        if tok in vocab:
            continue
        vocab[tok] = next(free)
        merges.append((left, right))
        tokens.append(tok)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in spec.specials.values()])
    roles = {"bos_token": spec.bos, "eos_token": spec.eos, "unk_token": spec.unk, "pad_token": spec.pad}
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, **{k: v for k, v in roles.items() if v is not None})
    if spec.extra:
        fast.add_special_tokens({"additional_special_tokens": list(spec.extra)})
    fast.chat_template = spec.chat_template
    fast.save_pretrained(str(folder))
    if len(fast) != vocab_size:
        raise RuntimeError(f"preset tokenizer has {len(fast)} ids, expected {vocab_size}")
    for i, tok in spec.specials.items():
        if fast.convert_tokens_to_ids(tok) != i:
            raise RuntimeError(f"preset tokenizer puts {tok!r} at {fast.convert_tokens_to_ids(tok)}, not {i}")
