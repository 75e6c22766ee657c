"""The model config of the engine tests' toy models: no weights, no transformers config; the engine
needs only its sizes, dtype and EOS ids (tests/engine/test_engine.py, test_async_engine.py,
test_engine_leak_audit.py)."""

from __future__ import annotations

from hotloop.config import ModelConfig


def toy_model_config(vocab_size: int, max_positions: int, eos: int = 0, head_dim: int = 8) -> ModelConfig:
    """One layer, one KV head of ``head_dim``, float32, EOS ``eos``."""
    return ModelConfig(
        path="toy",
        architecture="Toy",
        hf_config=None,
        num_layers=1,
        num_kv_heads=1,
        head_dim=head_dim,
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        dtype="float32",
        eos_token_ids=(eos,),
    )
