"""The Triton W4A16 GEMM/GEMV against dequantize-then-matmul in float32 (``kernels/reference.py``).

Without a GPU the kernels run under ``TRITON_INTERPRET=1`` at tiny sizes (every path and every
launch variant: unpack modes, swapped operands, split-K with the in-kernel fixup or the two-kernel
reduction, unaligned views); on a GPU at the real Llama-3-8B layer shapes over M in
{1, 7, 16, 64, 256, 2048}, both 16-bit dtypes, every launch the tuner may pick, the tuner itself,
determinism of split-K and launches inside CUDA graphs.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import os
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch
from kernel_checks import random_awq

from hotloop.kernels import reference
from hotloop.kernels.w4a16_layout import pack_int4, unpack_int4

pytest.importorskip("triton")

M_VALUES = (1, 7, 16, 64, 256, 2048)
# (in, out) of Llama-3-8B's qkv, o, gate_up and down projections
LAYER_SHAPES = ((4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096))
MODULES = ("hotloop.kernels.w4a16_gemm", "hotloop.kernels.w4a16_gemv", "hotloop.kernels.w4a16_dequant")


def _rel_max_err(got: torch.Tensor, want: torch.Tensor) -> float:
    assert not torch.isnan(got).any(), "NaN in the kernel output"
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


@pytest.fixture(scope="module")
def interpreted() -> Iterator[ModuleType]:
    """The kernel modules compiled for Triton's CPU interpreter (the env var is read at decoration)."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        modules = [
            importlib.reload(sys.modules[name]) if name in sys.modules else importlib.import_module(name)
            for name in MODULES
        ]
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
    yield modules[0]
    if torch.cuda.is_available():
        for module in modules:
            importlib.reload(module)  # leave compiled kernels for later GPU tests


@pytest.mark.parametrize("path", ["auto", "gemv", "splitk", "tiled", "dequant"])
@pytest.mark.parametrize("m", [1, 3, 7, 16, 33])
@pytest.mark.parametrize("group", [32, 64])
def test_interpreted_paths_match_reference(interpreted: ModuleType, path: str, m: int, group: int) -> None:
    if path == "gemv" and m > interpreted.GEMV_MAX_M:
        pytest.skip("the gemv path takes at most GEMV_MAX_M rows")
    k, n = 256, 80  # n not a multiple of any tile: masked columns
    qweight, qzeros, scales = random_awq(k, n, group, torch.float32, "cpu", seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + 1))
    got = interpreted.w4a16_gemm(x, qweight, qzeros, scales, group, path=path)
    want = reference.w4a16_matmul(x, qweight, qzeros, scales, group)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# (unpack, swap_ab): every way the dot kernel can treat a tile
DOT_VARIANTS = list(itertools.product(("nibble", "pair", "lop3"), (False, True)))


@pytest.mark.parametrize("variant", DOT_VARIANTS, ids=lambda v: "-".join(map(str, v)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_interpreted_dot_variants(interpreted: ModuleType, variant: tuple, dtype: torch.dtype) -> None:
    unpack, swap = variant
    k, n, group = 256, 80, 64
    qweight, qzeros, scales = random_awq(k, n, group, dtype, "cpu", seed=3)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(4)).to(dtype)
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), group)
    for block_m, block_n, split, fixup in ((16, 64, 1, True), (16, 32, 2, True), (32, 64, 4, False)):
        cfg = interpreted.GemmConfig(
            "dot", block_m, block_n, 32, split, unpack=unpack, swap_ab=swap, fixup=fixup
        )
        got = interpreted.w4a16_gemm(x, qweight, qzeros, scales, group, config=cfg)
        assert got.dtype == dtype
        assert _rel_max_err(got, want) < (1e-5 if dtype == torch.float32 else 2e-3), cfg


def test_interpreted_unaligned_inputs(interpreted: ModuleType) -> None:
    """Views that start at an odd element (the kernels read 16-bit values as 32-bit words)."""
    k, n, group = 128, 64, 32
    qweight, qzeros, scales = random_awq(k, n, group, torch.float16, "cpu", seed=5)
    big_scales = torch.cat([torch.zeros(1, dtype=torch.float16), scales.flatten()])
    scales_view = big_scales[1:].view_as(scales)
    x = torch.randn(3, k + 1).half()[:, 1:]
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), group)
    for path in ("gemv", "splitk", "tiled"):
        got = interpreted.w4a16_gemm(x, qweight, qzeros, scales_view, group, path=path)
        assert _rel_max_err(got, want) < 2e-3, path


