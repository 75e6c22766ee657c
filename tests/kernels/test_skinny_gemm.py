"""The tensor-core GEMM for a few rows (``kernels/skinny_gemm.py``) against ``F.linear`` in float32."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_checks import TOL, interpret, rel_err

from hotloop.kernels import counters


def _operands(
    m: int, n: int, k: int, dtype: torch.dtype, device: str, bias: bool, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed * 1000 + m * 31 + n + k)
    x = (torch.randn(m, k, generator=gen) * 2).to(dtype).to(device)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).to(device)
    b = (torch.randn(n, generator=gen) * 0.5).to(dtype).to(device) if bias else None
    return x, w, b


def _err(m: int, n: int, k: int, dtype: torch.dtype, device: str, bias: bool, cfg: object) -> float:
    from hotloop.kernels.skinny_gemm import skinny_gemm

    x, w, b = _operands(m, n, k, dtype, device, bias)
    out = skinny_gemm(x, w, b, cfg)  # type: ignore[arg-type]
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())
    assert out.shape == (m, n) and out.dtype == dtype
    if counters._key(torch.device(device), "skinny_gemm") in counters._buffers:
        assert int(counters.buffer(torch.device(device), "skinny_gemm").abs().sum()) == 0, "counters left set"
    return rel_err(out, ref)


@interpret
@pytest.mark.parametrize("m", [1, 3, 16, 20])
@pytest.mark.parametrize("n,k", [(64, 64), (40, 96)])  # even tiles, and a masked column tile
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("split", [1, 2, 3])
def test_skinny_gemm_interpreted(m: int, n: int, k: int, bias: bool, split: int) -> None:
    from hotloop.kernels.skinny_gemm import SkinnyConfig, row_tile

    if k % (split * 16):
        pytest.skip("the split must tile K")
    cfg = SkinnyConfig(row_tile(m), 32, 16, split_k=split, num_warps=1, num_stages=1)
    assert _err(m, n, k, torch.float32, "cpu", bias, cfg) < 1e-5


@interpret
def test_skinny_gemm_split_is_deterministic() -> None:
    """The last split sums the partials in split order: two launches give the same bits."""
    from hotloop.kernels.skinny_gemm import SkinnyConfig, skinny_gemm

    x, w, b = _operands(5, 32, 128, torch.float32, "cpu", True)
    cfg = SkinnyConfig(16, 32, 16, split_k=4, num_warps=1, num_stages=1)
    assert torch.equal(skinny_gemm(x, w, b, cfg), skinny_gemm(x, w, b, cfg))


def test_fit_and_row_tile() -> None:
    from hotloop.kernels.skinny_gemm import MAX_M, SkinnyConfig, fit, row_tile

    assert [row_tile(m) for m in (1, 16, 17, 32, 33, 64)] == [16, 16, 32, 32, 64, 64]
    with pytest.raises(ValueError, match="1 to 64 rows"):
        row_tile(MAX_M + 1)
    # K step halved until it divides K; the split brings 48 column tiles up to 2 x 132 programs
    cfg = fit((128, 128, 4, 4, 2.0), 16, 6144, 4096, 132)
    assert cfg == SkinnyConfig(16, 128, 128, split_k=8, num_warps=4, num_stages=4)
    # SmolLM2's K = 576 is 9 steps of 64: split in 3 (4.5 would not be whole steps, 9 not two each)
    assert fit((64, 128, 4, 4, 2.0), 8, 960, 576, 132) == SkinnyConfig(16, 64, 64, 3, 4, 4)
    assert fit((64, 128, 4, 4, 2.0), 8, 960, 300, 132) is None  # K not a multiple of 16
    # a split keeps at least two K steps per program
    assert fit((32, 256, 4, 4, 64.0), 2, 64, 1024, 132).split_k == 2  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="power of two"):
        SkinnyConfig(16, 48, 64)


@interpret
def test_skinny_gemm_checks_arguments() -> None:
    from hotloop.kernels.skinny_gemm import SkinnyConfig, skinny_gemm

    cfg = SkinnyConfig(16, 32, 16)
    x, w = torch.randn(4, 32), torch.randn(8, 32)
    with pytest.raises(ValueError, match="K=16 input features"):
        skinny_gemm(torch.randn(4, 16), w, None, cfg)
    with pytest.raises(ValueError, match="17 rows"):
        skinny_gemm(torch.randn(17, 32), w, None, cfg)
    with pytest.raises(ValueError, match="weight dtype"):
        skinny_gemm(x, w.double(), None, cfg)
    with pytest.raises(ValueError, match="bias must be"):
        skinny_gemm(x, w, torch.randn(4), cfg)
    with pytest.raises(ValueError, match="bias dtype"):
        skinny_gemm(x, w, torch.randn(8, dtype=torch.float64), cfg)
    with pytest.raises(ValueError, match="block_k=16 steps per split of 3"):
        skinny_gemm(x, w, None, SkinnyConfig(16, 32, 16, split_k=3))


# an 8B q/k/v and down projection, SmolLM2's q/k/v (K = 576: 9 steps of 64), a masked column tile.
# (The kernel is not on the engine's path: a light grid keeps the GPU suite short.)
SHAPES = [(6144, 4096), (4096, 14336), (960, 576), (1000, 1536)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,k", SHAPES)
def test_skinny_gemm_templates_gpu(n: int, k: int, dtype: torch.dtype) -> None:
    """Every template the tuner may pick, at every row tile, with and without a bias."""
    from hotloop.kernels.skinny_gemm import TEMPLATES, fit

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for template in TEMPLATES:
        for m in (2, 17, 64):
            cfg = fit(template, m, n, k, sms)
            assert cfg is not None
            err = _err(m, n, k, dtype, "cuda", m % 2 == 1, cfg)
            assert err < TOL[dtype] / 4, (template, m, err)


@pytest.mark.gpu
def test_skinny_plan_tunes_and_matches_gpu() -> None:
    """``plan`` times the candidates once per bucket and keeps the fastest (a config, or None for
    cuBLAS); the chosen launch gives F.linear's result within a rounding."""
    from hotloop.kernels import skinny_gemm as sg

    for m in (2, 12, 24, 40):
        x, w, b = _operands(m, 6144, 4096, torch.bfloat16, "cuda", True, seed=3)
        cfg = sg.plan(x, w, b)
        y = F.linear(x, w, b) if cfg is None else sg.skinny_gemm(x, w, b, cfg)
        ref = F.linear(x.float(), w.float(), b.float())
        assert rel_err(y, ref) < TOL[torch.bfloat16] / 4
        key = (torch.cuda.current_device(), torch.bfloat16, sg.m_bucket(m), 6144, 4096)
        assert key in sg._tuned
        timed = sg.tuning_log.get(key)
        if timed is not None:  # timed in this process (not read from the disk cache)
            best = min(timed, key=lambda t: t[1])[0]
            assert sg._tuned[key] == best and timed[0][0] is None and len(timed) > 1
