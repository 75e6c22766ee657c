"""Decode attention over the paged KV cache (one query token per sequence), Triton.

One program per (sequence, KV head, split): the ``G = num_heads / num_kv_heads`` query heads of a
GQA group are the rows of one tile, so each K/V row is read from memory once for the whole group.
Long contexts are cut into ``num_splits`` ranges that run in parallel (flash-decoding); a second
kernel merges the partial results by their log-sum-exp (or, with ``fuse_merge``, the last split of
each (sequence, KV head) to finish does, counted with an atomic: ``kernels/counters.py``). The split count depends only on the batch
size, never on the context lengths, so a captured CUDA graph stays valid as sequences grow.
Sequences with ``seq_len == 0`` (padding rows of a graph) produce zeros.

A quantized (``uint8``, int8 or int4, see ``kv_quant.py``) cache runs the same kernel with
``QUANT`` 8 or 4: each K/V tile is read as codes plus per-row scale and zero and dequantized in
registers. Scores take the K scale and zero after the dot, ``s = (q . codes) * scale + sum(q) * zero``,
so the dot runs on the exact integer codes; V's scale goes onto the probabilities and its zero into
a row sum, ``o += (p * scale) . codes + sum(p * zero)``, so V's codes need no arithmetic either.

An int8 cache at head dim 128 (GQA groups up to 8, no window, the merge in its own launch) goes to
a CUDA C kernel instead where one can be built (``kv_int8_decode_cuda.py``: a cp.async ring and
tensor-core dots; it writes the same partials for ``_merge_kernel``); an explicit ``config`` always
runs this Triton kernel. (CUDA kernels whose splits merged through a thread-block cluster, for int8
and for 16-bit caches, were slower than a kernel plus the merge launch at batch 1 on the H200,
benchmarks/results/gpu_2026-12-01e, and were removed.)

Early reads: the CUDA int8 kernel (by default where its grid fits the SMs once; its fused write;
``HOTLOOP_KV_CUDA_EARLY=1``) and this kernel
over a 16-bit cache (``HOTLOOP_DECODE_EARLY=1``) may request cache rows before they wait for the
kernel launched just before them, all but each sequence's newest token. The contract that makes this
safe: that kernel may write this step's new tokens and nothing else of the cache, and every kernel of
the step waits for its own predecessor before it lets the next one start (``kernels/pdl.py``), so
anything older is written.

Tiles start at multiples of ``BLOCK_N`` (a sliding window's first tile masks the tokens before the
window). For a quantized cache whose block size is a multiple of ``BLOCK_N`` a tile lies in one
page, and its rows are addressed from one block-table entry.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotloop.kernels import counters, kv_int8_decode_cuda, kv_quant
from hotloop.kernels.checks import (
    FLOAT_DTYPES,
    check,
    check_dtype,
    check_last_contiguous,
    check_launch_config,
)
from hotloop.kernels.kv_quant_triton import (
    code_mode,
    load_kv_params,
    quant_rows,
    quant_scores,
    quant_scores_split,
    quant_weighted_values,
    quant_weighted_values_split,
    split_eo_mask,
    to_dot_dtype,
)
from hotloop.kernels.launch_math import cdiv, next_power_of_2
from hotloop.kernels.launch_replay import recordable
from hotloop.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_kwargs, pdl
from hotloop.kernels.rotary_kv_write import rotary_kv_write, write_kv_cache

_LOG2E = 1.4426950408889634
_MAX_SPLITS = 16
_TARGET_PROGRAMS = 264  # about two waves of an H200's 132 SMs
_TARGET_PROGRAMS_INT8 = 512  # see num_decode_splits


@recordable
@triton.jit
def _decode_kernel(
    q_ptr,  # [B, H, D]
    k_cache_ptr,  # [NB, BS, KV, D], or uint8 [NB, BS, KV, row_bytes] when QUANT (per block: kv_quant.py)
    v_cache_ptr,
    block_tables_ptr,  # [B, W] int32
    seq_lens_ptr,  # [B] int32
    out_ptr,  # [B, H, D] (one split) or partial [B, H, S, D] fp32
    lse_ptr,  # [B, H, S] fp32 (unused with one split)
    fin_ptr,  # [B, H, D]: the merged output (MERGE only)
    cnt_ptr,  # [B * KV] int32 arrival counters, zero between launches (MERGE only)
    scale_log2,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_bt,
    stride_ob,
    stride_oh,
    stride_fb,
    stride_fh,
    G: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    QUANT: tl.constexpr,  # 0: float cache; 8 / 4: int8 / int4 codes + scale and zero per row
    NPACK: tl.constexpr,  # bytes of a quantized row's codes (its block's (scale, zero) pairs follow all codes)
    KV: tl.constexpr,  # KV heads (a quantized block is [BS, KV] codes, then [BS, KV] scale/zero pairs)
    ASM: tl.constexpr,  # how codes are read: bit 1 PTX byte permutes (GPU), bit 2 int8 as pairs,
    # bit 4 even/odd split dots (kv_quant_triton.code_mode_bits)
    PDL: tl.constexpr,  # launched as a programmatic dependent (kernels/pdl.py)
    MERGE: tl.constexpr,  # with splits: the last split of a (sequence, KV head) to finish merges
    EARLY: tl.constexpr = False,  # (a float cache, no window) the first tile requested before the wait
    HEADS_FIRST: tl.constexpr = False,  # the grid is (KV, B, splits): a sequence's heads run side by side
):
    # EARLY: the first tile's K and V rows are requested before the wait for the kernel before (which
    # may write this step's new token, and nothing else of the cache: the module doc), all but the
    # newest token's row, which is read after it; that tile is then attended before the loop
    PRE: tl.constexpr = EARLY and QUANT == 0 and WINDOW == 0
    if PDL and not PRE:
        gdc_wait()
        gdc_launch_dependents()
    if HEADS_FIRST:
        kvh = tl.program_id(0)
        b = tl.program_id(1)
    else:
        b = tl.program_id(0)
        kvh = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)
    lo = 0
    first = 0  # the first tile's start: a multiple of BLOCK_N (no tile crosses a page when BS % BLOCK_N == 0)
    if WINDOW > 0:
        lo = tl.maximum(seq_len - WINDOW, 0)
        first = (lo // BLOCK_N) * BLOCK_N
    ctx = seq_len - first
    chunk = tl.cdiv(tl.cdiv(ctx, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = first + split * chunk
    end = tl.minimum(start + chunk, seq_len)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    mask_g = offs_g < G
    mask_d = offs_d < D
    heads = kvh * G + offs_g
    q_rows = q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :]
    if PRE:  # q is the kernel before's output: loaded after the wait (below)
        q = tl.zeros([BLOCK_G, BLOCK_D], q_ptr.dtype.element_ty)
    else:
        q = tl.load(q_rows, mask=mask_g[:, None] & mask_d[None, :], other=0.0)  # [BLOCK_G, BLOCK_D]
    # QUANT: the dots run in fp16 (float32 models: float32) on ``CODE_OFFSET + code`` values; q goes to
    # fp16 once, and its row sum multiplies the K zero points and cancels the offset.
    qd = to_dot_dtype(q)
    q_sum = tl.sum(qd.to(tl.float32), 1)
    # ASM bit 4 (16-bit models): q's even and odd head dims dot the codes of even and odd dims
    # separately, and the output is kept as its even and odd halves (kv_quant_triton.load_kv_codes_split)
    EO: tl.constexpr = QUANT != 0 and (ASM & 4) != 0
    if EO:
        tl.static_assert(q_ptr.dtype.element_ty != tl.float32, "the even/odd split is for 16-bit models")
        offs_h = tl.arange(0, BLOCK_D // 2)
        mask_h = mask_g[:, None] & (offs_h < D // 2)[None, :]
        q_row = q_ptr + b * stride_qb + heads[:, None] * stride_qh + 2 * offs_h[None, :]
        q_even = to_dot_dtype(tl.load(q_row, mask=mask_h, other=0.0))
        q_odd = to_dot_dtype(tl.load(q_row + 1, mask=mask_h, other=0.0))
        # from the halves: the full q above is then unused and not loaded
        q_sum = tl.sum(q_even.to(tl.float32), 1) + tl.sum(q_odd.to(tl.float32), 1)
        acc_even = tl.zeros([BLOCK_G, BLOCK_D // 2], tl.float32)
        acc_odd = tl.zeros([BLOCK_G, BLOCK_D // 2], tl.float32)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    table = block_tables_ptr + b * stride_bt
    loop_start = start
    if PRE:
        loop_start = start + BLOCK_N
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        page = tl.load(table + offs_n // BS, mask=mask_n, other=0).to(tl.int64)
        tok = offs_n % BS
        k_rows = (
            k_cache_ptr + (page * stride_kb + tok * stride_kt + kvh * stride_kh)[:, None] + offs_d[None, :]
        )
        v_rows = (
            v_cache_ptr + (page * stride_vb + tok * stride_vt + kvh * stride_vh)[:, None] + offs_d[None, :]
        )
        newest = (offs_n == seq_len - 1)[:, None] & mask_d[None, :]
        kmask = mask_n[:, None] & mask_d[None, :]
        k = tl.load(k_rows, mask=kmask & ~newest, other=0.0)
        v = tl.load(v_rows, mask=kmask & ~newest, other=0.0)
        if PDL:
            gdc_wait()
            gdc_launch_dependents()
        q = tl.load(q_rows, mask=mask_g[:, None] & mask_d[None, :], other=0.0)
        k = tl.where(newest, tl.load(k_rows, mask=kmask & newest, other=0.0), k)
        v = tl.where(newest, tl.load(v_rows, mask=kmask & newest, other=0.0), v)
        if start < end:  # (an empty split has nothing to attend: its m_i stays -inf)
            m_i, l_i, acc = _float_tile(q, k, v, mask_n, m_i, l_i, acc, scale_log2)
    for n0 in range(loop_start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        if WINDOW > 0:
            mask_n = mask_n & (offs_n >= lo)
        if QUANT != 0 and BS % BLOCK_N == 0:
            # the tile lies in one page: one block-table entry, and rows at a constant stride. With
            # the single V-correction reduction, the loop's sm_90 SASS per token (ptxas_report.py
            # default): int8 21.6 -> 17.5 instructions, int4 16.7 -> 13.6 (the quantized kernels
            # are instruction-bound, BENCHMARKS.md); not yet timed on a GPU. bf16 (8.6 -> 5.7, but
            # at its bandwidth floor already) keeps the measured path.
            page = tl.load(table + n0 // BS).to(tl.int64)
            tok = n0 % BS + tl.arange(0, BLOCK_N)
        else:
            page = tl.load(table + offs_n // BS, mask=mask_n, other=0).to(tl.int64)
            tok = offs_n % BS
        kmask = mask_n[:, None] & mask_d[None, :]
        if QUANT == 0:
            k = tl.load(
                k_cache_ptr
                + (page * stride_kb + tok * stride_kt + kvh * stride_kh)[:, None]
                + offs_d[None, :],
                mask=kmask,
                other=0.0,
            )  # [BLOCK_N, BLOCK_D]
            s = tl.dot(q, tl.trans(k)) * scale_log2  # [BLOCK_G, BLOCK_N], log2 units
        else:
            # codes at constexpr offsets in the block: Triton sees 16-byte alignment and vectorizes
            k_rows, k_par = quant_rows(k_cache_ptr + page * stride_kb, tok, kvh, q_ptr, BS, KV, NPACK)
            k_scale, k_zero = load_kv_params(k_par, mask_n)
            if EO:
                s = quant_scores_split(q_even, q_odd, q_sum, k_rows, mask_n, BLOCK_D, NPACK, QUANT, ASM)
            else:
                s = quant_scores(qd, q_sum, k_rows, mask_n, q_ptr, BLOCK_D, NPACK, QUANT, ASM)  # q . codes
            s = (s * k_scale[None, :] + q_sum[:, None] * k_zero[None, :]) * scale_log2
        s = tl.where(mask_n[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if QUANT == 0:
            v = tl.load(
                v_cache_ptr
                + (page * stride_vb + tok * stride_vt + kvh * stride_vh)[:, None]
                + offs_d[None, :],
                mask=kmask,
                other=0.0,
            )
        else:
            v_rows, v_par = quant_rows(v_cache_ptr + page * stride_vb, tok, kvh, q_ptr, BS, KV, NPACK)
            v_scale, v_zero = load_kv_params(v_par, mask_n)
            if EO:
                pv_even, pv_odd = quant_weighted_values_split(
                    p, v_scale, v_zero, v_rows, mask_n, BLOCK_D, NPACK, QUANT, ASM
                )
                acc_even = acc_even * alpha[:, None] + pv_even
                acc_odd = acc_odd * alpha[:, None] + pv_odd
            else:
                pv = quant_weighted_values(
                    p, v_scale, v_zero, v_rows, mask_n, q_ptr, qd.dtype, BLOCK_D, NPACK, QUANT, ASM
                )
                acc = acc * alpha[:, None] + pv
        if QUANT == 0:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    safe_l = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / safe_l[:, None]
    omask = mask_g[:, None] & mask_d[None, :]
    if NUM_SPLITS == 1:
        if EO:
            dst = out_ptr + b * stride_ob + heads[:, None] * stride_oh + 2 * offs_h[None, :]
            tl.store(dst, (acc_even / safe_l[:, None]).to(out_ptr.dtype.element_ty), mask=mask_h)
            tl.store(dst + 1, (acc_odd / safe_l[:, None]).to(out_ptr.dtype.element_ty), mask=mask_h)
        else:
            tl.store(
                out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                o.to(out_ptr.dtype.element_ty),
                mask=omask,
            )
    else:
        # partial output [B, H, S, D] and its log2-sum-exp [B, H, S], both contiguous
        row = (b * (G * KV) + heads) * NUM_SPLITS + split  # [BLOCK_G]
        if EO:
            dst = out_ptr + row[:, None] * D + 2 * offs_h[None, :]
            tl.store(dst, acc_even / safe_l[:, None], mask=mask_h)
            tl.store(dst + 1, acc_odd / safe_l[:, None], mask=mask_h)
        else:
            tl.store(out_ptr + row[:, None] * D + offs_d[None, :], o, mask=omask)
        lse = tl.where(l_i > 0.0, m_i + tl.log2(safe_l), float("-inf"))
        tl.store(lse_ptr + row, lse, mask=mask_g)
        if MERGE:
            _merge_last(out_ptr, lse_ptr, fin_ptr, cnt_ptr, b, kvh, KV, heads, row - split, mask_g, offs_d,
                        mask_d, stride_fb, stride_fh, D, NUM_SPLITS, BLOCK_G, BLOCK_D)  # fmt: skip


@triton.jit
def _float_tile(q, k, v, mask_n, m_i, l_i, acc, scale_log2):
    """One tile of a float cache, as ``_decode_kernel``'s loop attends it: the scores of ``q``
    ``[BLOCK_G, BLOCK_D]`` against ``k`` ``[BLOCK_N, BLOCK_D]`` (tokens past ``mask_n`` out), the
    running max / sum ``m_i`` / ``l_i`` and output ``acc`` updated with ``v``."""
    s = tl.dot(q, tl.trans(k)) * scale_log2
    s = tl.where(mask_n[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _merge_last(
    part_ptr,
    lse_ptr,
    fin_ptr,
    cnt_ptr,
    b,
    kvh,
    nkv,  # KV heads (the grid's order varies: HOTLOOP_DECODE_GRID)
    heads,
    row0,  # [BLOCK_G]: the group's rows of split 0 in the partials
    mask_g,
    offs_d,
    mask_d,
    stride_fb,
    stride_fh,
    D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Count this split's arrival at its (sequence, KV head); the last of the ``NUM_SPLITS`` to
    arrive merges the group's partials (as ``_merge_kernel``, splits in order), writes the output and
    resets the counter. Saves the merge kernel's launch."""
    tl.debug_barrier()  # every thread's partial and lse are stored before the release below
    cnt = cnt_ptr + b * nkv + kvh
    arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
    if arrived == NUM_SPLITS - 1:
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        for s in range(NUM_SPLITS):
            m = tl.maximum(
                m, tl.load(lse_ptr + row0 + s, mask=mask_g, other=float("-inf"), cache_modifier=".cg")
            )
        m = tl.where(m == float("-inf"), 0.0, m)
        denom = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        pmask = mask_g[:, None] & mask_d[None, :]
        for s in range(NUM_SPLITS):
            w = tl.exp2(
                tl.load(lse_ptr + row0 + s, mask=mask_g, other=float("-inf"), cache_modifier=".cg") - m
            )
            part = tl.load(part_ptr + (row0 + s)[:, None] * D + offs_d[None, :], mask=pmask, other=0.0,
                           cache_modifier=".cg")  # fmt: skip
            denom += w
            acc += part * w[:, None]
        o = acc / tl.where(denom > 0.0, denom, 1.0)[:, None]
        dst = fin_ptr + b * stride_fb + heads[:, None] * stride_fh + offs_d[None, :]
        tl.store(dst, o.to(fin_ptr.dtype.element_ty), mask=pmask)
        tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")


