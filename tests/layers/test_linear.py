"""Linear layers: fused q/k/v and gate/up loading by shard, shape checks, the quant_method hook."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from hotloop.layers.activation import SiluAndMul
from hotloop.layers.linear import Linear, MergedLinear, QKVLinear


def _load(layer: Linear, name: str, tensor: torch.Tensor, shard: str | int | None = None) -> None:
    param = getattr(layer, name)
    param.weight_loader(param, tensor, shard)


def test_qkv_shards_equal_separate_projections() -> None:
    hidden, heads, kv_heads, head_dim = 24, 3, 1, 8
    layer = QKVLinear(hidden, head_dim, heads, kv_heads, bias=True, dtype=torch.float32)
    weight: Any = layer.weight
    assert layer.shard_ids == ("q", "k", "v") and weight.shard_ids == ("q", "k", "v")
    parts = {
        "q": (torch.randn(heads * head_dim, hidden), torch.randn(heads * head_dim)),
        "k": (torch.randn(kv_heads * head_dim, hidden), torch.randn(kv_heads * head_dim)),
        "v": (torch.randn(kv_heads * head_dim, hidden), torch.randn(kv_heads * head_dim)),
    }
    for shard in ("v", "q", "k"):  # any order
        _load(layer, "weight", parts[shard][0], shard)
        _load(layer, "bias", parts[shard][1], shard)
    x = torch.randn(5, hidden)
    q, k, v = layer.split(layer(x))
    for got, shard in ((q, "q"), (k, "k"), (v, "v")):
        torch.testing.assert_close(got, F.linear(x, *parts[shard]))


def test_merged_gate_up_then_silu_and_mul() -> None:
    layer = MergedLinear(16, [32, 32], dtype=torch.float32)
    gate, up = torch.randn(32, 16), torch.randn(32, 16)
    _load(layer, "weight", up, 1)
    _load(layer, "weight", gate, 0)
    x = torch.randn(4, 16)
    torch.testing.assert_close(SiluAndMul()(layer(x)), F.silu(x @ gate.T) * (x @ up.T))


def test_fused_layer_accepts_an_already_fused_tensor() -> None:
    layer = MergedLinear(8, [4, 4], dtype=torch.float32)
    w = torch.randn(8, 8)
    _load(layer, "weight", w)
    torch.testing.assert_close(layer.weight.data, w)


def test_shape_and_shard_errors_are_clear() -> None:
    layer = QKVLinear(16, 4, 4, 2, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"shard 'k'.*\(4, 16\).*\(8, 16\)"):
        _load(layer, "weight", torch.randn(4, 16), "k")
    with pytest.raises(ValueError, match="unknown shard 'x'"):
        _load(layer, "weight", torch.randn(8, 16), "x")
    plain = Linear(16, 8, dtype=torch.float32)
    with pytest.raises(ValueError, match="does not match"):
        _load(plain, "weight", torch.randn(16, 8))


def test_loader_casts_dtype() -> None:
    layer = Linear(4, 3, bias=True, dtype=torch.bfloat16)
    _load(layer, "weight", torch.randn(3, 4))
    _load(layer, "bias", torch.randn(3))
    assert layer.weight.dtype == torch.bfloat16 and layer(torch.randn(2, 4, dtype=torch.bfloat16)).shape == (
        2,
        3,
    )


class _ScaledMethod:
    """A stand-in quantization method: stores the weight transposed, multiplies by 2."""

    def create_weights(self, layer: Linear) -> None:
        layer.register_parameter("w_t", torch.nn.Parameter(torch.ones(layer.in_features, layer.out_features)))

    def apply(self, layer: Linear, x: torch.Tensor) -> torch.Tensor:
        w_t: torch.Tensor = layer.get_parameter("w_t")
        return 2 * x @ w_t


def test_quant_method_hook() -> None:
    layer = Linear(4, 3, quant_method=_ScaledMethod())
    assert not hasattr(layer, "weight") or layer.weight is None
    torch.testing.assert_close(layer(torch.ones(1, 4)), torch.full((1, 3), 8.0))