@pytest.mark.parametrize("m", [1, 2, 4])
def test_interpreted_gemv_splits(interpreted: ModuleType, m: int) -> None:
    k, n, group = 256, 72, 32
    qweight, qzeros, scales = random_awq(k, n, group, torch.float32, "cpu", seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    want = reference.w4a16_matmul(x, qweight, qzeros, scales, group)
    for block_n, block_k, split, fixup in ((64, 32, 1, True), (32, 32, 4, True), (64, 16, 2, False)):
        cfg = interpreted.GemmConfig("gemv", m, block_n, block_k, split, fixup=fixup)
        got = interpreted.w4a16_gemm(x, qweight, qzeros, scales, group, config=cfg)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_interpreted_gemv_mask(interpreted: ModuleType, dtype: torch.dtype) -> None:
    # the one-row GEMV that masks nibbles in place: whole and partial column tiles, split K with
    # the in-kernel fixup and with the two-kernel reduction
    k, n, group = 256, 72, 32
    qweight, qzeros, scales = random_awq(k, n, group, dtype, "cpu", seed=5)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(5)).to(dtype)
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), group)
    for block_n, block_k, split, fixup in ((64, 32, 1, True), (32, 32, 4, True), (64, 16, 2, False)):
        cfg = interpreted.GemmConfig("gemv", 1, block_n, block_k, split, fixup=fixup, unpack="mask")
        got = interpreted.w4a16_gemm(x, qweight, qzeros, scales, group, config=cfg)
        tol = 1e-4 if dtype == torch.float32 else 2e-3 if dtype == torch.float16 else 1e-2
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    with pytest.raises(ValueError, match="one-row gemv"):
        interpreted.GemmConfig("gemv", 2, 64, 32, unpack="mask")
    assert any(t.unpack == "mask" for t, _ in interpreted.candidates(1))
    assert not any(t.unpack == "mask" for t, _ in interpreted.candidates(2))


def _half2_emulated(x: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                    group: int, rows: int) -> torch.Tensor:  # fmt: skip
    """The ``half2`` GEMV's arithmetic in torch, float32: per column a 16-bit partial sum over each
    ``rows`` consecutive k rows (``d = (q - z) / D`` exact, then ``p = round16(d x + p)`` row by row,
    D = 16 for fp16, 1 for bf16), then float32 ``sum p * scale * D``."""
    dtype = x.dtype
    q = unpack_int4(qweight).int()
    z = unpack_int4(qzeros).int().repeat_interleave(group, 0)
    scale_d = 16.0 if dtype == torch.float16 else 1.0
    d = ((q - z).float() / scale_d).to(dtype)
    xs = x.reshape(-1).float()
    p = torch.zeros(q.shape[0] // rows, q.shape[1], dtype=dtype, device=x.device)
    for r in range(rows):  # the product of two 16-bit values is exact in float32
        p = (d[r::rows].float() * xs[r::rows, None] + p.float()).to(dtype)
    s = scales.float().repeat_interleave(group // rows, 0)
    return (p.float() * s).sum(0, keepdim=True) * scale_d


def _assert_rounds_like(got: torch.Tensor, emulated: torch.Tensor, rel: float) -> None:
    """Every output within ``rel`` of the emulation's value (plus 2^-16 of the largest, for the
    float32 sums taken in another order), element by element: a kernel that does not round its
    partial sums to 16 bits where the emulation does is off by far more on some column (the
    float32 ``mask`` kernel: 5.6e-2 fp16, 0.17 bf16, measured by a review)."""
    diff = (got.float() - emulated).abs()
    bound = emulated.abs() * rel + emulated.abs().max() * 2.0**-16
    assert bool((diff <= bound).all()), float((diff / emulated.abs().clamp_min(1e-30)).max())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_interpreted_gemv_half2(interpreted: ModuleType, dtype: torch.dtype) -> None:
    # the packed 16-bit GEMV's Triton emulation of its PTX (the same 16-bit roundings): whole and
    # partial column tiles, split K with the in-kernel fixup and with the two-kernel reduction; the
    # result equals a torch model of the arithmetic (to the output's rounding) and the reference
    k, n, group = 128, 72, 32
    qweight, qzeros, scales = random_awq(k, n, group, dtype, "cpu", seed=6)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(6)).to(dtype)
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), group)
    rows = interpreted.HALF2_ROWS[dtype]
    emulated = _half2_emulated(x, qweight, qzeros, scales, group, rows)
    for block_n, block_k, split, fixup in ((64, 32, 4, True), (32, 16, 2, False)):
        cfg = interpreted.GemmConfig("gemv", 1, block_n, block_k, split, fixup=fixup, unpack="half2")
        got = interpreted.w4a16_gemm(x, qweight, qzeros, scales, group, config=cfg)
        assert got.dtype == dtype
        # the output's one rounding: half an fp16 ulp; bf16 is truncated by the interpreter (one ulp)
        _assert_rounds_like(got, emulated, 2.0**-11 if dtype == torch.float16 else 2.0**-7)
        assert _rel_max_err(got, want) < (2e-3 if dtype == torch.float16 else 1e-2), cfg
    with pytest.raises(ValueError, match="one-row gemv"):
        interpreted.GemmConfig("gemv", 2, 64, 32, unpack="half2")
    cfg = interpreted.GemmConfig("gemv", 1, 64, 32, unpack="half2")
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        interpreted.w4a16_gemm(x.float(), qweight, qzeros, scales.float(), group, config=cfg)
    assert any(t.unpack == "half2" for t, _ in interpreted.candidates(1))
    assert not any(t.unpack == "half2" for t, _ in interpreted.candidates(2))


