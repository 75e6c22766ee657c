"""The tensor-core W4A16 GEMV for 1-8 rows (``kernels/cuda/w4a16_mma.cu``): its weight layout,
limits and launch.

``y = x @ W`` for ``x`` of 1-8 16-bit rows and ``W`` int4 with AutoAWQ zero points and scales. The
multiply-adds run on the tensor cores (``mma.sync`` m16n8k16, ``W^T`` as the A operand, ``x^T`` as
B): its inner loop spends about 12 instructions per 32-bit word of weights, the CUDA-core GEMV's
(``w4a16_cuda.py``) 21. It is tested and not used by the engine: faster in isolation on an H200,
not at batch 1 in the engine, and it needs its own copy of the weights (BENCHMARKS.md, sixteenth
session). The packed weights must first be put in the **MMA layout**
(:func:`mma_layout`): per 16-column tile and 64 rows of K, lane ``4g + t`` of a warp holds four
words, one per 16-row tile, and word ``i``'s nibbles ``i`` and ``i + 4`` are the two halves of its A
register ``i``:

- register 0: rows ``2t, 2t + 1`` of the tile, column ``g``;
- register 1: rows ``2t, 2t + 1``, column ``g + 8``;
- register 2: rows ``2t + 8, 2t + 9``, column ``g``;
- register 3: rows ``2t + 8, 2t + 9``, column ``g + 8``.

The same number of bytes as ``qweight``; ``qzeros`` and ``scales`` keep the AutoAWQ layout.
"""

from __future__ import annotations

import torch

from hotloop.kernels import counters, cuda_jit, w4a16_cuda
from hotloop.kernels.pdl import pdl
from hotloop.kernels.w4a16_layout import PACK_FACTOR, check_awq_shapes, unpack_int4

SOURCE = "w4a16_mma.cu"
THREADS = 128
COLUMNS = 64  # per block: 4 warps of 16 columns
MAX_ROWS = 8
SPLITS = (1, 2, 4, 8, 16)
_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}


def _nibble_sources() -> tuple[torch.Tensor, torch.Tensor]:
    """``(row, column)`` inside a 16 x 16 tile of lane ``L``'s nibble ``i``: two ``[32, 8]`` tables."""
    rows = torch.empty(32, 8, dtype=torch.long)
    cols = torch.empty(32, 8, dtype=torch.long)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for reg in range(4):
            row = 2 * t + (8 if reg >= 2 else 0)
            col = g + (8 if reg % 2 else 0)
            rows[lane, reg], cols[lane, reg] = row, col  # low half: the even row
            rows[lane, reg + 4], cols[lane, reg + 4] = row + 1, col  # high half: the odd row
    return rows, cols


def mma_layout(qweight: torch.Tensor) -> torch.Tensor:
    """AutoAWQ ``qweight [K, N/8]`` -> the MMA layout ``[N/16, K/64, 32, 4]`` int32 (same device)."""
    k, n8 = qweight.shape
    n = n8 * PACK_FACTOR
    if k % 64 or n % 16:
        raise ValueError(f"the MMA layout needs K a multiple of 64 and N of 16; got K={k}, N={n}")
    q = unpack_int4(qweight).to(torch.int32)  # [K, N]
    rows, cols = (t.to(qweight.device) for t in _nibble_sources())
    tiles = q.view(k // 64, 4, 16, n // 16, 16).permute(3, 0, 1, 2, 4)  # [N/16, K/64, 4, 16, 16]
    nibbles = tiles[:, :, :, rows, cols]  # [N/16, K/64, 4 (word), 32 (lane), 8 (nibble)]
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=qweight.device)
    words = (nibbles.to(torch.int64) << shifts).sum(dim=-1)  # no overlapping bits: the sum is an OR
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return words.permute(0, 1, 3, 2).contiguous()  # [N/16, K/64, 32, 4]


SHARED_LIMIT = 48 * 1024  # dynamic shared memory without the opt-in attribute


