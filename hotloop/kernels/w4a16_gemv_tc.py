"""The tensor-core W4A16 one-row GEMV on the AutoAWQ layout (``kernels/cuda/w4a16_gemv_tc.cu``):
its variants, limits and launch.

One row of 16-bit ``x`` times an AutoAWQ int4 weight, for decode at batch 1, with no second copy of
the weights: each lane's 32-bit word is its A fragment of an ``mma.sync`` m16n8k16 as it lies in
memory, and the B operand routes each half of each fragment register to its own output column (the
source's header says how). Zero points, the exactness offset and the scales are applied once per
group and column in float32. A variant is ``(WPL, IT, WARPS)``: a block of ``WARPS`` warps covers
``64 WPL`` columns and ``WARPS * 4 IT`` rows (each lane ``WPL`` words of each of ``IT`` rows), and K
is split into ``K / (WARPS * 4 IT)`` slices whose partials the last block of a column tile adds in a
fixed order.

On an H100 (BENCHMARKS.md, thirty-third session) it runs about as fast as the CUDA-core GEMV
(``w4a16_cuda.py``, 16-bit partial sums) alone: faster on some Llama-3-8B shapes, slower on others;
its error against float32 dequantize-then-matmul is about one output rounding (bf16: 2.1-3.2e-3 of
max |y| on the Llama-3-8B shapes). ``w4a16_gemm``'s tuner times the variants beside the other
one-row launches (kind ``"cuda_tc"``; ``HOTLOOP_W4A16_TC=0`` leaves them out) where ``cuda_jit`` can
compile them, also with ``HOTLOOP_W4A16_HALF2=0`` (float32 sums only).
"""

from __future__ import annotations

import torch

from hotloop.kernels import counters, cuda_jit
from hotloop.kernels.pdl import pdl
from hotloop.kernels.w4a16_one_row import DTYPE_TAGS as _DTYPES
from hotloop.kernels.w4a16_one_row import check_operands, launch_buffers

SOURCE = "w4a16_gemv_tc.cu"
# (WPL, IT, WARPS) as compiled in w4a16_gemv_tc.cu; each was the fastest on some Llama-3-8B shape
# (benchmarks/w4a16_tc_sweep.py, H100)
VARIANTS: tuple[tuple[int, int, int], ...] = (
    (4, 8, 8),
    (4, 16, 4),
    (4, 16, 8),
    (2, 16, 8),
    (2, 32, 4),
)


def kernel_name(dtype: torch.dtype, wpl: int, it: int, warps: int) -> str:
    return f"w4a16_gemv_tc_{_DTYPES[dtype]}_w{wpl}_i{it}_n{warps}"


def tile(wpl: int, it: int, warps: int) -> tuple[int, int]:
    """``(columns, rows)`` one block of variant ``(wpl, it, warps)`` covers."""
    return 64 * wpl, warps * 4 * it


def fits(
    m: int,
    n: int,
    k: int,
    group_size: int,
    dtype: torch.dtype,
    wpl: int,
    it: int,
    warps: int,
) -> str | None:
    """Why variant ``(wpl, it, warps)`` cannot run this product, or ``None`` when it can."""
    if (wpl, it, warps) not in VARIANTS:
        return f"no variant ({wpl}, {it}, {warps}); there are {VARIANTS}"
    cols, rows = tile(wpl, it, warps)
    warp_rows = 4 * it
    if m != 1:
        return f"takes one row; got {m}"
    if dtype not in _DTYPES:
        return f"needs float16 or bfloat16 activations; got {dtype}"
    if n % cols:
        return f"N={n} is not a multiple of the block's {cols} columns"
    if k % rows:
        return f"K={k} is not a multiple of the block's {rows} rows"
    per = group_size // warp_rows
    if group_size % warp_rows or per & (per - 1):
        return f"group_size={group_size} is not a power of two times a warp's {warp_rows} rows"
    if rows % group_size and group_size % rows:
        return f"a block's {rows} rows neither hold whole groups of {group_size} nor fit in one"
    if n // cols > counters.SLOTS:
        return "too many column tiles"
    return None


def available(device: torch.device) -> bool:
    """Whether the kernels can be compiled here (Hopper or newer: they wait with ``griddepcontrol``;
    nvcc found; CUDA kernels not turned off); cheap: compiling happens at the first launch."""
    if device.type != "cuda" or not cuda_jit.enabled() or cuda_jit.find_nvcc() is None:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def _names() -> list[str]:
    return [kernel_name(dt, *v) for dt in _DTYPES for v in VARIANTS]


def gemv(
    x2: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    wpl: int,
    it: int,
    warps: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x2 [1, K] @ W`` -> ``[1, N]`` in x's dtype with variant ``(wpl, it, warps)``. Every tensor
    contiguous and 16-byte aligned; scales in x's dtype. Raises ``ValueError`` where the variant does
    not fit and ``cuda_jit.CudaError`` where the kernels cannot be built."""
    k, n = check_operands(x2, qweight, qzeros, scales, group_size)
    why = fits(x2.shape[0], n, k, group_size, x2.dtype, wpl, it, warps)
    if why is not None:
        raise ValueError(f"the tensor-core W4A16 GEMV ({wpl}, {it}, {warps}) {why}")
    kernels = cuda_jit.load(SOURCE, x2.device, _names())
    if kernels is None:
        raise cuda_jit.CudaError("the tensor-core W4A16 GEMV kernels are not available on this machine")
    cols, rows = tile(wpl, it, warps)
    split = k // rows
    tiles = n // cols
    out, ws, cnt = launch_buffers(x2, n, split, tiles, "w4a16_gemv_tc", out)
    kernels[kernel_name(x2.dtype, wpl, it, warps)](
        (tiles, split),
        32 * warps,
        (x2, qweight, qzeros, scales, ws, out, cnt, n, k, group_size),
        pdl=pdl(x2.device),
    )
    return out