def test_half2_can_be_kept_out_of_the_tuner(monkeypatch: pytest.MonkeyPatch) -> None:
    from hotloop.kernels import w4a16_gemm as g

    tag = g.candidates_tag(1)
    monkeypatch.setenv(g.HALF2_ENV, "0")
    assert not any(t.unpack == "half2" for t, _ in g.candidates(1))
    assert any(t.unpack == "mask" for t, _ in g.candidates(1))
    assert g.candidates_tag(1) != tag  # a choice stored with half2 among the candidates is not reused


def _large_fp16_case(device: str):  # type: ignore[no-untyped-def]
    """Eight consecutive activations of 4000 against weights q - z = 15: each fp16 partial sum of
    eight rows reaches 8 * 4000 * 15 = 480,000 unscaled (past fp16's 65,504), 30,000 with the
    kernel's 1/16 headroom."""
    k, n, group = 128, 64, 32
    qweight = pack_int4(torch.full((k, n), 15, dtype=torch.int64)).to(device)
    qzeros = pack_int4(torch.zeros(k // group, n, dtype=torch.int64)).to(device)
    scales = torch.full((k // group, n), 1e-3, dtype=torch.float16, device=device)
    x = torch.zeros(1, k, dtype=torch.float16)
    x[0, 32:40] = 4000.0
    x[0, 64:] = torch.randn(64, generator=torch.Generator().manual_seed(1)).half()
    return x.to(device), qweight, qzeros, scales, group


def test_interpreted_cuda_choice_falls_back(interpreted: ModuleType) -> None:
    # a "cuda" launch (a tuned choice stored where the CUDA GEMV ran) where it cannot run -- here
    # the CPU, with no kernels loaded -- runs the Triton GEMV instead, and the result stays right
    k, n, group = 1024, 128, 128
    qweight, qzeros, scales = random_awq(k, n, group, torch.bfloat16, "cpu", seed=9)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    cfg = interpreted.GemmConfig("cuda", 1, 128, 16, num_warps=8, num_stages=1)
    got = interpreted.w4a16_gemm(x, qweight, qzeros, scales, group, config=cfg)
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), group)
    assert got.shape == (1, n) and _rel_max_err(got, want) < 1e-2


def test_interpreted_gemv_half2_fp16_headroom(interpreted: ModuleType) -> None:
    # the fp16 partial sums carry (q - z) / 16: large activations over eight rows stay finite
    x, qweight, qzeros, scales, group = _large_fp16_case("cpu")
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), group)
    cfg = interpreted.GemmConfig("gemv", 1, 64, 32, unpack="half2")
    got = interpreted.w4a16_gemm(x, qweight, qzeros, scales, group, config=cfg)
    assert torch.isfinite(got).all()
    assert _rel_max_err(got, want) < 2e-3