@recordable
@triton.jit
def _merge_kernel(
    part_ptr,  # [B, H, S, D] fp32
    lse_ptr,  # [B, H, S] fp32
    out_ptr,  # [B, H, D]
    stride_ob,
    stride_oh,
    H: tl.constexpr,
    D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_s = offs_s < NUM_SPLITS
    mask_d = offs_d < D
    base = (b * H + h) * NUM_SPLITS
    lse = tl.load(lse_ptr + base + offs_s, mask=mask_s, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)  # [BLOCK_S]
    part = tl.load(
        part_ptr + (base + offs_s)[:, None] * D + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :],
        other=0.0,
    )
    denom = tl.sum(w, 0)
    o = tl.sum(part * w[:, None], 0) / tl.where(denom > 0.0, denom, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty), mask=mask_d)


def check_cache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[int, int]:
    """The caches' format for queries ``q`` ``[.., H, D]``: ``(policy, packed bytes)``, ``(0, 0)`` for
    a float cache (which must be in q's dtype). A ``uint8`` row must fit int8 or int4 at head_dim D."""
    D = q.shape[-1]
    check(v_cache.dtype == k_cache.dtype, f"k_cache is {k_cache.dtype}, v_cache {v_cache.dtype}")
    policy = kv_quant.cache_policy(k_cache, D, q.dtype)
    if policy == 0:
        check(k_cache.shape[-1] == D, f"head_dim: q has {D}, the cache {k_cache.shape[-1]}")
        check(k_cache.dtype == q.dtype, f"dtypes differ: q {q.dtype}, cache {k_cache.dtype}")
        return 0, 0
    kv_quant.check_head_dim(D, policy)
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        _nb, bs, kv, row = c.shape
        check(
            c.stride()[1:] == (kv * row, row, 1),
            f"{name}: a quantized cache's blocks must be dense (strides {c.stride()})",
        )
    return policy, kv_quant.packed_bytes(D, policy)


