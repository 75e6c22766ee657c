"""kernels/w4a16_cutlass_dequant.py: the CUTLASS layout back to a dense bf16 ``[N, K]`` weight (or its
``[K, N]`` transpose), against
the AutoAWQ values it was converted from (``signed_k_major`` + ``reorder_reference``, the layout's
torch model). Without a GPU the kernel runs under Triton's interpreter (tests/conftest.py), which
truncates float32 -> bfloat16 where the GPU rounds: one bf16 ulp of tolerance either way (the GPU's
fused multiply-add may round once where torch rounds twice)."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import random_awq

from hotloop.kernels import w4a16_cutlass
from hotloop.kernels.w4a16_cutlass_dequant import dequantize
from hotloop.kernels.w4a16_layout import unpack_int4

pytest.importorskip("triton")
gpu = pytest.mark.gpu


def _case(k: int, n: int, group: int, device: str, seed: int) -> tuple[torch.Tensor, ...]:
    qweight, qzeros, scales = random_awq(k, n, group, torch.bfloat16, "cpu", seed=seed)
    packed, zero = w4a16_cutlass.signed_k_major(qweight, qzeros, scales)
    w = w4a16_cutlass.reorder_reference(packed)
    zeros = zero.to(torch.bfloat16)
    q = unpack_int4(qweight).float() - 8  # [K, N]
    want = (q * scales.float().repeat_interleave(group, 0) + zeros.float().repeat_interleave(group, 0)).t()
    return w.to(device), scales.to(device), zeros.to(device), want.to(device)


@pytest.mark.parametrize(("k", "n", "group"), [(128, 64, 64), (256, 192, 128), (384, 128, 128)])
def test_matches_the_awq_values(k: int, n: int, group: int) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    w, scales, zeros, want = _case(k, n, group, device, seed=k + n)
    got = dequantize(w, scales, zeros, n, k, group)
    assert got.shape == (n, k) and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=2**-7, atol=1e-6)
    got_t = dequantize(w, scales, zeros, n, k, group, transpose=True)
    assert got_t.shape == (k, n) and got_t.is_contiguous()
    assert torch.equal(got_t, got.t())  # the same values, stored transposed


@pytest.mark.parametrize(
    ("row", "col", "nibble", "value"), [(37, 83, 0x5, 5.0), (0, 127, 0xD, -3.0), (63, 0, 0x8, -8.0)]
)
def test_one_nibble_lands_where_layout_offsets_says(row: int, col: int, nibble: int, value: float) -> None:
    # independent of reorder_reference: one value written at the layout's offset, scale 1, zero 0
    n, k, group = 64, 128, 64
    offset = int(w4a16_cutlass.layout_offsets(n, k)[row, col])
    w = torch.zeros(n * k // 2, dtype=torch.uint8)
    w[offset // 2] = nibble << (4 * (offset % 2))
    ones = torch.ones(k // group, n, dtype=torch.bfloat16)
    got = dequantize(w.view(n, k // 2), ones, torch.zeros_like(ones), n, k, group)
    want = torch.zeros(n, k)
    want[row, col] = value
    assert torch.equal(got.float(), want)
    got_t = dequantize(w.view(n, k // 2), ones, torch.zeros_like(ones), n, k, group, transpose=True)
    assert torch.equal(got_t.float(), want.t())  # [K, N]: the value at (col, row)


def test_writes_into_out_and_names_bad_shapes() -> None:
    w, scales, zeros, want = _case(128, 64, 64, "cpu", seed=7)
    out = torch.empty(64, 128, dtype=torch.bfloat16)
    assert dequantize(w, scales, zeros, 64, 128, 64, out=out) is out
    torch.testing.assert_close(out.float(), want, rtol=2**-7, atol=1e-6)
    with pytest.raises(ValueError, match="multiples of 64 \\(got N=96"):
        dequantize(w, scales, zeros, 96, 128, 64)
    with pytest.raises(ValueError, match="out must be contiguous bf16 \\[64, 128\\]"):
        dequantize(w, scales, zeros, 64, 128, 64, out=torch.empty(64, 128))
    out_t = torch.empty(128, 64, dtype=torch.bfloat16)
    assert dequantize(w, scales, zeros, 64, 128, 64, out=out_t, transpose=True) is out_t
    torch.testing.assert_close(out_t.float(), want.t(), rtol=2**-7, atol=1e-6)
    with pytest.raises(ValueError, match="out must be contiguous bf16 \\[128, 64\\]"):
        dequantize(w, scales, zeros, 64, 128, 64, out=out, transpose=True)  # [N, K] where [K, N] is due
    with pytest.raises(ValueError, match="scales must be contiguous bf16 \\[2, 64\\]"):
        dequantize(w, scales.float(), zeros, 64, 128, 64)


@gpu
def test_llama_gate_up_shape_on_the_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    w, scales, zeros, want = _case(4096, 28672, 128, "cuda", seed=1)
    got = dequantize(w, scales, zeros, 28672, 4096, 128)
    torch.testing.assert_close(got.float(), want, rtol=2**-7, atol=1e-6)
    assert torch.equal(dequantize(w, scales, zeros, 28672, 4096, 128, transpose=True), got.t())
