"""Prefetching a weight into the GPU's L2 cache while the kernels before its GEMV leave memory idle.

At batch 1 the decode step streams every weight once, and the HBM is busy except between the
projections: decode attention over a short context moves a few MB in several microseconds, and each
GEMV ramps up and drains. ``l2_prefetch`` issues ``prefetch.global.L2::evict_last`` for every
128-byte line of a tensor and returns; launched just before attention (as a programmatic dependent,
``kernels/pdl.py``), it starts while the projection before it drains, so the output projection's
weight is read from HBM during attention and found in L2 by the GEMV.

The kernel reads nothing into registers and writes nothing: correctness never depends on it. It
needs sm_80+ PTX (the L2 eviction-priority qualifier) and runs only on CUDA; ``HOTLOOP_L2_PREFETCH=0``
turns its use off (``ops.l2_prefetch``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from hotloop.kernels.checks import check
from hotloop.kernels.launch_math import cdiv
from hotloop.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_kwargs, pdl

LINE = 128  # bytes per L2 line
LINES_PER_PROGRAM = 1024  # 128 KiB: 8 prefetches per thread at 4 warps


@triton.jit
def _prefetch_lines(ptr, first, n_lines, LINES: tl.constexpr):
    """Prefetch lines ``first .. first + LINES`` (those below ``n_lines``) of the bytes at ``ptr``."""
    offs = first + tl.arange(0, LINES)
    live = (offs < n_lines).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.b32 $0, 0; }",
        "=r,l,r",
        [ptr + offs * 128, live],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _l2_prefetch_kernel(p0, n0, p1, n1, p2, n2, end0, end1, LINES: tl.constexpr, PDL: tl.constexpr):
    """Programs ``[0, end0)`` prefetch tensor 0's lines, ``[end0, end1)`` tensor 1's, the rest 2's."""
    if PDL:
        gdc_launch_dependents()  # the next kernel may launch now: this one waits for nobody below
    pid = tl.program_id(0)
    if pid < end0:
        _prefetch_lines(p0, pid.to(tl.int64) * LINES, n0, LINES)
    elif pid < end1:
        _prefetch_lines(p1, (pid - end0).to(tl.int64) * LINES, n1, LINES)
    else:
        _prefetch_lines(p2, (pid - end1).to(tl.int64) * LINES, n2, LINES)
    if PDL:
        # The kernel after this one waits for this one to finish; waiting here for the one before
        # keeps that chain (the dependent's wait then also covers the kernel before this one).
        gdc_wait()


def l2_prefetch(tensors: Sequence[torch.Tensor], max_bytes: int | None = None) -> None:
    """Ask the L2 cache to load the storage of up to three ``tensors`` (contiguous, on one CUDA
    device), in order, at most ``max_bytes`` in all; one launch. The lines are kept over data marked
    evict-first."""
    check(1 <= len(tensors) <= 3, f"l2_prefetch takes one to three tensors, got {len(tensors)}")
    budget = max_bytes if max_bytes is not None else 1 << 62
    views: list[torch.Tensor] = []
    lines: list[int] = []
    for t in tensors:
        check(t.is_cuda and t.device == tensors[0].device, "l2_prefetch runs on CUDA tensors of one device")
        check(t.is_contiguous(), "l2_prefetch needs contiguous tensors")
        nbytes = min(t.numel() * t.element_size(), budget)
        budget -= nbytes
        views.append(t.reshape(-1).view(torch.uint8))
        lines.append(cdiv(nbytes, LINE))
    while len(views) < 3:
        views.append(views[0])
        lines.append(0)
    progs = [cdiv(n, LINES_PER_PROGRAM) for n in lines]
    if sum(progs) == 0:
        return
    dev = tensors[0].device
    _l2_prefetch_kernel[(sum(progs),)](
        views[0], lines[0], views[1], lines[1], views[2], lines[2], progs[0], progs[0] + progs[1],
        LINES=LINES_PER_PROGRAM, PDL=pdl(dev), num_warps=4, **launch_kwargs(dev),
    )  # fmt: skip