# HOTLOOP_DECODE_GRID: the launch order of this kernel's (sequence, KV head, split) programs. "heads"
# (the default: a sequence's KV heads side by side, so together they read whole 2 KB token rows of the
# [block, token, head, dim] cache, as the CUDA int8 kernel's default order does) or "seq" (sequences
# fastest: the programs resident together read one KV head of many sequences, 256-byte rows 2 KB
# apart). Measured on an H100 (benchmarks/results/gpu_2026-12-06g, Llama-3-8B batch-256 decode step,
# 1k context, alternating): 19.41 / 19.42 ms with "heads" against 19.84 / 19.90 with "seq". At batch 1
# the two orders launch the same programs in the same order.
GRID_ENV = "HOTLOOP_DECODE_GRID"
GRIDS = ("seq", "heads")


def grid_order() -> str:
    """The grid order HOTLOOP_DECODE_GRID names ("heads" when unset or empty); read at each launch."""
    raw = os.environ.get(GRID_ENV, "") or "heads"
    if raw not in GRIDS:
        raise ValueError(f"{GRID_ENV}={raw!r} must be one of {list(GRIDS)}")
    return raw


def num_decode_splits(batch: int, num_kv_heads: int, quant: int = 0) -> int:
    """How many context splits per (sequence, KV head): enough programs to fill the GPU. A power of
    two, so that only five kernel variants exist (each is compiled once, see ``SPLIT_CHOICES``; the
    decode graphs' fused-merge variants of ``decode_plan`` are compiled when they are captured).

    An int8 cache (``quant`` 8) aims at twice the programs: its tiles take more instructions per byte,
    so more of them must be in flight. H200, Llama-3-8B shape, 1k context, ms per layer in a CUDA
    graph (``kv_attention_sweep.py --splits``, 2026-11-30 thirteenth session ``call4``): batch 16
    0.027 with 4 splits against 0.036 with 2; batch 4 0.010 with 16 against 0.013 with 8; batches 1,
    32 and 64 unchanged (16, 2, 1). For bf16 the 264-program choice was the fastest at batches 1, 16,
    32 and 64, and 0.001 ms behind 16 splits at batch 4."""
    target = _TARGET_PROGRAMS_INT8 if quant == 8 else _TARGET_PROGRAMS
    want = max(1, min(MAX_SPLITS, cdiv(target, batch * num_kv_heads)))
    return 1 << (want.bit_length() - 1)


