"""Dequantize a weight in the CUTLASS W4A16 layout (``kernels/w4a16_cutlass.py``) to a dense bf16
``[N, K]`` matrix (``nn.Linear``'s layout), or its ``[K, N]`` transpose, in one Triton launch.

The CUTLASS mode's two ``dequant`` launches use it at large M (prefill chunks of thousands of rows):
the mixed-input GEMM converts every int4 weight once per token tile, and at 1,040-4,096 rows it ran up
to 15% behind bf16 cuBLAS (``benchmarks/w4a16_cutlass_table.py``; fiftieth session on an H200,
fifty-first on an H100). One pass over the weight costs 0.5 byte read and 2 bytes written per value:
for the 28,672 x 4,096 gate/up weight about 100 us at an H100's copy rate. cuBLAS' speed depends on
the operand's layout: on the H100 (fifty-first session, ``call3``) ``x @ W`` with ``W`` stored
``[K, N]`` took 1,228 us for gate/up at 4,096 rows, where the ``[N, K]`` dequant launch took 1,468
(the dequant included), and down at 16,384 rows 2,472 against 2,768; for down at 4,096 rows the
``[N, K]`` form was ahead (665 against 706). So both layouts are candidates, and the tuner times them
beside the CUTLASS tiles and keeps one only where it wins.

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
    TRANS: tl.constexpr,  # write [K, N] (the transpose) instead of [N, K]
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
    if TRANS:
        tl.store(out_ptr + cols.to(tl.int64)[None, :] * N + rows[:, None], w.to(tl.bfloat16))
    else:
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * K + cols[None, :], w.to(tl.bfloat16))


def dequantize(
    w: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    n: int,
    k: int,
    group_size: int,
    out: torch.Tensor | None = None,
    transpose: bool = False,
) -> torch.Tensor:
    """The CUTLASS layout's ``w`` (uint8 ``[N, K/2]``, reordered int4 ``q - 8``), ``scales`` and
    ``zeros`` (bf16 ``[K/g, N]``) -> bf16 ``[N, K]`` with ``W = (q - 8) * scale + zero`` (``[K, N]``,
    its transpose, with ``transpose``), into ``out`` where given. Needs ``N`` and ``K`` multiples of 64
    and a group size that is a multiple of 64."""
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
    shape = (k, n) if transpose else (n, k)
    if out is None:
        out = torch.empty(shape, dtype=torch.bfloat16, device=w.device)
    elif out.shape != shape or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous bf16 {list(shape)} (got {out.dtype} {list(out.shape)})")
    grid = (n // (16 * ROW_ATOMS), k // (16 * COL_ATOMS))
    _cutlass_dequant_kernel[grid](
        w.view(torch.int32), scales, zeros, out, n, k, GROUP=group_size, R=ROW_ATOMS, C=COL_ATOMS,
        TRANS=transpose,
    )  # fmt: skip
    return out