def shared_bytes(m: int, k: int, group_size: int, split: int) -> int:
    """A block's dynamic shared memory: its K slice of x (``m`` rows), zero points, scales."""
    kps = k // split
    groups = kps // group_size
    return 4 * (m * (kps // 2) + groups * 2 * (COLUMNS // 16)) + 2 * groups * COLUMNS


def fits(m: int, n: int, k: int, group_size: int, dtype: torch.dtype, split: int) -> str | None:
    """Why a launch with ``split`` K slices cannot run this product, or ``None`` when it can."""
    if not 1 <= m <= MAX_ROWS:
        return f"takes 1-{MAX_ROWS} rows; got {m}"
    if dtype not in _DTYPES:
        return f"needs float16 or bfloat16 activations; got {dtype}"
    if n % COLUMNS:
        return f"N={n} is not a multiple of {COLUMNS} columns"
    if group_size % 64:
        return f"group_size={group_size} is not a multiple of 64"
    if split not in SPLITS:
        return f"no split {split}; there are {SPLITS}"
    if k % (split * group_size):
        return f"K={k} is not {split} slices of whole groups of {group_size}"
    if n // COLUMNS > counters.SLOTS:
        return "too many column tiles"
    if shared_bytes(m, k, group_size, split) > SHARED_LIMIT:
        return f"{m} rows of a {k // split}-row K slice need more than {SHARED_LIMIT} bytes of shared memory"
    return None


# whether the kernel can be built here: the same conditions as the CUDA-core GEMV's (Hopper or newer,
# nvcc found, CUDA kernels on)
available = w4a16_cuda.available


def gemv(
    x2: torch.Tensor,
    qmma: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    split: int = 1,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x2 [M, K] @ W`` -> ``[M, N]`` in x's dtype, ``W`` given as ``qmma`` (:func:`mma_layout`),
    ``qzeros`` and ``scales`` (AutoAWQ). ``x2``'s rows may be strided (unit stride along K); the
    other tensors contiguous and 16-byte aligned. Raises ``ValueError`` where the launch does not
    fit and ``cuda_jit.CudaError`` where the kernel cannot be built."""
    if qmma.dim() != 4 or qmma.shape[2:] != (32, 4) or qmma.dtype != torch.int32:
        raise ValueError(f"qmma must be int32 [N/16, K/64, 32, 4]; got {qmma.dtype} {tuple(qmma.shape)}")
    n, k = qmma.shape[0] * 16, qmma.shape[1] * 64
    check_awq_shapes(
        torch.empty((k, n // PACK_FACTOR), dtype=torch.int32, device="meta"), qzeros, scales, group_size
    )
    if x2.dim() != 2 or x2.shape[1] != k or x2.stride(1) != 1 or x2.stride(0) % 2 or x2.data_ptr() % 4:
        raise ValueError(
            f"x must be [M, {k}] with unit stride along K (4-byte aligned rows); got {tuple(x2.shape)}"
        )
    if qzeros.dtype != torch.int32 or scales.dtype != x2.dtype:
        raise ValueError(f"qzeros must be int32 and scales {x2.dtype}; got {qzeros.dtype}, {scales.dtype}")
    if len({t.device for t in (x2, qmma, qzeros, scales)}) != 1:
        raise ValueError("x, qmma, qzeros and scales must be on one device")
    for name, t in (("qmma", qmma), ("qzeros", qzeros), ("scales", scales)):
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise ValueError(f"{name} must be contiguous and 16-byte aligned")
    m = x2.shape[0]
    why = fits(m, n, k, group_size, x2.dtype, split)
    if why is not None:
        raise ValueError(f"the tensor-core W4A16 GEMV {why}")
    kernels = cuda_jit.load(SOURCE, x2.device, [f"w4a16_mma_{d}" for d in _DTYPES.values()])
    if kernels is None:
        raise cuda_jit.CudaError("the CUDA W4A16 kernels are not available on this machine")
    if out is None:
        out = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    elif out.shape != (m, n) or out.dtype != x2.dtype or out.device != x2.device or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{m}, {n}] {x2.dtype} tensor on {x2.device}")
    tiles = n // COLUMNS
    ws: torch.Tensor | None = None
    cnt: torch.Tensor | None = None
    if split > 1:
        ws = torch.empty(split, m, n, dtype=torch.float32, device=x2.device)
        cnt = counters.counters(x2.device, "w4a16_mma", tiles)
        if cnt is None:
            raise ValueError("no split-K counters (first use inside a CUDA-graph capture)")
    kernels[f"w4a16_mma_{_DTYPES[x2.dtype]}"](
        (tiles, split),
        THREADS,
        (x2, qmma, qzeros, scales, ws, out, cnt, m, n, k, group_size, x2.stride(0)),
        shared_bytes=shared_bytes(m, k, group_size, split),
        pdl=pdl(x2.device),
    )
    return out
