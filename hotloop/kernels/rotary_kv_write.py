"""Rotary embedding fused with the KV cache write, Triton: one pass over this step's q, k and v.

Per token: q is rotated in place, k is rotated and stored at the token's cache slot, v is stored
there as is. Rotation is the rotate-half (NeoX) layout on the first ``2 * half`` dims of each head,
computed in float32. Tokens whose slot is negative (padding rows of a CUDA graph) write nothing to
the cache.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels.checks import FLOAT_DTYPES, check, check_dtype, check_last_contiguous


@triton.jit
def _rotate_rows(x_ptr, cos, sin, offs_h, mask_h, offs_r, mask_r, stride_h, HALF: tl.constexpr):
    """Load the two rotated halves of rows ``offs_h`` and return them rotated (float32)."""
    m = mask_h[:, None] & mask_r[None, :]
    p1 = x_ptr + offs_h[:, None] * stride_h + offs_r[None, :]
    x1 = tl.load(p1, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=m, other=0.0).to(tl.float32)
    return x1 * cos[None, :] - x2 * sin[None, :], x2 * cos[None, :] + x1 * sin[None, :], m


@triton.jit
def _rotary_kv_kernel(
    q_ptr,  # [T, H, D] (row stride free)
    k_ptr,  # [T, KV, D]
    v_ptr,  # [T, KV, D]
    cos_ptr,  # [T, HALF] fp32
    sin_ptr,
    slot_ptr,  # [T] int64
    k_cache_ptr,  # [NB * BS, KV, D] viewed flat over slots
    v_cache_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cs,
    stride_ks,
    stride_kch,
    stride_vs,
    stride_vch,
    H: tl.constexpr,
    KV: tl.constexpr,
    D: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    offs_r = tl.arange(0, BLOCK_R)
    mask_r = offs_r < HALF
    cos = tl.load(cos_ptr + t * stride_cs + offs_r, mask=mask_r, other=1.0)
    sin = tl.load(sin_ptr + t * stride_cs + offs_r, mask=mask_r, other=0.0)

    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < H
    qt = q_ptr + t * stride_qt
    o1, o2, m = _rotate_rows(qt, cos, sin, offs_h, mask_h, offs_r, mask_r, stride_qh, HALF)
    pq = qt + offs_h[:, None] * stride_qh + offs_r[None, :]
    tl.store(pq, o1.to(q_ptr.dtype.element_ty), mask=m)
    tl.store(pq + HALF, o2.to(q_ptr.dtype.element_ty), mask=m)

    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        offs_kv = tl.arange(0, BLOCK_KV)
        mask_kv = offs_kv < KV
        kt = k_ptr + t * stride_kt
        k1, k2, mk = _rotate_rows(kt, cos, sin, offs_kv, mask_kv, offs_r, mask_r, stride_kh, HALF)
        pk = k_cache_ptr + slot * stride_ks + offs_kv[:, None] * stride_kch + offs_r[None, :]
        tl.store(pk, k1.to(k_cache_ptr.dtype.element_ty), mask=mk)
        tl.store(pk + HALF, k2.to(k_cache_ptr.dtype.element_ty), mask=mk)
        # dims past the rotary part (partial rotary) are copied as they are
        offs_p = 2 * HALF + tl.arange(0, BLOCK_D)
        mp = mask_kv[:, None] & (offs_p < D)[None, :]
        kp = tl.load(kt + offs_kv[:, None] * stride_kh + offs_p[None, :], mask=mp, other=0.0)
        tl.store(
            k_cache_ptr + slot * stride_ks + offs_kv[:, None] * stride_kch + offs_p[None, :], kp, mask=mp
        )
        offs_d = tl.arange(0, BLOCK_D)
        mv = mask_kv[:, None] & (offs_d < D)[None, :]
        v = tl.load(
            v_ptr + t * stride_vt + offs_kv[:, None] * stride_vh + offs_d[None, :], mask=mv, other=0.0
        )
        tl.store(
            v_cache_ptr + slot * stride_vs + offs_kv[:, None] * stride_vch + offs_d[None, :],
            v.to(v_cache_ptr.dtype.element_ty),
            mask=mv,
        )


def rotary_kv_write(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Rotate q ``[T, H, D]`` in place; rotate k ``[T, KV, D]`` and store it and v at ``slot_mapping``.

    cos / sin ``[T, half]`` float32 (``2 * half <= D``); caches ``[num_blocks, block_size, KV, D]``;
    slot_mapping ``[T]`` int64 (negative: skip). q, k and v may be strided views of one fused
    projection output, as long as each head's ``D`` values are contiguous.
    """
    check(q.dim() == 3 and k.dim() == 3 and v.dim() == 3, "q, k, v must be [T, heads, D]")
    T, H, D = q.shape
    KV = k.shape[1]
    half = cos.shape[-1]
    check(k.shape == (T, KV, D) and v.shape == (T, KV, D), f"k {tuple(k.shape)} / v {tuple(v.shape)}")
    check(cos.shape == (T, half) and sin.shape == (T, half), f"cos/sin must be [T={T}, half]")
    check(0 < 2 * half <= D, f"rotary dims 2*{half} must be in (0, head_dim={D}]")
    check(cos.dtype == torch.float32 and sin.dtype == torch.float32, "cos/sin must be float32")
    check(cos.stride() == sin.stride() and cos.stride(-1) == 1, "cos and sin must share a dense layout")
    nb, bs, kvc, dc = k_cache.shape
    check((kvc, dc) == (KV, D), f"cache heads/dim {(kvc, dc)} != k's {(KV, D)}")
    check(v_cache.shape == k_cache.shape, "v_cache and k_cache differ in shape")
    check(slot_mapping.shape == (T,) and slot_mapping.dtype == torch.int64, "slot_mapping must be [T] int64")
    check_dtype("q", q, FLOAT_DTYPES)
    for name, t in (("q", q), ("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_last_contiguous(name, t)
    check(k_cache.stride(0) == bs * k_cache.stride(1), "k_cache blocks must be dense over tokens")
    check(v_cache.stride(0) == bs * v_cache.stride(1), "v_cache blocks must be dense over tokens")
    if T == 0:
        return
    _rotary_kv_kernel[(T,)](
        q,
        k,
        v,
        cos,
        sin,
        slot_mapping,
        k_cache,
        v_cache,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        cos.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(1),
        v_cache.stride(2),
        H=H,
        KV=KV,
        D=D,
        HALF=half,
        BLOCK_H=triton.next_power_of_2(H),
        BLOCK_KV=triton.next_power_of_2(KV),
        BLOCK_R=triton.next_power_of_2(half),
        BLOCK_D=triton.next_power_of_2(D),
        num_warps=4,
    )
