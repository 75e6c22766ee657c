"""Rotary embedding vs transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb, per scaling type."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from hotloop.layers.rotary import RopeConfig, RotaryEmbedding, apply_rotary

HEAD_DIM = 32
MAX_POS = 64

ROPES: dict[str, dict[str, Any]] = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
}


def _config(rope: dict[str, Any]) -> LlamaConfig:
    return LlamaConfig(
        hidden_size=4 * HEAD_DIM,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POS,
        rope_parameters=dict(rope),
    )


def _hf_rotate(config: LlamaConfig, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
    rot = LlamaRotaryEmbedding(config)
    cos, sin = rot(q, positions[None])  # [1, T, D]
    # transformers' layout: [B, heads, T, D]
    qh, kh = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    return qh[0].transpose(0, 1), kh[0].transpose(0, 1)


@pytest.mark.parametrize("kind", list(ROPES))
def test_matches_transformers(kind: str) -> None:
    config = _config(ROPES[kind])
    rope = RopeConfig.from_hf(config)
    assert rope.rope_type == kind
    gen = torch.Generator().manual_seed(0)
    positions = torch.randperm(MAX_POS, generator=gen)[:40]  # any order, within the original length
    q = torch.randn(40, 4, HEAD_DIM, generator=gen)
    k = torch.randn(40, 2, HEAD_DIM, generator=gen)
    want_q, want_k = _hf_rotate(config, q, k, positions)
    got_q, got_k = RotaryEmbedding(HEAD_DIM, rope)(positions, q.reshape(40, -1), k.reshape(40, -1))
    torch.testing.assert_close(got_q.view(40, 4, HEAD_DIM), want_q, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got_k.view(40, 2, HEAD_DIM), want_k, atol=1e-6, rtol=1e-5)


def test_scaling_changes_angles() -> None:
    positions = torch.arange(MAX_POS)
    base_cos, _ = RotaryEmbedding(HEAD_DIM, RopeConfig.from_hf(_config(ROPES["default"]))).cos_sin(positions)
    for kind in ("linear", "llama3"):
        cos, _ = RotaryEmbedding(HEAD_DIM, RopeConfig.from_hf(_config(ROPES[kind]))).cos_sin(positions)
        assert (cos - base_cos).abs().max() > 0.1, kind


def test_dynamic_beyond_original_length_uses_fixed_scaled_base() -> None:
    factor = 2.0
    rot = RotaryEmbedding(HEAD_DIM, RopeConfig.from_hf(_config(ROPES["dynamic"])))
    positions = torch.tensor([0, 5, MAX_POS - 1, MAX_POS, MAX_POS + 7, 2 * MAX_POS - 1])
    cos, sin = rot.cos_sin(positions)
    theta = 10000.0 * (factor * factor - factor + 1) ** (HEAD_DIM / (HEAD_DIM - 2))
    for row, pos in enumerate(positions.tolist()):
        base = 10000.0 if pos < MAX_POS else theta
        inv = 1.0 / base ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
        torch.testing.assert_close(cos[row].double(), torch.cos(pos * inv), atol=1e-4, rtol=0)
        torch.testing.assert_close(sin[row].double(), torch.sin(pos * inv), atol=1e-4, rtol=0)
    # The same position gets the same angles whatever else is in the batch (keys stay valid in the cache).
    alone, _ = rot.cos_sin(positions[-2:-1])
    torch.testing.assert_close(alone[0], cos[-2])


def test_reads_legacy_and_remote_code_fields() -> None:
    legacy = SimpleNamespace(
        rope_theta=1e6, rope_scaling={"type": "linear", "factor": 2.0}, max_position_embeddings=4096
    )
    rope = RopeConfig.from_hf(legacy)
    assert (rope.theta, rope.rope_type, rope.factor, rope.max_position_embeddings) == (
        1e6,
        "linear",
        2.0,
        4096,
    )
    plain = RopeConfig.from_hf(SimpleNamespace(rope_theta=5e5, rope_scaling=None, max_position_embeddings=8))
    assert (plain.theta, plain.rope_type) == (5e5, "default")
    v5 = RopeConfig.from_hf(LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": 123.0}))
    assert v5.theta == 123.0


def test_unsupported_type_is_named() -> None:
    cfg = SimpleNamespace(rope_theta=1e4, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="'yarn'.*supported"):
        RopeConfig.from_hf(cfg)


def test_partial_rotary_passes_tail_through() -> None:
    rot = RotaryEmbedding(HEAD_DIM, RopeConfig(partial_rotary_factor=0.5))
    assert rot.rotary_dim == HEAD_DIM // 2
    x = torch.randn(5, 2 * HEAD_DIM)
    cos, sin = rot.cos_sin(torch.arange(3, 8))
    y = apply_rotary(x, cos, sin, HEAD_DIM).view(5, 2, HEAD_DIM)
    xv = x.view(5, 2, HEAD_DIM)
    torch.testing.assert_close(y[..., HEAD_DIM // 2 :], xv[..., HEAD_DIM // 2 :])
    torch.testing.assert_close(y.norm(dim=-1), xv.norm(dim=-1))  # a rotation keeps lengths


def test_bfloat16_keeps_dtype() -> None:
    rot = RotaryEmbedding(HEAD_DIM, RopeConfig())
    q = torch.randn(3, 4 * HEAD_DIM, dtype=torch.bfloat16)
    k = torch.randn(3, 2 * HEAD_DIM, dtype=torch.bfloat16)
    out_q, out_k = rot(torch.arange(3), q, k)
    assert out_q.dtype == out_k.dtype == torch.bfloat16
    assert out_q.shape == q.shape and out_k.shape == k.shape
