"""RMSNorm vs transformers' LlamaRMSNorm, and the fused residual-add variant."""

from __future__ import annotations

import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from hotloop.layers.norm import RMSNorm


def _norm(hidden: int, dtype: torch.dtype = torch.float32) -> tuple[RMSNorm, LlamaRMSNorm]:
    ours = RMSNorm(hidden, eps=1e-5, dtype=dtype)
    ref = LlamaRMSNorm(hidden, eps=1e-5).to(dtype)
    w = torch.randn(hidden, generator=torch.Generator().manual_seed(0)).to(dtype)
    ours.weight.data.copy_(w)
    ref.weight.data.copy_(w)
    return ours, ref


def test_matches_transformers() -> None:
    ours, ref = _norm(48)
    x = torch.randn(7, 48)
    torch.testing.assert_close(ours(x), ref(x), atol=0, rtol=0)


def test_fused_residual_add() -> None:
    ours, ref = _norm(48)
    x, residual = torch.randn(7, 48), torch.randn(7, 48)
    normed, new_residual = ours(x, residual)
    torch.testing.assert_close(new_residual, x + residual, atol=0, rtol=0)
    torch.testing.assert_close(normed, ref(x + residual), atol=0, rtol=0)
    assert residual.data_ptr() != new_residual.data_ptr()  # inputs are not modified


def test_low_precision_matches_transformers() -> None:
    ours, ref = _norm(64, torch.bfloat16)
    x, residual = torch.randn(5, 64, dtype=torch.bfloat16), torch.randn(5, 64, dtype=torch.bfloat16)
    normed, new_residual = ours(x, residual)
    assert normed.dtype == new_residual.dtype == torch.bfloat16
    torch.testing.assert_close(normed, ref(x + residual), atol=0, rtol=0)
