"""Architecture shapes for the planner: read from a config.json folder, or a named preset.

Presets carry the published shapes of common models (no weights needed) plus ``brief-20b``, the
illustrative 20B-class GQA model of the product brief's worked example (64 KiB of KV per token).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What capacity depends on: the decoder's dimensions (dense, decoder-only)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    max_positions: int | None = None  # config.json's max_position_embeddings, where known

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of the quantizable projections: q, k, v, o, gate, up, down."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2
        return attn + 3 * h * self.intermediate_size

    @property
    def embedding_params(self) -> int:
        """Input embedding plus the LM head unless tied (kept in 16-bit by AWQ)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def other_params_per_layer(self) -> int:
        """Norm weights and biases."""
        bias = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.qkv_bias else 0
        return 2 * self.hidden_size + bias

    @property
    def num_params(self) -> int:
        per_layer = self.linear_params_per_layer + self.other_params_per_layer
        return self.num_layers * per_layer + self.embedding_params + self.hidden_size


PRESETS: dict[str, ModelShape] = {
    s.name: s
    for s in (
        # The brief's worked example: "20B-class GQA, ~40 GB at BF16, ~64 KB of KV per token".
        ModelShape("brief-20b", 32, 6144, 48, 4, 128, 27648, 92544),
        ModelShape("internlm2.5-20b", 48, 6144, 48, 8, 128, 16384, 92544, max_positions=32768),
        ModelShape("internlm2.5-7b", 32, 4096, 32, 8, 128, 14336, 92544, max_positions=32768),
        ModelShape("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256, max_positions=8192),
        ModelShape("llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256, max_positions=8192),
        ModelShape("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, qkv_bias=True, max_positions=32768),
        ModelShape("qwen2.5-32b", 64, 5120, 40, 8, 128, 27648, 152064, qkv_bias=True, max_positions=32768),
        ModelShape("qwen2.5-coder-1.5b", 28, 1536, 12, 2, 128, 8960, 151936, True, True, max_positions=32768),
        ModelShape(
            "smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, tie_word_embeddings=True, max_positions=8192
        ),
    )
}


def shape_from_config(config: dict[str, Any], name: str = "model") -> ModelShape:
    """A ``ModelShape`` from a Hugging Face ``config.json`` dict (Llama/Qwen/Mistral/InternLM2 keys)."""
    cfg = config.get("text_config", config)
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        layers = int(cfg["num_hidden_layers"])
        inter = int(cfg["intermediate_size"])
        vocab = int(cfg["vocab_size"])
    except KeyError as e:
        raise ValueError(
            f"config.json of {name!r} has no {e.args[0]!r}: not a decoder this planner knows"
        ) from None
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    arch = (cfg.get("architectures") or [""])[0]
    return ModelShape(
        name=name,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", arch.startswith("Qwen2"))),
        max_positions=int(cfg["max_position_embeddings"]) if cfg.get("max_position_embeddings") else None,
    )


# The engine's dummy-weight presets (hotloop/models/presets.py) spell these without the dash.
ALIASES = {"llama3-8b": "llama-3-8b", "llama3-70b": "llama-3-70b"}


def load_shape(model: str) -> ModelShape:
    """A preset name, a folder holding config.json, or a config.json path."""
    model = ALIASES.get(model, model)
    if model in PRESETS:
        return PRESETS[model]
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(
            f"model {model!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json folder"
        )
    return shape_from_config(json.loads(path.read_text()), name=path.parent.name)
