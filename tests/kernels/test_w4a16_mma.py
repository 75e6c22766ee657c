"""The tensor-core W4A16 GEMV (``kernels/w4a16_mma.py``): its MMA layout (CPU, against a decode of
every nibble written here from the layout's description), its limits, and on the GPU every split
and row count against float32 dequantize-then-matmul."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import random_awq

from hotloop.kernels import counters, cuda_jit, reference, w4a16_mma
from hotloop.kernels.w4a16_layout import pack_int4

pytest.importorskip("triton")

LLAMA3_8B = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]  # (K, N) of qkv, o, gate/up, down


def _decode_word(word: int, lane: int) -> dict[tuple[int, int], int]:
    """(row, column) inside the 16 x 16 tile -> value, for one lane's word, from the module's
    description: nibble i and i + 4 are the low and high halves of A register i; register 0 holds
    rows 2t, 2t + 1 of column g, 1 the same rows of column g + 8, 2 and 3 rows 2t + 8, 2t + 9."""
    g, t = divmod(lane, 4)
    out = {}
    for reg in range(4):
        row = 2 * t + (8 if reg >= 2 else 0)
        col = g + (8 if reg % 2 else 0)
        out[(row, col)] = (word >> (4 * reg)) & 0xF
        out[(row + 1, col)] = (word >> (4 * (reg + 4))) & 0xF
    return out


def test_mma_layout_places_every_nibble() -> None:
    k, n = 128, 48
    values = torch.randint(0, 16, (k, n), generator=torch.Generator().manual_seed(0))
    qmma = w4a16_mma.mma_layout(pack_int4(values))
    assert qmma.shape == (n // 16, k // 64, 32, 4) and qmma.dtype == torch.int32
    seen = torch.zeros(k, n, dtype=torch.int32)
    for c in range(n // 16):
        for j in range(k // 64):
            for lane in range(32):
                for w in range(4):
                    word = int(qmma[c, j, lane, w]) & 0xFFFFFFFF
                    for (row, col), v in _decode_word(word, lane).items():
                        kk, nn = 64 * j + 16 * w + row, 16 * c + col
                        assert v == int(values[kk, nn]), (c, j, lane, w, row, col)
                        seen[kk, nn] += 1
    assert bool((seen == 1).all())  # every weight exactly once


def test_fits_and_refusals() -> None:
    bf16 = torch.bfloat16
    assert w4a16_mma.fits(1, 4096, 4096, 128, bf16, 4) is None
    assert "1-8 rows" in (w4a16_mma.fits(9, 4096, 4096, 128, bf16, 1) or "")
    assert "N=4000" in (w4a16_mma.fits(1, 4000, 4096, 128, bf16, 1) or "")
    assert "group_size=32" in (w4a16_mma.fits(1, 4096, 4096, 32, bf16, 1) or "")
    assert "K=4096 is not 16 slices" in (w4a16_mma.fits(1, 4096, 4096, 512, bf16, 16) or "")
    assert "no split 3" in (w4a16_mma.fits(1, 4096, 4096, 128, bf16, 3) or "")
    assert "float16 or bfloat16" in (w4a16_mma.fits(1, 4096, 4096, 128, torch.float32, 1) or "")
    # 8 rows of a whole 14336-row K in shared memory: 229 KB; in 8 slices: 29 KB
    assert "shared memory" in (w4a16_mma.fits(8, 4096, 14336, 128, bf16, 1) or "")
    assert w4a16_mma.fits(8, 4096, 14336, 128, bf16, 8) is None
    assert w4a16_mma.shared_bytes(1, 4096, 128, 2) == 4 * (1024 + 16 * 8) + 2 * 16 * 64
    with pytest.raises(ValueError, match="MMA layout needs"):
        w4a16_mma.mma_layout(torch.zeros(100, 8, dtype=torch.int32))
    qweight, qzeros, scales = random_awq(256, 128, 128, bf16, "cpu")
    qmma = w4a16_mma.mma_layout(qweight)
    with pytest.raises(ValueError, match="qmma must be"):
        w4a16_mma.gemv(torch.randn(1, 256, dtype=bf16), qweight, qzeros, scales, 128)
    with pytest.raises(ValueError, match="x must be"):
        w4a16_mma.gemv(torch.randn(1, 128, dtype=bf16), qmma, qzeros, scales, 128)
    with pytest.raises(ValueError, match="1-8 rows"):
        w4a16_mma.gemv(torch.randn(9, 256, dtype=bf16), qmma, qzeros, scales, 128)


def _require() -> None:
    if not w4a16_mma.available(torch.device("cuda")):
        pytest.skip("the CUDA kernels cannot be built here (no nvcc, or not Hopper)")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("shape", LLAMA3_8B + [(1024, 192)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_every_split_and_row_count(shape: tuple[int, int], dtype: torch.dtype) -> None:
    """Against float32 dequantize-then-matmul: the products (q - z) x are exact and summed in
    float32, so only the output's rounding remains (bound: 1 ulp of max |y|, outlier activation
    channels); a second launch gives
    the same bits; the split counters are zero after each launch."""
    _require()
    k, n = shape
    qweight, qzeros, scales = random_awq(k, n, 128, dtype, "cuda", seed=k + n)
    qmma = w4a16_mma.mma_layout(qweight)
    gen = torch.Generator("cuda").manual_seed(n)
    ulp = 2.0**-10 if dtype == torch.float16 else 2.0**-7
    for m in (1, 3, 8):
        x = torch.randn(m, k, device="cuda", generator=gen)
        x[:, torch.randint(0, k, (8,), device="cuda", generator=gen)] *= 40.0  # outlier channels
        x = x.to(dtype)
        want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
        for split in w4a16_mma.SPLITS:
            if w4a16_mma.fits(m, n, k, 128, dtype, split) is not None:
                continue
            got = w4a16_mma.gemv(x, qmma, qzeros, scales, 128, split)
            again = w4a16_mma.gemv(x, qmma, qzeros, scales, 128, split)
            assert torch.equal(got, again), (m, split)
            torch.cuda.synchronize()
            assert got.shape == (m, n) and got.dtype == dtype
            err = float((got.float() - want).abs().max() / want.abs().max())
            assert err < ulp, (m, split, err)
            if split > 1:
                assert int(counters.buffer(x.device, "w4a16_mma").abs().sum()) == 0


@pytest.mark.gpu
def test_gpu_strided_rows_and_graph_replay() -> None:
    """x as rows of a wider buffer (a q/k/v-like view) gives the contiguous result; a captured
    launch replays to the eager result with new activations."""
    _require()
    k, n = 4096, 4096
    qweight, qzeros, scales = random_awq(k, n, 128, torch.bfloat16, "cuda", seed=5)
    qmma = w4a16_mma.mma_layout(qweight)
    wide = torch.randn(4, 2 * k, device="cuda").to(torch.bfloat16)
    x = wide[:, :k]
    assert torch.equal(
        w4a16_mma.gemv(x, qmma, qzeros, scales, 128, 4),
        w4a16_mma.gemv(x.contiguous(), qmma, qzeros, scales, 128, 4),
    )
    x1 = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    out = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
    w4a16_mma.gemv(x1, qmma, qzeros, scales, 128, 4, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w4a16_mma.gemv(x1, qmma, qzeros, scales, 128, 4, out=out)
    x1.copy_(torch.randn(1, k, device="cuda").to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, w4a16_mma.gemv(x1, qmma, qzeros, scales, 128, 4))


@pytest.mark.skipif(cuda_jit.find_nvcc() is None, reason="needs nvcc")
def test_source_compiles_for_hopper(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("HOTLOOP_CACHE", str(tmp_path))
    cubin = cuda_jit.compile_cubin(cuda_jit.SOURCE_DIR / w4a16_mma.SOURCE, "sm_90a")
    assert b"w4a16_mma_bf16" in cubin and b"w4a16_mma_f16" in cubin
