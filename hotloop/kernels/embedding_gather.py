"""Token-embedding lookup from a table in pinned host memory, Triton: ``out[t] = table[ids[t]]``.

With ``--embeddings-on-host`` the embedding table (``vocab x hidden``, 1 GiB for Llama-3-8B in
bf16) stays in page-locked host memory and the GPU reads only the rows a step looks up, over PCIe
through unified virtual addressing, as vLLM's ``--cpu-offload-gb`` reads offloaded weights: the
pinned table's address is valid on the device, so the kernel loads from it like any pointer. A
decode step reads one row per sequence (8 KiB for Llama-3-8B); the table never moves. The same
kernel gathers from a device table. ``reference.embedding`` is the torch version.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels.checks import FLOAT_DTYPES, check, check_dtype
from hotloop.kernels.launch_math import cdiv, next_power_of_2
from hotloop.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_kwargs, pdl


@triton.jit
def _gather_kernel(
    ids_ptr, table_ptr, out_ptr, hidden, stride_i, stride_t, stride_o, BLOCK: tl.constexpr, PDL: tl.constexpr
):
    if PDL:  # programmatic dependent launch (kernels/pdl.py)
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < hidden
    row = tl.load(ids_ptr + t * stride_i).to(tl.int64)
    x = tl.load(table_ptr + row * stride_t + offs, mask=mask, other=0.0)
    tl.store(out_ptr + t.to(tl.int64) * stride_o + offs, x, mask=mask)


def embedding_gather(ids: torch.Tensor, table: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``ids [T]`` (int32 or int64, on the GPU; every id must lie in ``[0, vocab)``, which the
    caller guarantees: the kernel does not check) -> ``[T, hidden]`` rows of ``table
    [vocab, hidden]`` (pinned host memory or device memory, dense rows) on ids' device, in the
    table's dtype."""
    check(ids.dim() == 1, f"ids must be [T], got {tuple(ids.shape)}")
    check(ids.dtype in (torch.int32, torch.int64), f"ids must be int32 or int64, got {ids.dtype}")
    check(table.dim() == 2 and table.stride(1) == 1, "table must be [vocab, hidden] with dense rows")
    check_dtype("table", table, FLOAT_DTYPES)
    if table.device.type == "cpu" and ids.is_cuda and not torch.cuda.is_current_stream_capturing():
        # (not asked during a CUDA-graph capture: the tables that reach a capture were checked before)
        check(
            table.is_pinned(),
            "a host table must be in pinned memory for the GPU to read it (tensor.pin_memory())",
        )
    T, hidden = ids.shape[0], table.shape[1]
    if out is None:
        out = torch.empty(T, hidden, dtype=table.dtype, device=ids.device)
    check(out.shape == (T, hidden) and out.stride(1) == 1, f"out {tuple(out.shape)} != [{T}, {hidden}]")
    check(out.dtype == table.dtype, f"out is {out.dtype}, the table {table.dtype}")
    if T:
        block = min(1024, next_power_of_2(hidden))
        _gather_kernel[(T, cdiv(hidden, block))](
            ids, table, out, hidden, ids.stride(0), table.stride(0), out.stride(0), BLOCK=block,
            PDL=pdl(ids.device), num_warps=4, **launch_kwargs(ids.device),
        )  # fmt: skip
    return out
