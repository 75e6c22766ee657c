"""The tiled GEMM for batched decode (``kernels/tiled_gemm.py``) and the RMSNorm that sums its split-K
partials (``rms_norm_partials``), against float32 torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_checks import TOL, interpret, rel_err

from hotloop.kernels import reference


def _operands(m: int, n: int, k: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(m * 31 + n * 7 + k)
    x = (torch.randn(m, k, generator=gen) * 2).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(device)
    return x, w


def _check_modes(m: int, n: int, k: int, dtype: torch.dtype, device: str, cfg: object, tol: float) -> None:
    from dataclasses import replace

    from hotloop.kernels.tiled_gemm import TiledConfig, tiled_gemm

    assert isinstance(cfg, TiledConfig)
    x, w = _operands(m, n, k, dtype, device)
    ref = F.linear(x.float(), w.float())
    y = tiled_gemm(x, w, cfg, "store")
    assert y.shape == (m, n) and y.dtype == dtype
    assert rel_err(y, ref) < tol
    for split in (2, 4):
        if k % (split * cfg.block_k):
            continue
        p = tiled_gemm(x, w, replace(cfg, split_k=split), "partials")
        assert p.shape == (split, m, n) and p.dtype == torch.float32
        assert rel_err(p.sum(0), ref) < tol
        # each partial is its own K range's product (the split is along K, in order)
        ks = k // split
        assert rel_err(p[1], F.linear(x[:, ks : 2 * ks].float(), w[:, ks : 2 * ks].float())) < tol
    if n % 2 == 0:
        act = tiled_gemm(x, w, cfg, "silu")
        assert act.shape == (m, n // 2) and act.dtype == dtype
        # the gate/up product rounded to the dtype, then silu_and_mul's own roundings
        assert rel_err(act, reference.silu_and_mul(ref.to(dtype))) < tol


@interpret
@pytest.mark.parametrize("m", [1, 5, 16, 33])
@pytest.mark.parametrize("n,k", [(64, 64), (48, 128)])  # even tiles, and a masked column tile
def test_tiled_gemm_interpreted(m: int, n: int, k: int) -> None:
    from hotloop.kernels.tiled_gemm import TiledConfig

    _check_modes(m, n, k, torch.float32, "cpu", TiledConfig(16, 32, 16, num_warps=1, num_stages=1), 1e-5)


def test_tiled_config_rejects_bad_tiles() -> None:
    from hotloop.kernels.tiled_gemm import TiledConfig

    with pytest.raises(ValueError, match="block_n=48"):
        TiledConfig(64, 48, 64)
    with pytest.raises(ValueError, match="split_k"):
        TiledConfig(64, 64, 64, split_k=0)
    assert TiledConfig(128, 64, 64, split_k=2).programs(256, 4096) == 2 * 64 * 2


@interpret
def test_tiled_gemm_checks_its_operands() -> None:
    from hotloop.kernels.tiled_gemm import TiledConfig, tiled_gemm

    x, w = _operands(8, 64, 64, torch.float32, "cpu")
    cfg = TiledConfig(16, 32, 16)
    with pytest.raises(ValueError, match="K=64"):
        tiled_gemm(x, w[:, :32].contiguous(), cfg)
    with pytest.raises(ValueError, match="mode"):
        tiled_gemm(x, w, cfg, "sum")
    with pytest.raises(ValueError, match="split_k=2 needs mode 'partials'"):
        tiled_gemm(x, w, TiledConfig(16, 32, 16, split_k=2), "store")
    with pytest.raises(ValueError, match="whole number"):
        tiled_gemm(x, w, TiledConfig(16, 32, 16, split_k=3), "partials")
    with pytest.raises(ValueError, match="even row count"):
        tiled_gemm(x, w[:63].contiguous(), cfg, "silu")


def _norm_partials_case(splits: int, n: int, c: int, dtype: torch.dtype, device: str, tol: float) -> None:
    from hotloop.kernels.rms_norm import rms_norm_partials

    gen = torch.Generator().manual_seed(splits * 100 + n + c)
    parts = (torch.randn(splits, n, c, generator=gen) * 2).to(device)
    r = torch.randn(n, c, generator=gen).to(dtype).to(device)
    w = (torch.rand(c, generator=gen) + 0.5).to(dtype).to(device)
    out, res = rms_norm_partials(parts, w, 1e-5, r)
    proj = parts.sum(0).to(dtype)  # what the projection would have stored
    ref_out, ref_res = reference.add_rms_norm(proj, r, w, 1e-5)
    assert out.dtype == dtype and res.dtype == dtype
    assert rel_err(res, ref_res) < tol
    assert rel_err(out, ref_out) < tol


@interpret
@pytest.mark.parametrize("splits", [1, 2, 4])
@pytest.mark.parametrize("n,c", [(3, 64), (5, 96)])
def test_rms_norm_partials_interpreted(splits: int, n: int, c: int) -> None:
    _norm_partials_case(splits, n, c, torch.float32, "cpu", 1e-5)


@interpret
def test_rms_norm_partials_checks_shapes() -> None:
    from hotloop.kernels.rms_norm import rms_norm_partials

    parts = torch.randn(2, 4, 64)
    w = torch.ones(64)
    with pytest.raises(ValueError, match="float32"):
        rms_norm_partials(parts.half(), w, 1e-5, torch.zeros(4, 64))
    with pytest.raises(ValueError, match="residual"):
        rms_norm_partials(parts, w, 1e-5, torch.zeros(5, 64))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 7, 100, 256])
@pytest.mark.parametrize("n,k", [(4096, 4096), (1024, 14336), (6144, 4096), (2048, 4096)])
def test_tiled_gemm_gpu(m: int, n: int, k: int, dtype: torch.dtype) -> None:
    from hotloop.kernels.tiled_gemm import TiledConfig

    for cfg in (
        TiledConfig(128, 64, 64, num_warps=4, num_stages=4),
        TiledConfig(64, 128, 64, num_warps=4, num_stages=3),
    ):
        _check_modes(m, n, k, dtype, "cuda", cfg, TOL[dtype] / 4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("splits", [1, 2, 4])
def test_rms_norm_partials_gpu(splits: int, dtype: torch.dtype) -> None:
    _norm_partials_case(splits, 256, 4096, dtype, "cuda", TOL[dtype] / 4)