SPLIT_CHOICES = tuple(1 << i for i in range(_MAX_SPLITS.bit_length()))  # 1, 2, 4, 8, 16


def _max_splits_from_env() -> int:
    """``HOTLOOP_DECODE_MAX_SPLITS`` (a power of two up to 16) caps the splits: one split writes the
    output directly and needs no merge launch, at the cost of a longer chain per program."""
    raw = os.environ.get("HOTLOOP_DECODE_MAX_SPLITS", str(_MAX_SPLITS))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value not in SPLIT_CHOICES:
        raise ValueError(f"HOTLOOP_DECODE_MAX_SPLITS={raw!r} must be one of {SPLIT_CHOICES}")
    return value


MAX_SPLITS = _max_splits_from_env()


# int8 codes read as 16-bit pairs: 0.420 against 0.484 ms per layer with bytes (B=256 x 1k, H200)
INT8_PAIRS = True


# With splits, the last split to finish merges (``_merge_last``) instead of a second kernel.
# HOTLOOP_DECODE_FUSED_MERGE=1 fuses it everywhere, =0 nowhere; unset (``FUSE_MERGE`` None),
# ``decode_plan`` fuses it in the decode graphs where it was timed faster. At batch 1 it was slower
# (H200, 2026-11-30: Llama-3-8B 241.0 against 248.0 tokens/s, SmolLM2-135M 1,675 against 1,996).
def _fuse_merge_from_env() -> bool | None:
    raw = os.environ.get("HOTLOOP_DECODE_FUSED_MERGE", "").strip().lower()
    if raw == "":
        return None
    if raw in ("1", "true", "on", "yes"):
        return True
    if raw in ("0", "false", "off", "no"):
        return False
    raise ValueError(
        f"HOTLOOP_DECODE_FUSED_MERGE={raw!r} must be 1 (fuse the split merge everywhere), 0 (nowhere) "
        "or unset (in the decode graphs, where it was timed faster)"
    )


