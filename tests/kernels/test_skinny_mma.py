"""The CUDA C skinny tensor-core GEMM (kernels/skinny_mma.py): limits on the CPU, every launch
against a float32 reference on the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hotloop.kernels import counters, cuda_jit, skinny_mma
from hotloop.kernels.skinny_mma import Choice

LLAMA3_8B = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]  # (N, K)


def test_fits_and_candidates() -> None:
    c = Choice(1, 1, 4, 4, 2)
    assert skinny_mma.fits(8, 4096, 4096, torch.bfloat16, c) is None
    assert "rows" in (skinny_mma.fits(9, 4096, 4096, torch.bfloat16, c) or "")
    assert "N=40" in (skinny_mma.fits(4, 40, 4096, torch.bfloat16, c) or "")
    assert "K=" in (skinny_mma.fits(4, 4096, 4096 + 64, torch.bfloat16, c) or "")
    assert "float16" in (skinny_mma.fits(4, 4096, 4096, torch.float32, c) or "")
    assert "no variant" in (skinny_mma.fits(4, 4096, 4096, torch.bfloat16, Choice(3, 1, 4, 4, 1)) or "")
    small = skinny_mma.candidates(4, 4096, 4096, torch.bfloat16)
    assert small and all(c.mt == 1 for c in small)
    big = skinny_mma.candidates(12, 4096, 14336, torch.bfloat16)
    assert big and all(c.mt == 2 and 14336 % (c.split * c.warps * 32 * c.u) == 0 for c in big)
    assert skinny_mma.kernel_name(torch.float16, 2, 1, 8, 4) == "skinny_mma_f16_m2_n1_u8_w4"


def test_linear_declines_off_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(skinny_mma.ENV, "1")
    x, w = torch.randn(4, 64), torch.randn(32, 64)
    assert skinny_mma.linear(x, w) is None
    monkeypatch.setenv(skinny_mma.ENV, "0")
    assert skinny_mma.linear(x, w) is None


@pytest.mark.skipif(cuda_jit.find_nvcc() is None, reason="needs nvcc")
def test_source_compiles_for_hopper(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOTLOOP_CACHE", str(tmp_path))
    cubin = cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / skinny_mma.SOURCE, "sm_90a")
    for name in skinny_mma._names():
        assert name.encode() in cubin


def _require() -> None:
    if not skinny_mma.available(torch.device("cuda")):
        pytest.skip("the CUDA kernels cannot be built here (no nvcc)")


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want).abs().max() / want.abs().max().clamp_min(1e-6))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m", [2, 5, 8, 9, 16])
def test_gpu_every_launch(m: int, dtype: torch.dtype) -> None:
    """Every variant and split that fits, with and without a bias, against float32 (bounds: one
    output rounding, 1e-2 of max |y| in bf16, 2e-3 in fp16); rows past M are never written; the
    split counters are all zero after each launch."""
    _require()
    gen = torch.Generator(device="cuda").manual_seed(m)
    n, k = 512, 4096
    x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).to(dtype)
    b = torch.randn(n, device="cuda", generator=gen).to(dtype)
    tol = 1e-2 if dtype == torch.bfloat16 else 2e-3
    ran = 0
    for c in skinny_mma.candidates(m, n, k, dtype):
        for bias in (None, b):
            want = x.float() @ w.float().t() + (0 if bias is None else bias.float())
            out = torch.full((m + 1, n), 7.0, dtype=dtype, device="cuda")
            got = skinny_mma.launch(x, w, bias, c, out=out[:m])
            torch.cuda.synchronize()
            assert _rel(got, want) < tol, (c, bias is None, _rel(got, want))
            assert torch.all(out[m] == 7.0)
            if c.split > 1:  # (the counters exist from the first split launch on)
                assert int(counters.buffer(x.device, skinny_mma.COUNTER_FAMILY).abs().sum()) == 0
            ran += 1
    assert ran >= 2 * 8


@pytest.mark.gpu
@pytest.mark.parametrize("shape", LLAMA3_8B, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_llama_shapes_and_graph(shape: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The Llama-3-8B projections at M = 3 and 16 through ``linear`` (tuned against cuBLAS),
    eagerly and replayed from a CUDA graph with new inputs."""
    _require()
    monkeypatch.setenv(skinny_mma.ENV, "1")
    monkeypatch.setenv("HOTLOOP_TUNING_CACHE", "0")
    n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(n + k)
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.02).bfloat16()
    for m in (3, 16):
        x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
        want = x.float() @ w.float().t()
        got = skinny_mma.linear(x, w)
        y = got if got is not None else torch.nn.functional.linear(x, w)
        assert _rel(y, want) < 1e-2
        for c in skinny_mma.candidates(m, n, k, torch.bfloat16)[:3]:
            assert _rel(skinny_mma.launch(x, w, None, c), want) < 1e-2
        c = skinny_mma.candidates(m, n, k, torch.bfloat16)[-1]  # the largest split
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        skinny_mma.launch(x, w, None, c, out=out)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            skinny_mma.launch(x, w, None, c, out=out)
        x.copy_(torch.randn(m, k, device="cuda", generator=gen).bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, skinny_mma.launch(x, w, None, c))
