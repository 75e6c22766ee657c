"""What the CUDA C one-row W4A16 GEMVs share (``w4a16_cuda.py``, ``w4a16_gemv_tc.py``): the checks of
their operands and the output and split-K buffers of a launch.

Both take one row of 16-bit ``x`` and an AutoAWQ weight, every tensor contiguous and 16-byte aligned,
and split K across blocks whose float32 partials the last block of a column tile adds (an arrival
counter per tile, ``counters.py``).
"""

from __future__ import annotations

import torch

from hotloop.kernels import counters
from hotloop.kernels.w4a16_layout import check_awq_shapes

# the activation dtypes the one-row CUDA GEMVs take, as their kernel names spell them
DTYPE_TAGS: dict[torch.dtype, str] = {torch.bfloat16: "bf16", torch.float16: "f16"}


def check_operands(
    x2: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> tuple[int, int]:
    """``(K, N)`` of ``x2 [1, K] @ W``; raises ``ValueError`` naming the operand that is wrong."""
    check_awq_shapes(qweight, qzeros, scales, group_size)
    if x2.dim() != 2 or x2.shape[1] != qweight.shape[0]:
        raise ValueError(f"x must be [1, {qweight.shape[0]}]; got {tuple(x2.shape)}")
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise ValueError(f"qweight and qzeros must be int32; got {qweight.dtype}, {qzeros.dtype}")
    if len({t.device for t in (x2, qweight, qzeros, scales)}) != 1:
        raise ValueError("x, qweight, qzeros and scales must be on one device")
    if scales.dtype != x2.dtype:
        raise ValueError(f"scales dtype {scales.dtype} must equal x dtype {x2.dtype}")
    for name, t in (("x", x2), ("qweight", qweight), ("qzeros", qzeros), ("scales", scales)):
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"{name} must be contiguous and 16-byte aligned")
    return int(x2.shape[1]), int(qweight.shape[1]) * 8


def launch_buffers(
    x2: torch.Tensor, n: int, split: int, tiles: int, family: str, out: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(out, ws, cnt)`` for a launch over ``split`` slices of K and ``tiles`` column tiles: ``out``
    (made where None, else checked), the float32 partials and the zeroed counters of ``family``
    (both None without a split)."""
    if out is None:
        out = torch.empty(1, n, dtype=x2.dtype, device=x2.device)
    elif out.shape != (1, n) or out.dtype != x2.dtype or out.device != x2.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [1, {n}] {x2.dtype} tensor on {x2.device}")
    if split == 1:
        return out, None, None
    cnt = counters.counters(x2.device, family, tiles)
    if cnt is None:
        raise ValueError("no split-K counters (first use inside a CUDA-graph capture)")
    return out, torch.empty(split, n, dtype=torch.float32, device=x2.device), cnt