FUSE_MERGE: bool | None = _fuse_merge_from_env()


# HOTLOOP_DECODE_EARLY=1: over a 16-bit cache (no sliding window), in launches with splits (small
# batches), each program requests its first tile's K and V before it waits for the kernel before
# (the q/k/v projection), all but the newest token's row (``_decode_kernel``'s EARLY). Off by
# default: on an H200 at batch 1 (benchmarks/results/gpu_2026-12-01f) Llama-3-8B 0.35% slower,
# SmolLM2-135M 0.1-0.5% faster.
def _early_from_env() -> bool:
    raw = os.environ.get("HOTLOOP_DECODE_EARLY", "0").strip() or "0"
    if raw not in ("0", "1"):
        raise ValueError(f"HOTLOOP_DECODE_EARLY={raw!r} must be 0 or 1")
    return raw == "1"


EARLY: bool = _early_from_env()
# A 16-bit cache with head dim 128 and batch x KV heads in this range takes twice the splits, merged
# in the launch. H200, Llama-3-8B shape (8 KV heads), 1k context, us per layer in a CUDA graph
# (kv_attention_sweep.py, fourteenth session call4): batch 8 14.9 (8 splits, fused) against 16.7
# (4, launched merge); batch 16 22.4 (4, fused) against 27.8 (2, launched); batch 24 (192) was
# slower fused (34.1 / 34.7 against 30.9), as was batch 1. int8 and int4 were not clearly faster.
# Other KV-head counts with the same product (the same program count) take it untimed.
FUSED_MERGE_ROWS = (64, 128)


