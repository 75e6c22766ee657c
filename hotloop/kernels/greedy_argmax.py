"""Greedy argmax over the logits of a few rows, Triton, in one launch: the batch-1 decode graph's
last kernel.

``torch.argmax`` over one row of a 128k vocabulary runs one block for the row (27 us on an H200 in
a batch-1 decode step, ``benchmarks/profile_step.py``). Here each row is cut into ``CHUNK``-wide
pieces, one program each; a program stores its piece's maximum and the first index holding it,
then counts itself in (``kernels/counters.py``); the last program of the row to arrive reduces the
row's partials and stores the index. As ``torch.argmax``: ties go to the lowest index, and a row
holding a NaN gives its first NaN's index.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels import counters
from hotloop.kernels.checks import check, check_last_contiguous
from hotloop.kernels.launch_math import cdiv, next_power_of_2
from hotloop.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_kwargs, pdl

CHUNK = 2048  # logits per program
MAX_ROWS = 16  # rows per launch (the batch-1 path's; larger batches keep torch.argmax)
_FAMILY = "greedy_argmax"


@triton.jit
def _greedy_argmax_kernel(
    x_ptr,
    part_v_ptr,
    part_i_ptr,
    out_ptr,
    cnt_ptr,
    V,
    P,
    stride_x,
    CHUNK: tl.constexpr,
    P_POW2: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # programmatic dependent launch (kernels/pdl.py): the logits are the last kernel's output
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0)
    pid = tl.program_id(1)
    offs = pid * CHUNK + tl.arange(0, CHUNK)
    v = tl.load(x_ptr + row.to(tl.int64) * stride_x + offs, mask=offs < V, other=float("-inf"))
    isnan = v != v
    nan_idx = tl.min(tl.where(isnan, offs, V), 0)  # the first NaN, if any
    v = tl.where(isnan, float("-inf"), v)
    m = tl.max(v, 0)
    idx = tl.min(tl.where(v == m, offs, V), 0)  # the first index holding the maximum
    has_nan = nan_idx < V
    tl.store(part_v_ptr + row * P + pid, tl.where(has_nan, float("nan"), m))  # a NaN piece wins
    tl.store(part_i_ptr + row * P + pid, tl.where(has_nan, nan_idx, idx))
    tl.debug_barrier()  # the partial is stored before the release below
    arrived = tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel", scope="gpu")
    if arrived == P - 1:  # the last of the row: every partial is visible (acquire)
        po = tl.arange(0, P_POW2)
        pv = tl.load(part_v_ptr + row * P + po, mask=po < P, other=float("-inf"), cache_modifier=".cg")
        pi = tl.load(part_i_ptr + row * P + po, mask=po < P, other=V, cache_modifier=".cg")
        pnan = pv != pv
        first_nan = tl.min(tl.where(pnan, pi, V), 0)
        pv = tl.where(pnan, float("-inf"), pv)
        mm = tl.max(pv, 0)
        best = tl.min(tl.where(pv == mm, pi, V), 0)  # chunks are in index order: the first wins
        best = tl.where(first_nan < V, first_nan, best)
        tl.store(out_ptr + row, best.to(tl.int64))
        tl.atomic_xchg(cnt_ptr + row, 0, sem="relaxed", scope="gpu")


def greedy_argmax(logits: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor | None:
    """``logits [M, V]`` float32 -> int64 ``[M]``, the first index of each row's maximum; ``None``
    where this kernel does not apply (more than ``MAX_ROWS`` rows, or no counters: the caller then
    uses ``torch.argmax``). ``chunk``: logits per program (a power of two)."""
    check(logits.dim() == 2, f"logits must be [M, V], got {tuple(logits.shape)}")
    check(logits.dtype == torch.float32, f"logits must be float32, got {logits.dtype}")
    check_last_contiguous("logits", logits)
    m, v = logits.shape
    check(v >= 1, "logits need at least one column")
    check(chunk >= 16 and chunk & (chunk - 1) == 0, f"chunk={chunk} must be a power of two >= 16")
    if m > MAX_ROWS:
        return None
    cnt = counters.counters(logits.device, _FAMILY, m)
    if cnt is None:
        return None
    out = torch.empty(m, dtype=torch.int64, device=logits.device)
    if m == 0:
        return out
    p = cdiv(v, chunk)
    part_v = torch.empty(m, p, dtype=torch.float32, device=logits.device)
    part_i = torch.empty(m, p, dtype=torch.int32, device=logits.device)
    _greedy_argmax_kernel[(m, p)](
        logits,
        part_v,
        part_i,
        out,
        cnt,
        v,
        p,
        logits.stride(0),
        CHUNK=chunk,
        P_POW2=next_power_of_2(p),
        PDL=pdl(logits.device),
        num_warps=4,
        **launch_kwargs(logits.device),
    )
    return out
