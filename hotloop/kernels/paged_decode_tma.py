"""Decode attention over a 16-bit paged cache with K and V tiles loaded by the tensor memory
accelerator (TMA, Hopper and later), Triton; opt-in with ``HOTLOOP_DECODE_TMA=1``.

The same attention as ``paged_decode_attention._decode_kernel`` with one split: one program per
(KV head, sequence), the heads-first grid, the ``G`` query heads of a GQA group as the rows of one
tile. The cache ``[num_blocks, block_size, KV, D]`` is seen as a matrix of ``num_blocks *
block_size`` rows of ``KV * D``; a tile of ``BLOCK_N`` keys (``BLOCK_N`` divides the block size,
so a tile lies in one page) is the box at row ``page * block_size + offset``, column ``kvh * D``,
read by one TMA copy that Triton pipelines ``num_stages`` deep. Rows past a sequence's end may hold
anything (NaN included): their scores are masked and their V rows zeroed before the product.

Where it applies (``why_not``): a 16-bit cache on a GPU of compute capability 9.0 or later with
Triton's host tensor descriptors, no sliding window, one split (the large batches), a head dim that
is a power of two from 16 to 256, and a block size that ``BLOCK_N`` divides. The layers take it only
inside the decode CUDA graphs (``graph_plan``); the descriptor holds the cache's address, so a
launch recorded for replay on another layer's cache (``launch_replay.py``) must never carry one.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

from hotloop.kernels.checks import check
from hotloop.kernels.launch_math import next_power_of_2
from hotloop.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_kwargs, pdl

ENV = "HOTLOOP_DECODE_TMA"
_LOG2E = 1.4426950408889634
# (BLOCK_N, num_warps, num_stages): not yet timed on a GPU (benchmarks/decode_tma_probe.py times them)
CONFIG = (64, 4, 3)
CONFIG_D256 = (32, 4, 3)  # a head dim of 256: two 64 x 256 tiles a stage would take 64 KB


def default_config(head_dim: int) -> tuple[int, int, int]:
    """``(BLOCK_N, num_warps, num_stages)`` for a head dim."""
    return CONFIG_D256 if head_dim > 128 else CONFIG


def enabled() -> bool:
    """``HOTLOOP_DECODE_TMA``: 1 sends the decode graphs' one-split launches here, 0 or unset does not."""
    raw = os.environ.get(ENV, "").strip() or "0"
    if raw not in ("0", "1"):
        raise ValueError(
            f"{ENV}={raw!r} must be 0 (the pointer-load kernel) or 1 (TMA loads where they apply)"
        )
    return raw == "1"


def _descriptor_class() -> Any:
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor
    except ImportError:
        return None
    return TensorDescriptor


def why_not(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    splits: int,
    sliding_window: int | None,
    block_n: int | None = None,
) -> str | None:
    """Why this kernel cannot take the launch with tiles of ``block_n`` keys (default: the head
    dim's ``default_config``); None: it can."""
    if _descriptor_class() is None:
        return "this Triton has no host tensor descriptors"
    if q.dtype not in (torch.float16, torch.bfloat16) or k_cache.dtype != q.dtype:
        return f"q {q.dtype} / cache {k_cache.dtype}: a 16-bit cache in q's dtype only"
    if splits != 1:
        return f"{splits} splits: one split only"
    if sliding_window:
        return "a sliding window"
    D = q.shape[-1]
    if D != next_power_of_2(D) or not 16 <= D <= 256:
        return f"head dim {D}: a power of two from 16 to 256"
    bs = k_cache.shape[1]
    block_n = block_n or default_config(D)[0]
    if bs % block_n:
        return f"block size {bs} is not a multiple of BLOCK_N {block_n}"
    if not k_cache.is_contiguous():
        return "the cache is not contiguous"
    if os.environ.get("TRITON_INTERPRET") != "1":
        if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] < 9:
            return "TMA needs a GPU of compute capability 9.0 or later"
    return None