def decode_plan(
    batch: int,
    num_kv_heads: int,
    quant: int = 0,
    head_dim: int = 128,
    itemsize: int = 2,
    max_splits: int | None = None,
) -> tuple[int, bool]:
    """``(splits, fuse_merge)`` for a decode CUDA graph's batch (the layers ask for it only there:
    ``AttentionMetadata.graph``): ``num_decode_splits``, and, for a 16-bit cache with head dim 128
    whose ``batch * num_kv_heads`` lies in ``FUSED_MERGE_ROWS``, twice the splits with the merge in
    the same launch. A set HOTLOOP_DECODE_FUSED_MERGE (``FUSE_MERGE``) decides the merge instead.
    ``max_splits`` (a power of two) caps the splits below ``MAX_SPLITS``: a decode graph captured
    for short contexts (``AttentionMetadata.graph_max_splits``)."""
    check(
        max_splits is None or max_splits in SPLIT_CHOICES,
        f"max_splits={max_splits} must be one of {SPLIT_CHOICES}",
    )
    cap = MAX_SPLITS if max_splits is None else min(MAX_SPLITS, max_splits)
    splits = min(cap, num_decode_splits(batch, num_kv_heads, quant))
    if FUSE_MERGE is not None:
        return splits, FUSE_MERGE
    lo, hi = FUSED_MERGE_ROWS
    if (
        quant == 0
        and itemsize == 2
        and head_dim == 128
        and lo <= batch * num_kv_heads <= hi
        and splits * 2 <= cap
    ):
        return splits * 2, True
    return splits, False


def decode_config(quant: int, block_d: int, splits: int = 1) -> tuple[int, int, int]:
    """``(BLOCK_N, num_warps, num_stages)`` of the decode kernel for a cache format, head tile and
    number of context splits (more than one: a small batch, where each program's chain of tiles is
    short and its latency, not bandwidth, sets the time)."""
    # H200, Llama-3-8B shape (benchmarks/kv_attention_sweep.py, 2026-11-30, even/odd split dots):
    # int8 (64, 4, 2) 0.218 ms per layer at B=256 x 1k and 0.404 at B=128 x 4k (bf16 0.264 / 0.500),
    # against (128, 4, 2) 0.219 / 0.417 and (64, 4, 1) 0.244 / 0.451; int4 (128, 4, 2) 0.194 / 0.363,
    # against (64, 4, 2) 0.224 / 0.414. Register caps (a fourth entry, maxnreg) were all slower.
    if quant == 8 and block_d <= 128:
        # batch 1 (16 splits), Llama-3-8B step profile before the even/odd split: BLOCK_N 32 0.132 ms
        # for 32 layers, 64 0.149 (bf16 0.136): a 32-token tile's conversion chain is shorter
        return (32 if splits > 1 else 64), 4, 2
    if quant == 4 and block_d <= 128:
        return 128, 4, 2
    return (32 if block_d > 128 else 64), 4, 3


def decode_tile(
    quant: int,
    head_dim: int,
    group: int,
    window: int | None,
    splits: int,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    fuse_merge: bool = False,
) -> int:
    """The keys per tile of the decode launch with ``splits`` splits (and the merge fused in or
    not) over these caches, for a layer of ``head_dim`` and GQA ``group``: the CUDA int8 kernel's 64
    where it takes the launch (``kv_int8_decode_cuda.takes``), else ``decode_config``'s ``BLOCK_N``.
    A split covers whole tiles, so this is what the short-context decode graphs' limits count in."""
    if quant == 8:
        q = torch.empty((1, group, head_dim), dtype=torch.bfloat16, device=k_cache.device)
        if kv_int8_decode_cuda.takes(
            q, k_cache, v_cache, quant, group, window or 0, fuse_merge and splits > 1
        ):
            return kv_int8_decode_cuda.TILE
    return decode_config(quant, max(16, next_power_of_2(head_dim)), splits)[0]


