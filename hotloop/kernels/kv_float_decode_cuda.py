"""The CUDA C decode attention for a 16-bit KV cache with context splits merged inside the launch
(``kernels/cuda/kv_float_decode.cu``): when it applies, and its launch.

``paged_decode_attention`` sends a float cache here, instead of its Triton kernel and the merge
launch after it, where ``why_not`` finds nothing against it: ``HOTLOOP_FLOAT_CUDA_DECODE=1`` (off by
default: not yet timed on a GPU), 2 to 16 splits (one thread-block cluster per sequence and KV head:
up to 16 blocks, Hopper's largest, non-portable, cluster), fp16 / bf16 queries and a cache of the same
dtype, head dim 64 or 128, a GQA group of at most 8 query heads, no sliding window, rows 16-byte
aligned, a Hopper-or-newer GPU with nvcc (``cuda_jit``). Where the kernel cannot be built here the
Triton path runs; a driver error at launch is raised.
"""

from __future__ import annotations

import os

import torch

from hotloop.kernels import cuda_jit, kv_int8_decode_cuda, launch_replay
from hotloop.kernels.pdl import pdl

SOURCE = "kv_float_decode.cu"
THREADS = 128
TILE = 64
STAGES = 3
HEAD_DIMS = (64, 128)
MAX_GROUP = 8
MAX_CLUSTER = 16  # the .cu's MAX_CLUSTER
ENV = "HOTLOOP_FLOAT_CUDA_DECODE"
_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16"}
_KERNEL_NAMES = tuple(f"kv_float_decode_hd{d}_{dt}" for d in HEAD_DIMS for dt in _DTYPES.values())


def kernel_names() -> list[str]:
    """Every kernel the source defines (each head dim in each dtype)."""
    return list(_KERNEL_NAMES)


def enabled() -> bool:
    """``HOTLOOP_FLOAT_CUDA_DECODE=1`` (read at each call: benchmarks flip it between runs); unset,
    empty or 0: off. Any other value raises, naming the variable."""
    raw = os.environ.get(ENV, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{ENV}={raw!r} must be 1 (the CUDA kernel) or 0 / unset (the Triton kernel)")
    return raw == "1"


def shared_bytes(head_dim: int) -> int:
    """The ring: ``STAGES`` tiles of ``TILE`` tokens' K and V rows."""
    return STAGES * 2 * TILE * head_dim * 2


def why_not(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    group: int,
    window: int,
    num_splits: int,
) -> str | None:
    """Why the kernel cannot take this launch, or ``None`` when it can. ``q`` ``[B, H, D]``, the
    caches ``[NB, BS, KV, D]`` in q's dtype (a float cache, as ``paged_decode_attention`` takes it)."""
    if not enabled():
        return f"{ENV} is not 1"
    if q.dtype not in _DTYPES:
        return f"{q.dtype} queries (fp16 / bf16 only)"
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        return f"a {k_cache.dtype} cache for {q.dtype} queries"
    D = q.shape[-1]
    if D not in HEAD_DIMS:
        return f"head_dim {D} (64 or 128 only)"
    if group > MAX_GROUP:
        return f"a GQA group of {group} query heads (at most {MAX_GROUP})"
    if window:
        return "a sliding window"
    if q.shape[0] > kv_int8_decode_cuda.MAX_GRID_Y:
        return f"a batch of {q.shape[0]} (the grid's y holds at most {kv_int8_decode_cuda.MAX_GRID_Y})"
    if not 2 <= num_splits <= MAX_CLUSTER:
        return f"{num_splits} splits (2 to {MAX_CLUSTER}: the splits merge in one cluster)"
    bs = k_cache.shape[1]
    if bs & (bs - 1):
        return f"a block size of {bs} tokens (a power of two only)"
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.stride(3) != 1 or c.data_ptr() % 16 or any(s % 8 for s in c.stride()[:3]):
            return f"{name}'s rows are not 16-byte aligned (cp.async copies 16 bytes)"
    if q.stride(2) != 1 or q.data_ptr() % 4 or q.stride(0) % 2 or q.stride(1) % 2:
        return "q's rows are not 4-byte aligned"
    if q.device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "not on a GPU"
    if not cuda_jit.enabled():
        return f"{cuda_jit.ENV}=0"
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    return kv_int8_decode_cuda._machine_why_not(index)


def launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    scale_log2: float,
    num_splits: int,
) -> bool:
    """Launch the kernel on checked inputs (``why_not`` and ``paged_decode_attention`` check them):
    it writes ``out`` ``[B, H, D]``, the splits merged. False (nothing launched) where the kernels
    cannot be built on this machine."""
    kernels = cuda_jit.load(SOURCE, q.device, _KERNEL_NAMES)
    if kernels is None:
        return False
    B, H, D = q.shape
    _nb, bs, kv, _d = k_cache.shape
    args = (
        q, k_cache, v_cache, block_tables, seq_lens, out, float(scale_log2),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        H // kv, bs, num_splits, bs.bit_length() - 1,
    )  # fmt: skip
    kernel = kernels[f"kv_float_decode_hd{D}_{_DTYPES[q.dtype]}"]
    grid = (kv, B, num_splits)
    shared = shared_bytes(D)
    use_pdl = pdl(q.device)

    def run(*a: object) -> None:
        kernel(grid, THREADS, a, shared_bytes=shared, pdl=use_pdl, cluster=(1, 1, num_splits))  # type: ignore[arg-type]

    run(*args)
    launch_replay.note_launch(run, args)  # the piecewise graphs' attention replays it per layer
    return True
