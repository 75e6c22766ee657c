"""Dequantize an AutoAWQ GEMM int4 weight to a dense ``[in, out]`` matrix in one Triton launch.

The W4A16 GEMM's ``dequant`` launch (``kernels/w4a16_gemm.py``) uses it for large M: dequantize the
layer's weight into a scratch matrix, then one ``torch.matmul`` (cuBLAS). At prefill sizes that is
faster than dequantizing in registers inside a Triton dot kernel: the dequantization costs one pass
over the weight (0.5 byte read and 2 bytes written per weight), and the product then runs at
cuBLAS's rate. The tuner times it against the in-register launches and keeps whichever is faster
per shape and M bucket, so it is used only where it wins.

Each program writes a ``[BLOCK_K, BLOCK_N]`` tile of the output in row-major order (coalesced
stores); column ``n`` of a row comes from nibble ``AWQ_NIBBLE_OF_COLUMN[n % 8]`` of word ``n // 8``,
which is ``n % 8 // 2 + 4 * (n % 2)`` (``kernels/w4a16_layout.py``). The value is
``(q - z) * s`` with ``q - z`` exact and one rounding of the product to the scales' dtype, as
``reference.w4a16_dequantize`` computes it in that dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels.launch_math import cdiv
from hotloop.kernels.w4a16_layout import PACK_FACTOR, check_awq_shapes


@triton.jit
def _w4a16_dequant_kernel(
    qw_ptr,  # int32 [K, N / 8]
    qz_ptr,  # int32 [K / GROUP, N / 8]
    s_ptr,  # [K / GROUP, N]
    out_ptr,  # [K, N], the scales' dtype
    K,
    N,
    GROUP: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_k = offs_k < K
    mask_n = offs_n < N
    mask = mask_k[:, None] & mask_n[None, :]
    n8 = N // 8
    word = offs_n // 8
    col = offs_n % 8
    shift = (col // 2 + 4 * (col % 2)) * 4  # the nibble of column n % 8, in bits
    rows_k = offs_k.to(tl.int64)
    groups = (offs_k // GROUP).to(tl.int64)
    w = tl.load(qw_ptr + rows_k[:, None] * n8 + word[None, :], mask=mask, other=0)
    z = tl.load(qz_ptr + groups[:, None] * n8 + word[None, :], mask=mask, other=0)
    s = tl.load(s_ptr + groups[:, None] * N + offs_n[None, :], mask=mask, other=0.0)
    q = (w >> shift[None, :]) & 0xF
    zq = (z >> shift[None, :]) & 0xF
    val = (q - zq).to(tl.float32) * s.to(tl.float32)
    tl.store(out_ptr + rows_k[:, None] * N + offs_n[None, :], val.to(out_ptr.dtype.element_ty), mask=mask)


BLOCK_K = 32
BLOCK_N = 256


def w4a16_dequantize(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """AutoAWQ GEMM tensors -> ``W`` ``[in, out]`` in the scales' dtype (``out`` if given: a
    contiguous ``[in, out]`` tensor of that dtype on the same device)."""
    check_awq_shapes(qweight, qzeros, scales, group_size)
    for name, t in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
        if not t.is_contiguous():
            raise ValueError(f"w4a16_dequantize: {name} must be contiguous")
    k = qweight.shape[0]
    n = qweight.shape[1] * PACK_FACTOR
    if out is None:
        out = torch.empty(k, n, dtype=scales.dtype, device=scales.device)
    elif out.shape != (k, n) or out.dtype != scales.dtype or not out.is_contiguous():
        raise ValueError(
            f"w4a16_dequantize: out must be a contiguous [{k}, {n}] {scales.dtype} tensor; "
            f"got {tuple(out.shape)} {out.dtype}"
        )
    grid = (cdiv(k, BLOCK_K), cdiv(n, BLOCK_N))
    _w4a16_dequant_kernel[grid](
        qweight, qzeros, scales, out, k, n, GROUP=group_size, BLOCK_K=BLOCK_K, BLOCK_N=BLOCK_N, num_warps=4
    )
    return out