def _write_first(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, w: kv_int8_decode_cuda.FusedWrite
) -> None:
    """``write_kv`` where the fused kernel does not take it: the rotary embedding and KV write (the
    write alone where q and k arrived rotated)."""
    if w.rotated:
        write_kv_cache(w.k, w.v, k_cache, v_cache, w.slots)
    else:
        rotary_kv_write(q, w.k, w.v, w.cos, w.sin, k_cache, v_cache, w.slots)


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    config: tuple[int, ...] | None = None,
    fuse_merge: bool | None = None,
    graph_plan: bool = False,
    write_kv: kv_int8_decode_cuda.FusedWrite | None = None,
    max_splits: int | None = None,
) -> torch.Tensor:
    """One new query per sequence attends over its paged context (``decode_attention_partials``,
    then the merge of the splits where the launch left them unmerged).

    q ``[B, H, D]``; k_cache / v_cache ``[num_blocks, block_size, KV, D]`` in q's dtype, or
    ``uint8`` ``[num_blocks, block_size, KV, row_bytes]`` (int8 / int4, ``kv_quant.py``); block_tables
    ``[B, W]`` int32; seq_lens ``[B]`` int32 (tokens in the cache, the new one included).
    Returns ``[B, H, D]`` in q's dtype (into ``out`` when given). ``config`` overrides the launch
    configuration ``(BLOCK_N, num_warps, num_stages[, maxnreg])`` (``benchmarks/kv_attention_sweep.py``).
    ``fuse_merge``: with splits, the last split of each (sequence, KV head) merges them in the same
    launch instead of a second kernel (default: HOTLOOP_DECODE_FUSED_MERGE=1). ``graph_plan`` (a
    decode CUDA graph's launch): the split count and merge not given come from ``decode_plan``,
    with the splits capped at ``max_splits`` where given.
    """
    res = decode_attention_partials(
        q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window, num_splits, out, config,
        fuse_merge, graph_plan, write_kv, max_splits,
    )  # fmt: skip
    if res.part is not None:
        merge_partials(res)
    return res.out


@dataclass(frozen=True)
class DecodeResult:
    """A decode launch's output. ``part`` ``[B, H, S, D]`` and ``lse`` ``[B, H, S]`` (float32, log2
    units) are the splits' unmerged partials, or None where ``out`` ``[B, H, D]`` already holds the
    attention (one split, or the merge fused into the decode kernel). Unmerged, ``out`` is only
    allocated: ``merge_partials`` fills it, or a consumer merges as it reads (``dense_gemv``'s
    ``merge``)."""

    out: torch.Tensor
    part: torch.Tensor | None = None
    lse: torch.Tensor | None = None

    @property
    def splits(self) -> int:
        return 1 if self.part is None else self.part.shape[2]


def merge_partials(res: DecodeResult) -> torch.Tensor:
    """Merge ``res``'s splits by their log-sum-exp into ``res.out`` (one launch; nothing to do where
    they are merged already). Returns ``res.out``."""
    if res.part is None or res.lse is None:
        return res.out
    B, H, splits, D = res.part.shape
    out = res.out
    _merge_kernel[(B, H)](
        res.part,
        res.lse,
        out,
        out.stride(0),
        out.stride(1),
        H=H,
        D=D,
        NUM_SPLITS=splits,
        BLOCK_S=max(2, next_power_of_2(splits)),
        BLOCK_D=max(16, next_power_of_2(D)),
        PDL=pdl(out.device),
        num_warps=4,
        **launch_kwargs(out.device),
    )
    return out