def test_interpreted_gemv_half2_block_k_rules(interpreted: ModuleType) -> None:
    # K steps of a power of two of 8-row chunks: one chunk (block_k 8) runs, six (48) is refused
    qweight, qzeros, scales = random_awq(64, 64, 32, torch.float16, "cpu", seed=9)
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(9)).half()
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 32)
    got = interpreted.w4a16_gemm(
        x, qweight, qzeros, scales, 32, config=interpreted.GemmConfig("gemv", 1, 64, 8, unpack="half2")
    )
    assert _rel_max_err(got, want) < 2e-3
    qweight, qzeros, scales = random_awq(96, 64, 48, torch.float16, "cpu", seed=9)  # 48 tiles K = 96
    bad = interpreted.GemmConfig("gemv", 1, 64, 48, unpack="half2")
    with pytest.raises(ValueError, match="power of two"):
        interpreted.w4a16_gemm(torch.ones(1, 96).half(), qweight, qzeros, scales, 48, config=bad)


def test_interpreted_kernel_float16_and_batch_dims(interpreted: ModuleType) -> None:
    qweight, qzeros, scales = random_awq(128, 64, 64, torch.float16, "cpu")
    x = torch.randn(2, 3, 128).half()
    for path in ("auto", "gemv", "splitk", "tiled"):
        xp = x[:1, :2] if path == "gemv" else x
        got = interpreted.w4a16_gemm(xp, qweight, qzeros, scales, 64, path=path)
        assert got.shape == (*xp.shape[:-1], 64) and got.dtype == torch.float16
        want = reference.w4a16_matmul(xp.reshape(-1, 128), qweight, qzeros, scales, 64).reshape(got.shape)
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=2e-2)


