"""Dequantize an AutoAWQ GEMM int4 weight to a dense ``[in, out]`` matrix in one Triton launch.

The W4A16 GEMM's ``dequant`` launch (``kernels/w4a16_gemm.py``) uses it for large M: dequantize the
layer's weight into a scratch matrix, then one ``torch.matmul`` (cuBLAS). At prefill sizes that is
faster than dequantizing in registers inside a Triton dot kernel: the dequantization costs one pass
over the weight (0.5 byte read and 2 bytes written per weight), and the product then runs at
cuBLAS's rate. The tuner times it against the in-register launches and keeps whichever is faster
per shape and M bucket, so it is used only where it wins.

Each program loads a ``[BLOCK_K, BLOCK_W]`` tile of packed words (contiguous rows: vector loads),
its group's zero-point words and scales once, unpacks the eight columns of every word in registers
(column ``j`` of a word is nibble ``AWQ_NIBBLE_OF_COLUMN[j] = j // 2 + 4 * (j % 2)``,
``kernels/w4a16_layout.py``) and stores the ``[BLOCK_K, 8 * BLOCK_W]`` output tile row-major. A
first version that loaded every column's word separately (8 loads of each word, 3 loads per output
value) ran at about 0.5 TB/s on an H200 (about 555 us for the 4096 x 28672 gate/up weight, derived
as dequant + cuBLAS less cuBLAS); this one at about 3.1 TB/s (95 us) the same way. The value is
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
    BLOCK_K: tl.constexpr,  # divides GROUP: a tile's rows share one group's zeros and scales
    BLOCK_W: tl.constexpr,  # packed words per row of a tile (8 columns each)
):
    pid_k = tl.program_id(0)
    pid_w = tl.program_id(1)
    n8 = N // 8
    offs_k = tl.arange(0, BLOCK_K)
    offs_w = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    mask_w = offs_w < n8
    k0 = pid_k * BLOCK_K
    group = k0 // GROUP
    # whole words, contiguous along the row: vector loads
    w = tl.load(
        qw_ptr + k0.to(tl.int64) * n8 + offs_k[:, None] * n8 + offs_w[None, :], mask=mask_w[None, :], other=0
    )
    z = tl.load(qz_ptr + group.to(tl.int64) * n8 + offs_w, mask=mask_w, other=0)
    # column j of a word sits in nibble j // 2 + 4 * (j % 2): shifts 0, 16, 4, 20, 8, 24, 12, 28
    j = tl.arange(0, 8)
    shift = (j // 2 + 4 * (j % 2)) * 4
    q = (w[:, :, None] >> shift[None, None, :]) & 0xF  # [BLOCK_K, BLOCK_W, 8]
    zq = (z[:, None] >> shift[None, :]) & 0xF  # [BLOCK_W, 8]
    offs_n = offs_w[:, None] * 8 + j[None, :]  # [BLOCK_W, 8]
    mask_n = offs_n < N
    s = tl.load(s_ptr + group.to(tl.int64) * N + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    val = (q - zq[None, :, :]).to(tl.float32) * s[None, :, :]
    dst = out_ptr + k0.to(tl.int64) * N + offs_k[:, None, None] * N + offs_n[None, :, :]
    tl.store(dst, val.to(out_ptr.dtype.element_ty), mask=mask_n[None, :, :])


BLOCK_K = 16
BLOCK_W = 32  # 256 columns


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
    elif (
        out.shape != (k, n)
        or out.dtype != scales.dtype
        or not out.is_contiguous()
        or out.device != scales.device
    ):
        raise ValueError(
            f"w4a16_dequantize: out must be a contiguous [{k}, {n}] {scales.dtype} tensor on {scales.device}; "
            f"got {tuple(out.shape)} {out.dtype} on {out.device}"
        )
    block_k = min(BLOCK_K, group_size & -group_size)  # a power of two that divides the group
    grid = (k // block_k, cdiv(n // PACK_FACTOR, BLOCK_W))
    _w4a16_dequant_kernel[grid](
        qweight, qzeros, scales, out, k, n, GROUP=group_size, BLOCK_K=block_k, BLOCK_W=BLOCK_W, num_warps=4
    )
    return out
