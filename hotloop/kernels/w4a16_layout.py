"""The AutoAWQ "GEMM" int4 layout: how 4-bit weights and zero points are packed into int32.

For a linear layer ``y = x @ W`` with ``W`` of shape ``[in, out]`` (the transpose of torch's
``[out, in]``) quantized per group of ``group_size`` input rows:

- ``qweight`` int32 ``[in, out // 8]``: word ``c`` of a row holds output columns ``8c .. 8c+7``;
- ``qzeros``  int32 ``[in // group_size, out // 8]``: the zero points, packed the same way;
- ``scales``  fp16  ``[in // group_size, out]``.

Inside a word the eight 4-bit values are interleaved: nibble ``i`` (bits ``4i .. 4i+3``) holds
column ``AWQ_PACK_ORDER[i]`` of the eight, so column ``j`` sits in nibble ``AWQ_NIBBLE_OF_COLUMN[j]``.
``W[k, n] = (q[k, n] - z[k // group_size, n]) * s[k // group_size, n]``.
"""

from __future__ import annotations

import torch

PACK_FACTOR = 8  # 4-bit values per int32
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_NIBBLE_OF_COLUMN = (0, 4, 1, 5, 2, 6, 3, 7)  # the inverse permutation of AWQ_PACK_ORDER


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """Integers in [0, 15] ``[R, C]`` (C a multiple of 8) -> int32 ``[R, C // 8]`` in AWQ order."""
    if values.dim() != 2 or values.shape[1] % PACK_FACTOR:
        raise ValueError(f"pack_int4 needs [R, C] with C a multiple of 8; got {tuple(values.shape)}")
    v = values.to(torch.int64).view(values.shape[0], -1, PACK_FACTOR)  # [R, C/8, 8]
    v = v[:, :, list(AWQ_PACK_ORDER)]  # nibble i <- column AWQ_PACK_ORDER[i]
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=values.device)
    word = (v << shifts).sum(dim=-1)  # bits do not overlap, so the sum is an OR; in [0, 2^32)
    return torch.where(word >= 2**31, word - 2**32, word).to(torch.int32)  # the same bits as int32


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[R, C // 8]`` in AWQ order -> uint8 ``[R, C]`` with values in [0, 15]."""
    if packed.dtype != torch.int32 or packed.dim() != 2:
        raise ValueError(f"unpack_int4 needs a 2-D int32 tensor; got {packed.dtype} {tuple(packed.shape)}")
    nibble = torch.tensor(AWQ_NIBBLE_OF_COLUMN, dtype=torch.int32, device=packed.device) * 4
    v = (packed[:, :, None] >> nibble) & 0xF  # [R, C/8, 8], column j from its nibble
    return v.reshape(packed.shape[0], -1).to(torch.uint8)


def check_awq_shapes(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> None:
    """Raise ``ValueError`` naming the tensor whose shape does not fit the layout."""
    k, n8 = qweight.shape
    n = n8 * PACK_FACTOR
    if group_size <= 0 or k % group_size:
        raise ValueError(f"group_size={group_size} must divide in_features={k}")
    groups = k // group_size
    if tuple(qzeros.shape) != (groups, n8):
        raise ValueError(f"qzeros shape {tuple(qzeros.shape)} != expected {(groups, n8)}")
    if tuple(scales.shape) != (groups, n):
        raise ValueError(f"scales shape {tuple(scales.shape)} != expected {(groups, n)}")