def _descriptor(cache: torch.Tensor, block_n: int) -> Any:
    """The cache as ``[num_blocks * block_size, KV * D]`` rows, in boxes of ``[block_n, D]``. Built at
    each launch, not kept: a descriptor holds its tensor, and a kept one would keep a released
    cache's memory (the decode graphs launch this only while they are captured)."""
    nb, bs, kv, d = cache.shape
    return _descriptor_class().from_tensor(cache.view(nb * bs, kv * d), [block_n, d])


@triton.jit
def _decode_tma_kernel(
    q_ptr,  # [B, H, D]
    k_desc,  # [NB * BS, KV * D], boxes [BLOCK_N, D]
    v_desc,
    block_tables_ptr,  # [B, W] int32
    seq_lens_ptr,  # [B] int32
    out_ptr,  # [B, H, D]
    scale_log2,
    stride_qb,
    stride_qh,
    stride_bt,
    stride_ob,
    stride_oh,
    G: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STAGES: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    kvh = tl.program_id(0)
    b = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, D)
    mask_g = offs_g < G
    heads = kvh * G + offs_g
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=mask_g[:, None], other=0.0
    )
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    table = block_tables_ptr + b * stride_bt
    offs_t = tl.arange(0, BLOCK_N)
    for n0 in tl.range(0, seq_len, BLOCK_N, num_stages=STAGES):
        page = tl.load(table + n0 // BS)
        row = page * BS + n0 % BS
        k = k_desc.load([row, kvh * D])  # [BLOCK_N, D]
        mask_n = n0 + offs_t < seq_len
        s = tl.dot(q, tl.trans(k)) * scale_log2  # [BLOCK_G, BLOCK_N], log2 units
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = v_desc.load([row, kvh * D])
        v = tl.where(mask_n[:, None], v, 0.0)  # (p is 0 there, but 0 * NaN is not)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    dst = out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=mask_g[:, None])


def decode_tma(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    config: tuple[int, int, int] | None = None,
) -> torch.Tensor:
    """One-split decode attention of ``q [B, H, D]`` over the 16-bit caches ``[NB, BS, KV, D]`` into
    ``out [B, H, D]`` (``block_tables [B, W]`` and ``seq_lens [B]`` int32; rows with ``seq_len`` 0 come
    out as zeros). ``config``: ``(BLOCK_N, num_warps, num_stages)``, default ``default_config``. Raises
    ``ValueError`` where ``why_not`` names a reason."""
    block_n, num_warps, num_stages = config or default_config(q.shape[-1])
    reason = why_not(q, k_cache, 1, None, block_n)
    check(reason is None, f"decode_tma: {reason}")
    B, H, D = q.shape
    _nb, bs, kv, d = k_cache.shape
    check(
        d == D and v_cache.shape == k_cache.shape and v_cache.is_contiguous(), "caches [NB, BS, KV, D] alike"
    )
    check(H % kv == 0, f"num_heads={H} is not a multiple of num_kv_heads={kv}")
    check(
        q.stride(-1) == 1 and out.shape == q.shape and out.stride(-1) == 1,
        "q / out [B, H, D], last dim contiguous",
    )
    check(block_tables.dtype == torch.int32 and seq_lens.dtype == torch.int32, "block_tables/seq_lens: int32")
    G = H // kv
    use_pdl = pdl(q.device)
    _decode_tma_kernel[(kv, B)](
        q,
        _descriptor(k_cache, block_n),
        _descriptor(v_cache, block_n),
        block_tables,
        seq_lens,
        out,
        scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        block_tables.stride(0),
        out.stride(0),
        out.stride(1),
        G=G,
        D=D,
        BS=bs,
        BLOCK_G=max(16, next_power_of_2(G)),
        BLOCK_N=block_n,
        STAGES=num_stages,
        PDL=use_pdl,
        num_warps=num_warps,
        **launch_kwargs(q.device),
    )
    return out
