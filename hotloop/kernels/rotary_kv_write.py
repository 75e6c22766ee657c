"""Rotary embedding fused with the KV cache write, Triton: one pass over this step's q, k and v.

Per token: q is rotated in place, k is rotated and stored at the token's cache slot, v is stored
there as is. Rotation is the rotate-half (NeoX) layout on the first ``2 * half`` dims of each head,
computed in float32. Tokens whose slot is negative (padding rows of a CUDA graph) write nothing to
the cache.

A quantized (``uint8``) cache is written in the same pass: each head's rotated k row (rounded to
the model dtype, as the reference does) and v row get their scale and zero computed in registers
and are stored as int8 or packed int4 codes, each head's codes and its (scale, zero) pair in their
block's two regions (``kv_quant.py`` has the format). The bytes equal ``kv_quant.write_kv_cache``'s. ``write_kv_cache`` is the same kernel without q and without rotation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels import kv_quant
from hotloop.kernels.checks import FLOAT_DTYPES, check, check_dtype, check_last_contiguous
from hotloop.kernels.kv_quant_triton import block_packed, quant_codes, quant_params, quant_rows
from hotloop.kernels.launch_math import next_power_of_2
from hotloop.kernels.launch_replay import recordable
from hotloop.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_kwargs, pdl

# a quantized write of at least this many tokens runs one program per token for all KV heads' k (and
# one for v) instead of one per head: enough programs fill the GPU either way, and fewer cost less
HEAD_PROGRAMS_BELOW = 1024


@triton.jit
def _rotate_rows(x_ptr, cos, sin, offs_h, mask_h, offs_r, mask_r, stride_h, HALF: tl.constexpr):
    """Load the two rotated halves of rows ``offs_h`` and return them rotated (float32)."""
    m = mask_h[:, None] & mask_r[None, :]
    p1 = x_ptr + offs_h[:, None] * stride_h + offs_r[None, :]
    x1 = tl.load(p1, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=m, other=0.0).to(tl.float32)
    return x1 * cos[None, :] - x2 * sin[None, :], x2 * cos[None, :] + x1 * sin[None, :], m


@triton.jit
def _row_values(src, cos_ptr, sin_ptr, offs, mask_kv, D: tl.constexpr, HALF: tl.constexpr):
    """Values at head-dim offsets ``offs`` of the rows ``src`` (``[BLOCK_KV]`` pointers), float32,
    rotated when ``HALF > 0`` and then rounded to the source dtype (what the reference quantizes).
    Any offsets work: each one loads its rotation partner (``d +- HALF``) itself."""
    m = mask_kv[:, None] & (offs < D)[None, :]
    x = tl.load(src[:, None] + offs[None, :], mask=m, other=0.0).to(tl.float32)
    if HALF > 0:
        first = offs < HALF
        rot = offs < 2 * HALF
        partner = tl.where(first, offs + HALF, offs - HALF)
        c = tl.load(cos_ptr + offs % HALF, mask=rot, other=1.0)[None, :]
        s = tl.load(sin_ptr + offs % HALF, mask=rot, other=0.0)[None, :]
        y = tl.load(src[:, None] + partner[None, :], mask=m & rot[None, :], other=0.0).to(tl.float32)
        # the reference's x1 * cos - x2 * sin and x2 * cos + x1 * sin; past 2 * HALF: x * 1 + 0 * 0
        x = tl.where(first[None, :], x * c - y * s, x * c + y * s)
        x = x.to(src.dtype.element_ty).to(tl.float32)
    return x, m


@triton.jit
def quant_write(
    src,  # [BLOCK_KV] pointers: each head's source row (model dtype)
    cos_ptr,  # this token's cos / sin row (HALF > 0 only)
    sin_ptr,
    dst,  # [BLOCK_KV] uint8 pointers: each head's codes in the cache
    dst_params,  # [BLOCK_KV] model-dtype pointers: each head's (scale, zero) pair
    mask_kv,
    D: tl.constexpr,
    HALF: tl.constexpr,
    QUANT: tl.constexpr,
    NPACK: tl.constexpr,
    BLOCK_P: tl.constexpr,
    SCALE_BITS: tl.constexpr,
    KEEP: tl.constexpr = False,  # also store the rotated rows back into src (in place)
):
    """Quantize the rows (rotated when ``HALF > 0``) and store codes, scale and zero; with ``KEEP``
    the rotated rows (rounded to the model dtype, what was quantized) go back into ``src``."""
    offs_p = tl.arange(0, BLOCK_P)  # byte index within the packed values
    QMAX: tl.constexpr = (1 << QUANT) - 1  # 255 or 15
    if QUANT == 8:
        xa, ma = _row_values(src, cos_ptr, sin_ptr, offs_p, mask_kv, D, HALF)
        lo = tl.min(tl.where(ma, xa, float("inf")), 1)
        hi = tl.max(tl.where(ma, xa, float("-inf")), 1)
    else:
        xa, ma = _row_values(src, cos_ptr, sin_ptr, 2 * offs_p, mask_kv, D, HALF)  # low nibbles
        xb, mb = _row_values(src, cos_ptr, sin_ptr, 2 * offs_p + 1, mask_kv, D, HALF)  # high
        lo = tl.minimum(tl.min(tl.where(ma, xa, float("inf")), 1), tl.min(tl.where(mb, xb, float("inf")), 1))
        hi = tl.maximum(
            tl.max(tl.where(ma, xa, float("-inf")), 1), tl.max(tl.where(mb, xb, float("-inf")), 1)
        )
    # the rows are model-dtype values, so the minimum is the stored zero exactly
    lo = tl.where(mask_kv, lo, 0.0)
    hi = tl.where(mask_kv, hi, 0.0)
    scale, inv = quant_params(lo, hi, src, QMAX, SCALE_BITS)
    codes = quant_codes(xa, lo, inv, QMAX)
    if QUANT == 4:
        codes = codes | (quant_codes(xb, lo, inv, QMAX) << 4)
    tl.store(
        dst[:, None] + offs_p[None, :],
        codes.to(tl.uint8),
        mask=mask_kv[:, None] & (offs_p < NPACK)[None, :],
    )
    tl.store(dst_params, scale, mask=mask_kv)
    tl.store(dst_params + 1, lo.to(src.dtype.element_ty), mask=mask_kv)
    if KEEP:
        # in place: other threads loaded these values as their rotation partners. The min / max
        # reductions above already waited for every thread's loads; the barrier says so explicitly.
        tl.debug_barrier()
        if QUANT == 8:
            tl.store(src[:, None] + offs_p[None, :], xa.to(src.dtype.element_ty), mask=ma)
        else:
            tl.store(src[:, None] + 2 * offs_p[None, :], xa.to(src.dtype.element_ty), mask=ma)
            tl.store(src[:, None] + 2 * offs_p[None, :] + 1, xb.to(src.dtype.element_ty), mask=mb)


@recordable
@triton.jit
def _rotary_kv_kernel(
    q_ptr,  # [T, H, D] (row stride free)
    k_ptr,  # [T, KV, D]
    v_ptr,  # [T, KV, D]
    cos_ptr,  # [T, HALF] fp32
    sin_ptr,
    slot_ptr,  # [T] int64
    k_cache_ptr,  # [NB * BS, KV, D] viewed flat over slots, or uint8 blocks (kv_quant.py)
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
    stride_kb,  # block strides (a quantized cache is addressed per block, see kv_quant.py)
    stride_vb,
    H: tl.constexpr,
    KV: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,  # block size
    HALF: tl.constexpr,  # 0: no q, no rotation (a plain cache write)
    BLOCK_H: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr,  # 0 (float cache), 8 or 4
    NPACK: tl.constexpr,  # packed bytes of a quantized row
    BLOCK_P: tl.constexpr,
    SCALE_BITS: tl.constexpr,  # width of the model dtype (scale and zero)
    PDL: tl.constexpr,  # launched as a programmatic dependent (kernels/pdl.py)
    KEEP_K: tl.constexpr = False,  # k is rotated in place too (the prefill kernel's k_new)
    HEAD_PROGRAMS: tl.constexpr = True,  # a quantized write: one program per KV head (else all heads)
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    t = tl.program_id(0)
    # one program per (token, part): q's rotation, k's write and v's write run side by side (at
    # batch 1 a single program did them one after another, and a quantized write's reductions made
    # that chain the step's longest small kernel); a quantized write has one program per KV head
    # (a long prompt has programs enough without that: ``HEAD_PROGRAMS`` False, as for a float cache)
    part = tl.program_id(1) + (0 if HALF > 0 else 1)  # 0: q, then k (1) and v (2), or per head
    if QUANT == 0 or not HEAD_PROGRAMS:
        offs_kv = tl.arange(0, BLOCK_KV)
        mask_kv = offs_kv < KV
    else:
        offs_kv = (part - 1) % KV + tl.arange(0, 1)
        mask_kv = offs_kv < KV
        part = tl.where(part == 0, 0, 1 + (part - 1) // KV)
    if HALF > 0:
        offs_r = tl.arange(0, BLOCK_R)
        mask_r = offs_r < HALF
    if part == 0:
        if HALF > 0:
            cos = tl.load(cos_ptr + t * stride_cs + offs_r, mask=mask_r, other=1.0)
            sin = tl.load(sin_ptr + t * stride_cs + offs_r, mask=mask_r, other=0.0)
            offs_h = tl.arange(0, BLOCK_H)
            mask_h = offs_h < H
            qt = q_ptr + t * stride_qt
            o1, o2, m = _rotate_rows(qt, cos, sin, offs_h, mask_h, offs_r, mask_r, stride_qh, HALF)
            pq = qt + offs_h[:, None] * stride_qh + offs_r[None, :]
            tl.store(pq, o1.to(q_ptr.dtype.element_ty), mask=m)
            tl.store(pq + HALF, o2.to(q_ptr.dtype.element_ty), mask=m)
    else:
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            offs_d = tl.arange(0, BLOCK_D)
            if part == 1:
                kt = k_ptr + t * stride_kt
                if QUANT == 0:
                    if HALF > 0:
                        cos = tl.load(cos_ptr + t * stride_cs + offs_r, mask=mask_r, other=1.0)
                        sin = tl.load(sin_ptr + t * stride_cs + offs_r, mask=mask_r, other=0.0)
                        k1, k2, mk = _rotate_rows(
                            kt, cos, sin, offs_kv, mask_kv, offs_r, mask_r, stride_kh, HALF
                        )
                        pk = k_cache_ptr + slot * stride_ks + offs_kv[:, None] * stride_kch + offs_r[None, :]
                        tl.store(pk, k1.to(k_cache_ptr.dtype.element_ty), mask=mk)
                        tl.store(pk + HALF, k2.to(k_cache_ptr.dtype.element_ty), mask=mk)
                        if KEEP_K:
                            pkk = kt + offs_kv[:, None] * stride_kh + offs_r[None, :]
                            tl.store(pkk, k1.to(k_ptr.dtype.element_ty), mask=mk)
                            tl.store(pkk + HALF, k2.to(k_ptr.dtype.element_ty), mask=mk)
                        # dims past the rotary part (partial rotary) are copied as they are
                        offs_p = 2 * HALF + offs_d
                    else:
                        offs_p = offs_d
                    mp = mask_kv[:, None] & (offs_p < D)[None, :]
                    kp = tl.load(kt + offs_kv[:, None] * stride_kh + offs_p[None, :], mask=mp, other=0.0)
                    tl.store(
                        k_cache_ptr + slot * stride_ks + offs_kv[:, None] * stride_kch + offs_p[None, :],
                        kp.to(k_cache_ptr.dtype.element_ty),
                        mask=mp,
                    )
                else:
                    cs = t * stride_cs
                    blk = k_cache_ptr + (slot // BS) * stride_kb
                    codes, params = quant_rows(blk, slot % BS, offs_kv, k_ptr, BS, KV, NPACK)
                    quant_write(
                        kt + offs_kv * stride_kh,
                        cos_ptr + cs,
                        sin_ptr + cs,
                        codes,
                        params,
                        mask_kv,
                        D,
                        HALF,
                        QUANT,
                        NPACK,
                        BLOCK_P,
                        SCALE_BITS,
                        KEEP_K,
                    )
            else:
                vt = v_ptr + t * stride_vt
                if QUANT == 0:
                    mv = mask_kv[:, None] & (offs_d < D)[None, :]
                    v = tl.load(vt + offs_kv[:, None] * stride_vh + offs_d[None, :], mask=mv, other=0.0)
                    tl.store(
                        v_cache_ptr + slot * stride_vs + offs_kv[:, None] * stride_vch + offs_d[None, :],
                        v.to(v_cache_ptr.dtype.element_ty),
                        mask=mv,
                    )
                else:
                    blk = v_cache_ptr + (slot // BS) * stride_vb
                    codes, params = quant_rows(blk, slot % BS, offs_kv, v_ptr, BS, KV, NPACK)
                    quant_write(
                        vt + offs_kv * stride_vh,
                        cos_ptr,
                        sin_ptr,
                        codes,
                        params,
                        mask_kv,
                        D,
                        0,
                        QUANT,
                        NPACK,
                        BLOCK_P,
                        SCALE_BITS,
                    )


def _launch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    half: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    rotate_k: bool = False,
) -> None:
    """Shared checks and launch: ``half == 0`` writes k and v only (q, cos and sin unused)."""
    T, KV, D = k.shape
    H = q.shape[1]
    check(v.shape == (T, KV, D), f"v {tuple(v.shape)} != k {tuple(k.shape)}")
    check(v.dtype == k.dtype, f"k is {k.dtype}, v {v.dtype}")
    check_dtype("k", k, FLOAT_DTYPES)
    nb, bs, kvc, row = k_cache.shape
    check(v_cache.shape == k_cache.shape, "v_cache and k_cache differ in shape")
    check(v_cache.dtype == k_cache.dtype, "v_cache and k_cache differ in dtype")
    policy = kv_quant.cache_policy(k_cache, D, k.dtype)  # a uint8 row of the wrong width raises
    check(kvc == KV and (policy > 0 or row == D), f"cache heads/dim {(kvc, row)} != k's {(KV, D)}")
    if policy:
        kv_quant.check_head_dim(D, policy)
    check(slot_mapping.shape == (T,) and slot_mapping.dtype == torch.int64, "slot_mapping must be [T] int64")
    for name, t in (("q", q), ("k", k), ("v", v), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_last_contiguous(name, t)
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if policy:  # addressed per block (kv_quant.py): each block's bytes must be dense
            check(
                c.stride()[1:] == (kvc * row, row, 1), f"{name}: blocks must be dense, strides {c.stride()}"
            )
        else:  # addressed by flat slot
            check(c.stride(0) == bs * c.stride(1), f"{name} blocks must be dense over tokens")
    if T == 0:
        return
    npack = kv_quant.packed_bytes(D, policy) if policy else 0
    q_st, k_st, v_st, cos_st, k_cache_st, v_cache_st = (
        q.stride(),
        k.stride(),
        v.stride(),
        cos.stride(),
        k_cache.stride(),
        v_cache.stride(),
    )
    # k and v, per head when quantized, unless the tokens alone make programs enough (the program
    # count, not the bytes, set a long prompt's time: 16,384 tokens x 17 programs took 0.44 ms a
    # layer on the H200, the float cache's 3 programs per token 0.12 ms)
    head_programs = bool(policy) and T < HEAD_PROGRAMS_BELOW
    parts = 2 * KV if head_programs else 2
    _rotary_kv_kernel[(T, parts + (1 if half > 0 else 0))](
        q,
        k,
        v,
        cos,
        sin,
        slot_mapping,
        k_cache,
        v_cache,
        q_st[0],
        q_st[1],
        k_st[0],
        k_st[1],
        v_st[0],
        v_st[1],
        cos_st[0],
        k_cache_st[1],
        k_cache_st[2],
        v_cache_st[1],
        v_cache_st[2],
        k_cache_st[0],
        v_cache_st[0],
        H=H,
        KV=KV,
        D=D,
        BS=bs,
        HALF=half,
        BLOCK_H=next_power_of_2(H),
        BLOCK_KV=next_power_of_2(KV),
        BLOCK_R=next_power_of_2(max(half, 1)),
        BLOCK_D=next_power_of_2(D),
        QUANT=policy,
        NPACK=npack,
        BLOCK_P=block_packed(npack),
        SCALE_BITS=8 * k.element_size(),
        PDL=pdl(q.device),
        KEEP_K=rotate_k and half > 0,
        HEAD_PROGRAMS=head_programs,
        num_warps=4,
        # a quantized write must see the reference's rounding of the rotated k: no fma contraction
        enable_fp_fusion=policy == 0,
        **launch_kwargs(q.device),
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
    rotate_k: bool = False,
) -> None:
    """Rotate q ``[T, H, D]`` in place; rotate k ``[T, KV, D]`` and store it and v at ``slot_mapping``.
    ``rotate_k``: k is rotated in place as well (rounded to its dtype, the values a quantized cache
    stores codes of; rows with a negative slot are left as they are), for the prefill kernel's
    ``k_new``.

    cos / sin ``[T, half]`` float32 (``2 * half <= D``); caches ``[num_blocks, block_size, KV, D]``
    in q's dtype, or ``uint8`` ``[num_blocks, block_size, KV, row_bytes]`` (quantized as written);
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
    check_dtype("q", q, FLOAT_DTYPES)
    check(k.dtype == q.dtype, f"q is {q.dtype}, k {k.dtype}")
    _launch(q, k, v, cos, sin, half, k_cache, v_cache, slot_mapping, rotate_k)


def write_kv_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store k, v ``[T, KV, D]`` at ``slot_mapping`` ``[T]`` int64 (negative: skip), quantizing them
    when the cache is ``uint8``: ``reference.write_kv_cache`` in one launch, without rotation."""
    check(k.dim() == 3 and v.dim() == 3, "k, v must be [T, KV, D]")
    _launch(k, k, v, k, k, 0, k_cache, v_cache, slot_mapping)
