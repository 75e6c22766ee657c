"""Named model shapes for ``--load-format dummy``: real architectures without any files.

``preset_dir(name)`` writes, once, a Hugging Face folder into the cache holding the model's
``config.json`` and a byte-level BPE tokenizer with exactly the model's vocabulary size (built
offline: the 256 byte symbols, then synthetic merges), so random token ids detokenize like real ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hotloop.utils.env import cache_dir

_FORMAT = 1

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

PRESETS: dict[str, dict[str, Any]] = {
    "llama3-8b": _LLAMA3_8B,
    "qwen2.5-7b": _QWEN25_7B,
    "smollm2-135m": _SMOLLM2_135M,
}


def is_preset(name: str | None) -> bool:
    return name is not None and name.lower() in PRESETS


def preset_dir(name: str) -> Path:
    """The cache folder of preset ``name`` (config.json + tokenizer), written the first time."""
    key = name.lower()
    if key not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}")
    folder = cache_dir() / "presets" / f"{key}-v{_FORMAT}"
    if (folder / "tokenizer.json").is_file() and (folder / "config.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    cfg = dict(PRESETS[key])
    eos = cfg["vocab_size"] - 1
    cfg.update(bos_token_id=eos, eos_token_id=eos)
    _write_tokenizer(folder, cfg["vocab_size"])
    tmp = folder / "config.json.tmp"
    tmp.write_text(json.dumps(cfg, indent=2))
    tmp.replace(folder / "config.json")  # last: its presence marks the folder complete
    return folder


def _write_tokenizer(folder: Path, vocab_size: int) -> None:
    """A byte-level BPE of exactly ``vocab_size`` ids; the last id is ``<|endoftext|>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges: list[tuple[str, str]] = []
    regular = vocab_size - 1
    tokens = list(alphabet)
    i = 0
    while len(vocab) < regular:  # each new token is an existing token plus one symbol
        left = tokens[i // len(alphabet)]
        right = alphabet[i % len(alphabet)]
        i += 1
        tok = left + right
        if tok in vocab:
            continue
        vocab[tok] = len(vocab)
        merges.append((left, right))
        tokens.append(tok)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.chat_template = (
        "{% for m in messages %}<|endoftext|>{{ m['role'] }}\n{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|endoftext|>assistant\n{% endif %}"
    )
    fast.save_pretrained(str(folder))
    if len(fast) != vocab_size:
        raise RuntimeError(f"preset tokenizer has {len(fast)} ids, expected {vocab_size}")
