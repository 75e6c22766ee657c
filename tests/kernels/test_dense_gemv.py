"""The one-row dense GEMV with fused norm / SiLU / residual against ``reference.fused_linear``."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import TOL, interpret, rel_err

from hotloop.kernels import reference


def _case(
    m: int,
    n: int,
    k: int,
    dtype: torch.dtype,
    device: str,
    *,
    norm: bool,
    silu: bool,
    res: bool,
    bias: bool,
    config: object = None,
) -> float:
    from hotloop.kernels.dense_gemv import dense_gemv

    gen = torch.Generator().manual_seed(n * 7 + k)
    rows = 2 * n if silu else n
    x = (torch.randn(m, k, generator=gen) * 3).to(dtype).to(device)
    w = (torch.randn(rows, k, generator=gen) / k**0.5).to(dtype).to(device)
    b = (torch.randn(rows, generator=gen) * 0.1).to(dtype).to(device) if bias else None
    nw = (torch.rand(k, generator=gen) + 0.5).to(dtype).to(device) if norm else None
    r = torch.randn(m, n, generator=gen).to(dtype).to(device) if res else None
    kw = {"norm_weight": nw, "eps": 1e-5, "residual": r, "silu": silu}
    out = dense_gemv(x, w, b, config=config, **kw)  # type: ignore[arg-type]
    # the reference in float32 from the same (rounded) operands, then rounded once
    ref = reference.fused_linear(
        x.float(),
        w.float(),
        None if b is None else b.float(),
        norm_weight=None if nw is None else nw.float(),
        eps=1e-5,
        residual=None if r is None else r.float(),
        silu=silu,
    )
    assert out.shape == (m, n) and out.dtype == dtype
    return rel_err(out, ref)


FUSIONS = [
    dict(norm=False, silu=False, res=False, bias=False),
    dict(norm=True, silu=False, res=False, bias=True),  # input norm -> qkv (with a bias, Qwen2)
    dict(norm=False, silu=False, res=True, bias=False),  # o / down + residual
    dict(norm=True, silu=True, res=False, bias=False),  # post-attention norm -> gate/up -> SiLU
    dict(norm=True, silu=True, res=False, bias=True),
]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "n,k",
    [(6144, 4096), (4096, 4096), (14336, 4096), (4096, 14336), (960, 576), (576, 1536), (1000, 300)],
)
@pytest.mark.parametrize("fusion", range(len(FUSIONS)))
def test_dense_gemv_gpu(n: int, k: int, fusion: int, dtype: torch.dtype) -> None:
    f = FUSIONS[fusion]
    for m in (1, 3):
        err = _case(m, n, k, dtype, "cuda", **f)  # type: ignore[arg-type]
        # the fused roundings (norm, SiLU, residual) are each one rounding of the dtype
        assert err < (1e-5 if dtype == torch.float32 else TOL[dtype] / 2), (m, f, err)


@pytest.mark.gpu
@pytest.mark.parametrize("block_n,block_k,warps", [(1, 64, 1), (16, 128, 8), (2, 1024, 4), (32, 256, 2)])
def test_dense_gemv_configs_gpu(block_n: int, block_k: int, warps: int) -> None:
    from hotloop.kernels.dense_gemv import GemvConfig

    cfg = GemvConfig(block_n, block_k, warps)
    for f in FUSIONS:
        err = _case(1, 1000, 700, torch.bfloat16, "cuda", config=cfg, **f)  # type: ignore[arg-type]
        assert err < TOL[torch.bfloat16] / 2, (cfg, f, err)


@interpret
@pytest.mark.parametrize("fusion", range(len(FUSIONS)))
@pytest.mark.parametrize("n,k", [(24, 64), (10, 40)])  # even tiles, and masked ones
def test_dense_gemv_interpreted(n: int, k: int, fusion: int) -> None:
    from hotloop.kernels.dense_gemv import GemvConfig

    cfg = GemvConfig(block_n=8, block_k=32, num_warps=1)
    assert _case(2, n, k, torch.float32, "cpu", config=cfg, **FUSIONS[fusion]) < 1e-5  # type: ignore[arg-type]


@interpret
def test_dense_gemv_checks_shapes() -> None:
    from hotloop.kernels.dense_gemv import dense_gemv

    x = torch.randn(1, 32)
    with pytest.raises(ValueError, match="K=32"):
        dense_gemv(x, torch.randn(8, 16))
    with pytest.raises(ValueError, match="odd"):
        dense_gemv(x, torch.randn(7, 32), silu=True)
    with pytest.raises(ValueError, match="residual must be"):
        dense_gemv(x, torch.randn(8, 32), residual=torch.randn(1, 4))
    with pytest.raises(ValueError, match="norm_weight must be"):
        dense_gemv(x, torch.randn(8, 32), norm_weight=torch.ones(16))