def test_interpreted_dequant_falls_back_when_out_of_memory(
    interpreted: ModuleType, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No memory for the dequant launch's scratch weight: the tiled kernel answers, with a warning."""
    dequant = sys.modules["hotloop.kernels.w4a16_dequant"]

    def no_memory(*args: object, **kwargs: object) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(dequant, "w4a16_dequantize", no_memory)
    monkeypatch.setattr(interpreted, "_dequant_oom_warned", False)
    qweight, qzeros, scales = random_awq(128, 64, 64, torch.float32, "cpu")
    x = torch.randn(70, 128)
    # the handler goes on the module's logger itself: the CLI's log setup may stop propagation
    interpreted.logger.addHandler(caplog.handler)
    try:
        with caplog.at_level("WARNING", logger=interpreted.__name__):
            got = interpreted.w4a16_gemm(x, qweight, qzeros, scales, 64, path="dequant")
    finally:
        interpreted.logger.removeHandler(caplog.handler)
    torch.testing.assert_close(
        got, reference.w4a16_matmul(x, qweight, qzeros, scales, 64), rtol=1e-4, atol=1e-4
    )
    assert "tiled kernel" in caplog.text and "--cache-max-entry-count" in caplog.text


def test_launcher_rejects_bad_shapes(interpreted: ModuleType) -> None:
    qweight, qzeros, scales = random_awq(128, 64, 64, torch.float32, "cpu")
    with pytest.raises(ValueError, match="input features"):
        interpreted.w4a16_gemm(torch.randn(2, 64), qweight, qzeros, scales, 64)
    with pytest.raises(ValueError, match="dtype"):
        interpreted.w4a16_gemm(torch.randn(2, 128).half(), qweight, qzeros, scales, 64)
    with pytest.raises(ValueError, match="gemv"):
        interpreted.w4a16_gemm(torch.randn(9, 128), qweight, qzeros, scales, 64, path="gemv")
    with pytest.raises(ValueError, match="path"):
        interpreted.w4a16_gemm(torch.randn(2, 128), qweight, qzeros, scales, 64, path="fast")
    assert interpreted.w4a16_gemm(torch.randn(0, 128), qweight, qzeros, scales, 64).shape == (0, 64)


def test_choose_config_per_m() -> None:
    from hotloop.kernels import w4a16_gemm as g

    cpu = torch.device("cpu")
    for m in (1, 2, 4, 7, 16, 32, 33, 64, 65, 256, 2048):
        for k, n in LAYER_SHAPES:
            cfg = g.choose_config(m, n, k, 128, cpu)
            want = "gemv" if m <= g.AUTO_GEMV_MAX_M else "splitk" if m <= g.AUTO_SPLITK_MAX_M else "tiled"
            assert cfg.kind == ("gemv" if want == "gemv" else "dot")
            assert 128 % cfg.block_k == 0 and k % (cfg.split_k * cfg.block_k) == 0
            if want == "tiled":
                assert cfg.split_k == 1
            for template, waves in g.candidates(m):  # every tuning candidate fits the layer
                c = g.fit_config(template, m, n, k, 128, cpu, waves)
                assert k % (c.split_k * c.block_k) == 0 and (c.kind != "gemv" or m <= g.GEMV_MAX_M)
            # dequantize-then-cuBLAS is timed only where M is large enough to pay for its pass
            assert any(t.kind == "dequant" for t, _ in g.candidates(m)) == (m > 64)
    assert g.choose_config(3, 4096, 4096, 32, cpu, path="gemv").block_k == 32  # block_k fits the group
    assert [g.m_bucket(m) for m in (1, 2, 3, 5, 16, 17, 1024, 1025)] == [1, 2, 4, 8, 16, 32, 1024, 1 << 62]
    with pytest.raises(ValueError, match="path"):
        g.choose_config(1, 64, 64, 64, cpu, path="nope")
    with pytest.raises(ValueError, match="kind"):
        g.GemmConfig("wgmma", 16, 64, 64)


def test_plan_on_cpu_is_static() -> None:
    from hotloop.kernels import w4a16_gemm as g

    qweight, qzeros, scales = random_awq(256, 64, 64, torch.float32, "cpu")
    x = torch.randn(3, 256)
    assert g.plan(x, qweight, qzeros, scales, 64) == g.choose_config(3, 64, 256, 64, x.device)
    assert g.plan(x, qweight, qzeros, scales, 64, path="tiled") == g.choose_config(
        3, 64, 256, 64, x.device, "tiled"
    )


@pytest.mark.gpu
@pytest.mark.parametrize("shape", LAYER_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", M_VALUES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_kernel_matches_reference(
    shape: tuple[int, int], m: int, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every path's static launch (``auto`` untuned here; the tuned one is tested below)."""
    from hotloop.kernels.w4a16_gemm import GEMV_MAX_M, TUNE_ENV, w4a16_gemm

    monkeypatch.setenv(TUNE_ENV, "0")

    k, n = shape
    qweight, qzeros, scales = random_awq(k, n, 128, dtype, "cuda", seed=m)
    x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m)).to(dtype)
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
    paths = ("auto", "splitk", "tiled", "dequant") + (("gemv",) if m <= GEMV_MAX_M else ())
    for path in paths:
        got = w4a16_gemm(x, qweight, qzeros, scales, 128, path=path)
        assert got.dtype == dtype and got.shape == (m, n)
        # 16-bit inputs and dequantized weights, float32 accumulation
        err = _rel_max_err(got, want)
        assert err < 2e-2, (path, err)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 16, 64, 256])
