"""``out[i] = values[index[i]]`` for a few hundred int64 ids, Triton, in one launch: the pending-token
gather of a decode step whose batch order changed (``executor/model_runner.py``'s ``patch_pending``).

``torch.index_select`` does the same, but on an H200 host, behind a queue of decode graphs, the host
was measured waiting in it for part of the queued work (15-60 ms per call in a batch-256 multi-step
profile, ``benchmarks/results/gpu_2026-11-30i``); a plain launch does not wait.
``reference.gather_ids`` is the torch version.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels.checks import check, check_dtype
from hotloop.kernels.launch_math import cdiv

BLOCK = 256  # ids per program, fixed: one compiled variant for every batch


@triton.jit(do_not_specialize=["n"])
def _gather_ids_kernel(values_ptr, index_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    src = tl.load(index_ptr + i, mask=mask, other=0)
    tl.store(out_ptr + i, tl.load(values_ptr + src, mask=mask, other=0), mask=mask)


def gather_ids(values: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[:n] = values[index]`` (``n = index.numel()``), all int64 and dense; returns ``out[:n]``.
    Indices must lie in ``[0, values.numel())`` (not checked on the device)."""
    n = index.numel()
    for name, t in (("values", values), ("index", index), ("out", out)):
        check_dtype(name, t, (torch.int64,))
        check(t.dim() == 1 and t.stride(0) == 1, f"{name} must be a dense vector, got {tuple(t.shape)}")
    check(out.numel() >= n, f"out has {out.numel()} rows for {n} indices")
    if n:
        _gather_ids_kernel[(cdiv(n, BLOCK),)](values, index, out, n, BLOCK=BLOCK, num_warps=4)
    return out[:n]
