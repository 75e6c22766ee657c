"""kernels/w4a16_dequant.py against ``reference.w4a16_dequantize``: bit-exact on the GPU, since both
round ``(q - z) * s`` once to the scales' dtype (the CPU interpreter differs for bfloat16, see below)."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
import torch
from kernel_checks import random_awq

from hotloop.kernels import reference

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def interpreted() -> Iterator[ModuleType]:
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    name = "hotloop.kernels.w4a16_dequant"
    try:
        module = importlib.reload(sys.modules[name]) if name in sys.modules else importlib.import_module(name)
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
    yield module
    if torch.cuda.is_available():
        importlib.reload(module)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"]
)
@pytest.mark.parametrize(("k", "n", "group"), [(64, 8, 32), (128, 264, 64), (96, 512, 32), (72, 16, 24)])
def test_interpreted_matches_reference_exactly(
    interpreted: ModuleType, dtype: torch.dtype, k: int, n: int, group: int
) -> None:
    # n = 8: one word (a mostly masked tile); n = 264: a full 256-column tile and a masked one;
    # group 24: 8-row K tiles (the largest power of two dividing the group)
    qweight, qzeros, scales = random_awq(k, n, group, dtype, "cpu", seed=k + n)
    got = interpreted.w4a16_dequantize(qweight, qzeros, scales, group)
    want = reference.w4a16_dequantize(qweight, qzeros, scales, group)
    assert got.dtype == dtype and got.shape == (k, n)
    if dtype == torch.bfloat16:
        # Triton's interpreter truncates float32 -> bfloat16 (the GPU rounds to nearest even, and the
        # GPU test below is exact): at most one bf16 ulp apart
        torch.testing.assert_close(got, want, rtol=2**-7, atol=0.0)
    else:
        assert torch.equal(got, want)


def test_interpreted_writes_into_out_and_checks_it(interpreted: ModuleType) -> None:
    qweight, qzeros, scales = random_awq(64, 16, 32, torch.float16, "cpu")
    out = torch.full((64, 16), float("nan"), dtype=torch.float16)
    assert interpreted.w4a16_dequantize(qweight, qzeros, scales, 32, out=out) is out
    assert torch.equal(out, reference.w4a16_dequantize(qweight, qzeros, scales, 32))
    with pytest.raises(ValueError, match=r"out must be a contiguous \[64, 16\] torch.float16 tensor on cpu"):
        interpreted.w4a16_dequantize(qweight, qzeros, scales, 32, out=torch.empty(64, 16))
    with pytest.raises(ValueError, match="contiguous"):
        interpreted.w4a16_dequantize(qweight, qzeros, scales.t().contiguous().t(), 32)
    with pytest.raises(ValueError):
        interpreted.w4a16_dequantize(qweight, qzeros, scales, 64)  # the group does not match qzeros


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(("k", "n"), [(4096, 6144), (4096, 28672), (14336, 4096)])
def test_gpu_matches_reference_exactly(dtype: torch.dtype, k: int, n: int) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from hotloop.kernels.w4a16_dequant import w4a16_dequantize

    qweight, qzeros, scales = random_awq(k, n, 128, dtype, "cuda", seed=k)
    assert torch.equal(
        w4a16_dequantize(qweight, qzeros, scales, 128),
        reference.w4a16_dequantize(qweight, qzeros, scales, 128),
    )