def test_gpu_every_candidate_and_variant(m: int) -> None:
    """Every launch the tuner may pick, and the unpack/operand variants, at one shape (odd N:
    masked column tiles)."""
    from hotloop.kernels import w4a16_gemm as g

    k, n = 4096, 6144 + 64
    dev = torch.device("cuda")
    qweight, qzeros, scales = random_awq(k, n, 128, torch.bfloat16, "cuda", seed=m)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
    templates = list(g.candidates(m)) + [(t, w) for entries in g.TUNED.values() for _, (t, w) in entries]
    templates += [
        (g.GemmConfig("dot", 16, 128, 128, unpack=u, swap_ab=s, fixup=f), 2.0)
        for u, s, f in [("pair", True, True), ("nibble", False, True), ("lop3", True, False)]
    ]
    for tpl, waves in templates:
        if tpl.kind == "gemv" and m > g.GEMV_MAX_M:
            continue
        if (
            tpl.kind in ("cuda", "cuda_tc") and n % tpl.block_n
        ):  # whole column tiles only (the tuner skips it)
            with pytest.raises(ValueError, match="does not tile"):
                g.fit_config(tpl, m, n, k, 128, dev, max(waves, 1.0))
            continue
        cfg = g.fit_config(tpl, m, n, k, 128, dev, max(waves, 1.0))
        got = g.w4a16_gemm(x, qweight, qzeros, scales, 128, config=cfg)
        assert _rel_max_err(got, want) < 2e-2, cfg


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4096, 6144), (14336, 4096)], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", [1, 7, 64, 300])
def test_gpu_auto_tuning(shape: tuple[int, int], m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` times its candidates once per bucket, keeps the fastest, and stays correct."""
    from hotloop.kernels import w4a16_gemm as g

    # Start from nothing tuned: another test of this process, or another worker through the shared
    # on-disk cache, may already have tuned this bucket (then nothing is timed and logged here).
    monkeypatch.setattr(g, "_plans", {})
    monkeypatch.setattr(g, "_tuned", {})
    monkeypatch.setattr(g, "_from_disk", lambda tkey: None)
    monkeypatch.setattr(g, "_to_disk", lambda tkey, cfg: None)
    k, n = shape
    qweight, qzeros, scales = random_awq(k, n, 128, torch.bfloat16, "cuda", seed=m)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    got = g.w4a16_gemm(x, qweight, qzeros, scales, 128)
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
    assert _rel_max_err(got, want) < 2e-2
    key = (torch.cuda.current_device(), torch.bfloat16, g.m_bucket(m), n, k, 128)
    timed = g.tuning_log[key]
    assert timed and all(t >= 0 for _, t in timed)
    assert g.plan(x, qweight, qzeros, scales, 128) in {c for c, _ in timed} | {
        dataclasses.replace(c, block_m=m) for c, _ in timed if c.kind == "gemv"
    }
    assert min(timed, key=lambda ct: ct[1])[0].kind == g.plan(x, qweight, qzeros, scales, 128).kind
    # the same bucket, another M: no new tuning, still correct
    x2 = torch.randn(g.m_bucket(m) if m < 300 else 257, k, device="cuda").to(torch.bfloat16)
    got2 = g.w4a16_gemm(x2, qweight, qzeros, scales, 128)
    assert _rel_max_err(got2, reference.w4a16_matmul(x2.float(), qweight, qzeros, scales.float(), 128)) < 2e-2
    assert g.tuning_log[key] is timed


@pytest.mark.gpu
def test_gpu_splitk_is_deterministic_and_leaves_counters_at_zero() -> None:
    from hotloop.kernels import counters
    from hotloop.kernels import w4a16_gemm as g

    k, n = 14336, 4096
    qweight, qzeros, scales = random_awq(k, n, 128, torch.bfloat16, "cuda")
    x = torch.randn(4, k, device="cuda").to(torch.bfloat16)
    for path in ("splitk", "gemv"):
        cfg = g.choose_config(4, n, k, 128, x.device, path=path)
        assert cfg.split_k > 1, cfg
        first = g.w4a16_gemm(x, qweight, qzeros, scales, 128, path=path)
        for _ in range(5):
            assert torch.equal(g.w4a16_gemm(x, qweight, qzeros, scales, 128, path=path), first), path
    torch.cuda.synchronize()
    assert int(counters.buffer(x.device, "w4a16_splitk").abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["splitk", "gemv", "auto", "dequant"])
def test_gpu_launch_inside_cuda_graph(path: str) -> None:
    from hotloop.kernels.w4a16_gemm import w4a16_gemm

    k, n = 4096, 4096
    m = 300 if path == "dequant" else 1
    qweight, qzeros, scales = random_awq(k, n, 128, torch.bfloat16, "cuda")
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    w4a16_gemm(x, qweight, qzeros, scales, 128, path=path)  # warm-up: tunes, compiles, makes the counters
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = w4a16_gemm(x, qweight, qzeros, scales, 128, path=path)
    for seed in range(3):
        x.copy_(torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)))
        graph.replay()
        want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
        assert _rel_max_err(out, want) < 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("shape", LAYER_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_gemv_half2(shape: tuple[int, int], dtype: torch.dtype) -> None:
    """The packed 16-bit GEMV (inline PTX) at the real layer shapes, M = 1, every tuner template and a
    forced split: against float32 dequantize-then-matmul with activations N(0, 1) plus outliers of
    20 to 50 (fp16 2e-3, bf16 1e-2 of max |y|, tighter than the other GPU tests' 2e-2: measured on
    an H200 4.2-8.2e-4 and 3.7-5.9e-3, see ``w4a16_gemm.HALF2_ROWS``), and against the torch model of
    its arithmetic (one output rounding apart: the PTX rounds where the emulation does)."""
    from hotloop.kernels import w4a16_gemm as g

    k, n = shape
    dev = torch.device("cuda")
    qweight, qzeros, scales = random_awq(k, n, 128, dtype, "cuda", seed=k + n)
    gen = torch.Generator("cuda").manual_seed(n)
    x = torch.randn(1, k, device="cuda", generator=gen)
    spikes = torch.randint(0, k, (8,), device="cuda", generator=gen)
    x[0, spikes] = (20 + 30 * torch.rand(8, device="cuda", generator=gen)) * torch.sign(
        torch.randn(8, device="cuda", generator=gen)
    )
    x = x.to(dtype)
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
    emulated = _half2_emulated(x, qweight, qzeros, scales, 128, g.HALF2_ROWS[dtype])
    tol = 2e-3 if dtype == torch.float16 else 1e-2
    ulp = 2.0**-11 if dtype == torch.float16 else 2.0**-8  # the output's rounding (to nearest)
    configs = [g.fit_config(t, 1, n, k, 128, dev, w) for t, w in g.GEMV_HALF2_TEMPLATES]
    configs.append(g.GemmConfig("gemv", 1, 256, 64, split_k=8, unpack="half2", fixup=False))
    for cfg in configs:
        got = g.w4a16_gemm(x, qweight, qzeros, scales, 128, config=cfg)
        assert got.dtype == dtype and got.shape == (1, n)
        assert _rel_max_err(got, want) < tol, (cfg, _rel_max_err(got, want))
        _assert_rounds_like(got, emulated, ulp)
    if dtype == torch.float16:  # the 1/16 headroom of the fp16 partial sums, in the PTX
        xl, qw, qz, sc, group = _large_fp16_case("cuda")
        big = g.w4a16_gemm(xl, qw, qz, sc, group, config=g.GemmConfig("gemv", 1, 64, 32, unpack="half2"))
        assert torch.isfinite(big).all()
        assert _rel_max_err(big, reference.w4a16_matmul(xl.float(), qw, qz, sc.float(), group)) < 2e-3


def test_tuned_launches_report_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a benchmark's JSON records of the tuner's choices (``bench/offline.py``)."""
    from hotloop.kernels import w4a16_gemm as g

    cfg = g.GemmConfig("cuda", 1, 128, 32, split_k=2, num_warps=4, num_stages=1)
    monkeypatch.setattr(g, "_tuned", {(0, torch.bfloat16, 1, 28672, 4096, 128): cfg})
    assert g.tuned_launches() == [
        {"dtype": "bfloat16", "m_bucket": 1, "n": 28672, "k": 4096, "group": 128, "kind": "cuda", "block_m": 1,
         "block_n": 128, "block_k": 32, "split_k": 2, "num_warps": 4, "unpack": "lop3"}
    ]  # fmt: skip
    monkeypatch.setattr(g, "_tuned", {})
    assert g.tuned_launches() == []


def test_bench_json_lists_w4a16_launches_only_after_a_w4a16_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from hotloop.bench import offline
    from hotloop.kernels import w4a16_gemm as g

    monkeypatch.setattr(g, "_tuned", {})
    assert offline._w4a16_launches() == []  # the kernels module is loaded (a W4A16 model ran)
    monkeypatch.delitem(sys.modules, "hotloop.kernels.w4a16_gemm")
    assert offline._w4a16_launches() is None  # a model without W4A16 weights: nothing imported it
