"""Helpers shared by the kernel tests: the interpreter marker, the error measure, the tolerances."""

from __future__ import annotations

import importlib.util

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
HAS_TRITON = importlib.util.find_spec("triton") is not None

# CPU tests under the interpreter: skipped where a GPU runs the real kernels instead.
interpret = pytest.mark.skipif(
    HAS_CUDA or not HAS_TRITON, reason="interpreter tests run on CPU-only machines"
)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN anywhere fails."""
    o, r = out.double(), ref.double()
    assert not torch.isnan(o).any(), "NaN in the kernel output"
    return float((o - r).norm() / r.norm().clamp_min(1e-12))


# bf16 operands land between 1e-3 and 1e-2; float32 through tf32 dots near 3e-4.
TOL = {torch.float32: 2e-3, torch.float16: 4e-3, torch.bfloat16: 1.6e-2}


def random_awq(
    k: int, n: int, group: int, dtype: torch.dtype, device: str, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random AutoAWQ GEMM tensors ``(qweight, qzeros, scales)`` for a ``[k, n]`` weight."""
    from hotloop.kernels.w4a16_layout import pack_int4

    gen = torch.Generator().manual_seed(seed)
    qweight = pack_int4(torch.randint(0, 16, (k, n), generator=gen)).to(device)
    qzeros = pack_int4(torch.randint(0, 16, (k // group, n), generator=gen)).to(device)
    scales = (torch.rand(k // group, n, generator=gen) * 0.02 + 0.001).to(device=device, dtype=dtype)
    return qweight, qzeros, scales


def spiky_x(k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """One row of K activations on the GPU, normal with 8 spikes of 20-50 in magnitude (the outliers
    real activations have), for the one-row W4A16 GEMVs' tests."""
    gen = torch.Generator("cuda").manual_seed(seed)
    x = torch.randn(1, k, device="cuda", generator=gen)
    spikes = torch.randint(0, k, (8,), device="cuda", generator=gen)
    x[0, spikes] = (20 + 30 * torch.rand(8, device="cuda", generator=gen)) * torch.sign(
        torch.randn(8, device="cuda", generator=gen)
    )
    return x.to(dtype)
