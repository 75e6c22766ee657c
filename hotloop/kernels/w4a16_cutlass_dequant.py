"""Dequantize a weight in the CUTLASS W4A16 layout (``kernels/w4a16_cutlass.py``) to a dense bf16
``[N, K]`` matrix (``nn.Linear``'s layout) in one Triton launch.

The CUTLASS mode's ``dequant`` launch uses it at large M (prefill chunks of thousands of rows): the
mixed-input GEMM converts every int4 weight once per token tile, and at 1,040-2,048 rows it ran 2-13%
behind bf16 cuBLAS on an H200 (``benchmarks/w4a16_cutlass_table.py``, fiftieth session). One pass over
the weight costs 0.5 byte read and 2 bytes written per value: for the 28,672 x 4,096 gate/up weight
about 70 us at the copy rate, against about 5 ms for its product at 16,384 rows (an estimate; this
launch has not yet been timed on a GPU). The tuner times it beside the CUTLASS tiles and keeps it only
where it wins.

The layout (see :func:`w4a16_cutlass.layout_offsets`): 16 x 16 atoms of 256 nibbles (128 bytes, 32
words), atom ``(row // 16, col // 16)`` at atom index ``row // 16 + (col // 16) * N / 16``. Inside an
atom, with ``row % 16 = a + 8 n1`` and ``col % 16 = k0 + 2 k1 + 8 k2``, the value is word
``4 a + k1``, nibble ``n1 + 2 k2 + 4 k0``. So a program loads the 32 words of each of its atoms
(``R`` consecutive atoms down the rows are 128 R contiguous bytes), splits every word into its 8
nibbles in registers, and permutes ``[C, R, a, k1, k0, k2, n1]`` to ``[R, n1, a, C, k2, k1, k0]``,
which is its ``[16 R, 16 C]`` output tile, row-major. Values are int4 ``q - 8`` (two's complement):
``W = (q - 8) * scale + zero`` in float32, rounded once to bf16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROW_ATOMS = 4  # R: 64 rows a program
COL_ATOMS = 4  # C: 64 columns a program (one group: the group size is a multiple of 64)


@triton.jit
def _cutlass_dequant_kernel(
    w_ptr,  # int32 words of the reordered int4 weight (N * K / 8)
    s_ptr,  # bf16 [K / GROUP, N]
    z_ptr,  # bf16 [K / GROUP, N]
    out_ptr,  # bf16 [N, K]
    N,
    K,
    GROUP: tl.constexpr,
    R: tl.constexpr,
    C: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_c = tl.program_id(1)
    row_atom0 = pid_r * R
    col_atom0 = pid_c * C
    n_atoms = N // 16
    # words [C, R, 32]: atom (row_atom0 + r, col_atom0 + c) starts at word 32 * (its atom index)
    c_ = tl.arange(0, C)
    r_ = tl.arange(0, R)
    wi = tl.arange(0, 32)
    atom = (col_atom0 + c_)[:, None] * n_atoms + (row_atom0 + r_)[None, :]  # [C, R]
    words = tl.load(w_ptr + atom.to(tl.int64)[:, :, None] * 32 + wi[None, None, :])  # [C, R, 32]
    nib = tl.arange(0, 8)
    q = (words[:, :, :, None] >> (nib * 4)[None, None, None, :]) & 0xF  # [C, R, 32, 8]
    q = (q ^ 8) - 8  # two's complement int4
    # [C, R, a (8), k1 (4), k0 (2), k2 (2), n1 (2)] -> [R, n1, a, C, k2, k1, k0]
    q = tl.reshape(q, (C, R, 8, 4, 2, 2, 2))
    q = tl.permute(q, (1, 6, 2, 0, 5, 3, 4))
    q = tl.reshape(q, (R * 16, C * 16))
    rows = row_atom0 * 16 + tl.arange(0, R * 16)
    group = (col_atom0 * 16) // GROUP
    s = tl.load(s_ptr + group * N + rows).to(tl.float32)
    z = tl.load(z_ptr + group * N + rows).to(tl.float32)
    w = q.to(tl.float32) * s[:, None] + z[:, None]
    cols = col_atom0 * 16 + tl.arange(0, C * 16)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], w.to(tl.bfloat16))


def dequantize(
    w: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    n: int,
    k: int,
    group_size: int,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The CUTLASS layout's ``w`` (uint8 ``[N, K/2]``, reordered int4 ``q - 8``), ``scales`` and
    ``zeros`` (bf16 ``[K/g, N]``) -> bf16 ``[N, K]`` with ``W = (q - 8) * scale + zero``, into ``out``
    where given. Needs ``N`` and ``K`` multiples of 64 and a group size that is a multiple of 64."""
    if n % (16 * ROW_ATOMS) or k % (16 * COL_ATOMS) or group_size % (16 * COL_ATOMS):
        raise ValueError(
            f"the CUTLASS dequantization needs N, K and the group size multiples of 64 "
            f"(got N={n}, K={k}, group={group_size})"
        )
    if w.dtype != torch.uint8 or w.numel() * 2 != n * k or not w.is_contiguous():
        raise ValueError(
            f"w must be contiguous uint8 holding N*K/2 = {n * k // 2} bytes (got {w.dtype}, {w.numel()})"
        )
    for name, t in (("scales", scales), ("zeros", zeros)):
        if t.shape != (k // group_size, n) or t.dtype != torch.bfloat16 or not t.is_contiguous():
            raise ValueError(
                f"{name} must be contiguous bf16 [{k // group_size}, {n}] (got {t.dtype} {list(t.shape)})"
            )
    if out is None:
        out = torch.empty(n, k, dtype=torch.bfloat16, device=w.device)
    elif out.shape != (n, k) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous bf16 [{n}, {k}] (got {out.dtype} {list(out.shape)})")
    grid = (n // (16 * ROW_ATOMS), k // (16 * COL_ATOMS))
    _cutlass_dequant_kernel[grid](
        w.view(torch.int32), scales, zeros, out, n, k, GROUP=group_size, R=ROW_ATOMS, C=COL_ATOMS
    )
    return out
