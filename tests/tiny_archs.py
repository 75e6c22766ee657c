"""The tiny architectures and vocabulary of the tests' random checkpoints (``make_tiny_model`` in
``conftest.py``). A module of its own, imported as ``from tiny_archs import ...``: a test's
``from conftest import ...`` finds whichever ``conftest`` module was imported last, which is
``tests/vl/conftest.py`` or ``tests/serve/conftest.py`` when those folders are collected first."""

from __future__ import annotations

from typing import Any

TINY_VOCAB = 384

TINY_ARCHS: dict[str, dict[str, Any]] = {
    # GQA, tied embeddings, llama3 rope scaling
    "llama_gqa_llama3rope": dict(
        arch="llama",
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
    # MHA with an odd head count, untied
    "llama_mha_odd": dict(
        arch="llama", num_attention_heads=3, num_key_value_heads=3, head_dim=16, hidden_size=48
    ),
    "llama_linear_rope": dict(arch="llama", rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "mistral_window": dict(arch="mistral", num_attention_heads=4, num_key_value_heads=1, sliding_window=16),
    "qwen2_bias": dict(arch="qwen2", num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "qwen3_qknorm": dict(arch="qwen3", num_attention_heads=4, num_key_value_heads=2, head_dim=32),
    # head dim 128 with a GQA group of 4 (Llama 3's), narrower than its heads: the shape the CUDA int8
    # decode kernel takes (tests/api/test_gpu_parity.py)
    "llama_hd128": dict(arch="llama", num_attention_heads=4, num_key_value_heads=1, head_dim=128),
    # the same with a 16-token sliding window (the int8 decode paths that attend over the whole
    # context must not take it)
    "mistral_window_hd128": dict(
        arch="mistral", num_attention_heads=4, num_key_value_heads=1, head_dim=128, sliding_window=16
    ),
    # full attention in layer 0, a 16-token window in layers 1 and 2 (layer_types from max_window_layers):
    # layers whose attention differs, as the piecewise steps' launch replay must tell apart
    "qwen2_mixed_window": dict(
        arch="qwen2", num_hidden_layers=3, use_sliding_window=True, sliding_window=16, max_window_layers=1
    ),
}