def decode_attention_partials(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
    config: tuple[int, ...] | None = None,
    fuse_merge: bool | None = None,
    graph_plan: bool = False,
    write_kv: kv_int8_decode_cuda.FusedWrite | None = None,
    max_splits: int | None = None,
    exclude_newest: bool = False,
) -> DecodeResult:
    """``paged_decode_attention`` without the merge launch: the decode launch (Triton, or the CUDA
    int8 kernel), whose splits are left unmerged in the result's ``part`` / ``lse`` unless it merged
    them itself (see ``DecodeResult``). Same arguments, and ``exclude_newest``: the splits stop
    before each sequence's newest token (``decode_merge_write.py`` attends to it in the merge); only
    the CUDA int8 kernel with splits does that (``kv_int8_decode_cuda.takes``), anything else raises."""
    check(q.dim() == 3 and k_cache.dim() == 4, "q must be [B, H, D] and the caches [NB, BS, KV, D]")
    B, H, D = q.shape
    _nb, bs, kv, _row = k_cache.shape
    check(v_cache.shape == k_cache.shape, f"v_cache {tuple(v_cache.shape)} != k_cache {tuple(k_cache.shape)}")
    check_dtype("q", q, FLOAT_DTYPES)
    quant, npack = check_cache(q, k_cache, v_cache)
    check(H % kv == 0, f"num_heads={H} is not a multiple of num_kv_heads={kv}")
    check(block_tables.dim() == 2 and block_tables.shape[0] >= B, f"block_tables {tuple(block_tables.shape)}")
    check(seq_lens.shape[0] >= B, f"seq_lens has {seq_lens.shape[0]} rows for a batch of {B}")
    check(block_tables.dtype == torch.int32 and seq_lens.dtype == torch.int32, "block_tables/seq_lens: int32")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables)):
        check_last_contiguous(name, t)
    if out is None:
        out = torch.empty_like(q)
    check(out.shape == q.shape and out.stride(-1) == 1, f"out {tuple(out.shape)} must match q")
    G = H // kv
    if graph_plan:
        planned_splits, planned_merge = decode_plan(B, kv, quant, D, q.element_size(), max_splits)
        splits = num_splits or planned_splits
        fuse_merge = planned_merge if fuse_merge is None else fuse_merge
    else:
        splits = num_splits or num_decode_splits(B, kv, quant)
    block_g = max(16, next_power_of_2(G))
    block_d = max(16, next_power_of_2(D))
    if config is not None:
        check_launch_config("paged_decode_attention", config, ("BLOCK_N",), allow_maxnreg=True)
    block_n, num_warps, num_stages, *rest = config or decode_config(quant, block_d, splits)
    maxnreg = rest[0] if rest else None
    if splits > 1:
        part = torch.empty(B, H, splits, D, dtype=torch.float32, device=q.device)
        lse = torch.empty(B, H, splits, dtype=torch.float32, device=q.device)
        dst, dst_b, dst_h = part, 0, 0
    else:
        part = lse = out
        dst, dst_b, dst_h = out, out.stride(0), out.stride(1)
    q_st, k_cache_st, v_cache_st, block_tables_st = (
        q.stride(),
        k_cache.stride(),
        v_cache.stride(),
        block_tables.stride(),
    )
    use_pdl = pdl(q.device)
    if fuse_merge is None:
        fuse_merge = bool(FUSE_MERGE)
    fused = fuse_merge and splits > 1
    cuda_ok = (
        config is None
        and kv_int8_decode_cuda.why_not(q, k_cache, v_cache, quant, G, sliding_window or 0, fused) is None
    )
    check(
        not exclude_newest or (cuda_ok and splits > 1 and write_kv is None and not fused),
        "exclude_newest needs the CUDA int8 kernel with splits (kv_int8_decode_cuda.takes), unmerged",
    )
    if write_kv is not None and not (
        cuda_ok and kv_int8_decode_cuda.fused_why_not(q, k_cache, write_kv) is None
    ):
        _write_first(q, k_cache, v_cache, write_kv)
        write_kv = None
    launched = cuda_ok and kv_int8_decode_cuda.launch(
        q, k_cache, v_cache, block_tables, seq_lens, out, part if splits > 1 else None,
        lse if splits > 1 else None, scale * _LOG2E, splits, write_kv, exclude_newest,
    )  # fmt: skip
    if exclude_newest and not launched:
        raise RuntimeError("exclude_newest: the CUDA int8 decode kernels could not be built here")
    if write_kv is not None and not launched:  # the CUDA kernels could not be built here
        _write_first(q, k_cache, v_cache, write_kv)
    arrivals = counters.counters(q.device, "decode_merge", B * kv) if fused and not launched else None
    merge = arrivals is not None
    if not launched:
        heads_first = grid_order() == "heads" and B <= kv_int8_decode_cuda.MAX_GRID_Y
        _decode_kernel[(kv, B, splits) if heads_first else (B, kv, splits)](
            q,
            k_cache,
            v_cache,
            block_tables,
            seq_lens,
            dst,
            lse,
            out,
            arrivals if arrivals is not None else seq_lens,
            scale * _LOG2E,
            q_st[0],
            q_st[1],
            k_cache_st[0],
            k_cache_st[1],
            k_cache_st[2],
            v_cache_st[0],
            v_cache_st[1],
            v_cache_st[2],
            block_tables_st[0],
            dst_b,
            dst_h,
            out.stride(0),
            out.stride(1),
            G=G,
            D=D,
            BS=bs,
            NUM_SPLITS=splits,
            WINDOW=sliding_window or 0,
            BLOCK_G=block_g,
            BLOCK_D=block_d,
            BLOCK_N=block_n,
            QUANT=quant,
            NPACK=npack,
            KV=kv,
            ASM=(code_mode(q, INT8_PAIRS) & split_eo_mask(q.dtype, block_d)) if quant else 0,
            PDL=use_pdl,
            MERGE=merge,
            # (with splits only: the early tile holds 213 registers a thread against 96, which only
            # a small batch's grid, one wave at 2 blocks an SM, can afford; ptxas, sm_90)
            EARLY=EARLY and quant == 0 and not sliding_window and splits > 1,
            HEADS_FIRST=heads_first,
            num_warps=num_warps,
            num_stages=num_stages,
            maxnreg=maxnreg,
            **launch_kwargs(q.device),
        )
    if splits > 1 and not merge:
        return DecodeResult(out, part, lse)
    return DecodeResult(out)
