"""The Triton W4A16 GEMM against dequantize-then-matmul in float32 (``kernels/reference.py``).

Without a GPU the kernel runs under ``TRITON_INTERPRET=1`` at tiny sizes; on a GPU at real layer
shapes over M in {1, 7, 16, 64, 256, 2048}.
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

import pytest
import torch

from hotloop.kernels import reference
from hotloop.kernels.w4a16_layout import pack_int4

pytest.importorskip("triton")

M_VALUES = (1, 7, 16, 64, 256, 2048)
# (in, out) of Llama-3-8B's qkv, o, gate_up and down projections
LAYER_SHAPES = ((4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096))


def _random_awq(k: int, n: int, group: int, dtype: torch.dtype, device: str, seed: int = 0):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    qweight = pack_int4(torch.randint(0, 16, (k, n), generator=gen)).to(device)
    qzeros = pack_int4(torch.randint(0, 16, (k // group, n), generator=gen)).to(device)
    scales = (torch.rand(k // group, n, generator=gen) * 0.02 + 0.001).to(device=device, dtype=dtype)
    return qweight, qzeros, scales


@pytest.fixture(scope="module")
def interpreted() -> ModuleType:
    """The kernel module compiled for Triton's CPU interpreter (the env var is read at decoration)."""
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        name = "hotloop.kernels.w4a16_gemm"
        module = importlib.reload(sys.modules[name]) if name in sys.modules else importlib.import_module(name)
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
    yield module
    if torch.cuda.is_available():
        importlib.reload(module)  # leave a compiled kernel for later GPU tests


@pytest.mark.parametrize("path", ["splitk", "tiled"])
@pytest.mark.parametrize("m", [1, 7, 16, 33])
@pytest.mark.parametrize("group", [32, 64])
def test_interpreted_kernel_matches_reference(interpreted: ModuleType, path: str, m: int, group: int) -> None:
    k, n = 256, 80  # n not a multiple of the tile: masked columns
    qweight, qzeros, scales = _random_awq(k, n, group, torch.float32, "cpu", seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + 1))
    got = interpreted.w4a16_gemm(x, qweight, qzeros, scales, group, path=path)
    want = reference.w4a16_matmul(x, qweight, qzeros, scales, group)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_interpreted_kernel_float16_and_batch_dims(interpreted: ModuleType) -> None:
    qweight, qzeros, scales = _random_awq(128, 64, 64, torch.float16, "cpu")
    x = torch.randn(2, 3, 128).half()
    got = interpreted.w4a16_gemm(x, qweight, qzeros, scales, 64)
    assert got.shape == (2, 3, 64) and got.dtype == torch.float16
    want = reference.w4a16_matmul(x.reshape(6, 128), qweight, qzeros, scales, 64).reshape(2, 3, 64)
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-2, atol=2e-2)


def test_launcher_rejects_bad_shapes(interpreted: ModuleType) -> None:
    qweight, qzeros, scales = _random_awq(128, 64, 64, torch.float32, "cpu")
    with pytest.raises(ValueError, match="input features"):
        interpreted.w4a16_gemm(torch.randn(2, 64), qweight, qzeros, scales, 64)
    with pytest.raises(ValueError, match="dtype"):
        interpreted.w4a16_gemm(torch.randn(2, 128).half(), qweight, qzeros, scales, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", LAYER_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("m", M_VALUES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gpu_kernel_matches_reference(shape: tuple[int, int], m: int, dtype: torch.dtype) -> None:
    from hotloop.kernels.w4a16_gemm import w4a16_gemm

    k, n = shape
    qweight, qzeros, scales = _random_awq(k, n, 128, dtype, "cuda", seed=m)
    x = torch.randn(m, k, device="cuda", generator=torch.Generator("cuda").manual_seed(m)).to(dtype)
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
    for path in ("auto", "splitk", "tiled"):
        got = w4a16_gemm(x, qweight, qzeros, scales, 128, path=path).float()
        # 16-bit inputs and dequantized weights, float32 accumulation
        err = (got - want).abs().max() / want.abs().max()
        assert err < 2e-2, (path, float(err))


@pytest.mark.parametrize("m", [1, 20])
def test_interpreted_kernel_expanded_word_loads(interpreted: ModuleType, m: int) -> None:
    k, n, group = 128, 80, 32
    qweight, qzeros, scales = _random_awq(k, n, group, torch.float32, "cpu", seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    for split in (1, 2):
        cfg = interpreted.GemmConfig(16, 32, 32, split, 4, 2, expand_words=True)
        got = interpreted.w4a16_gemm(x, qweight, qzeros, scales, group, config=cfg)
        torch.testing.assert_close(
            got, reference.w4a16_matmul(x, qweight, qzeros, scales, group), rtol=1e-4, atol=1e-4
        )


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 64, 2048])
def test_gpu_kernel_expanded_word_loads(m: int) -> None:
    import dataclasses

    from hotloop.kernels.w4a16_gemm import choose_config, w4a16_gemm

    k, n = 4096, 6144
    qweight, qzeros, scales = _random_awq(k, n, 128, torch.bfloat16, "cuda", seed=m)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    cfg = dataclasses.replace(choose_config(m, n, k, 128, x.device), expand_words=True)
    got = w4a16_gemm(x, qweight, qzeros, scales, 128, config=cfg).float()
    want = reference.w4a16_matmul(x.float(), qweight, qzeros, scales.float(), 128)
    assert (got - want).abs().max() / want.abs().max() < 2e-2
