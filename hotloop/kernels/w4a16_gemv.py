"""W4A16 GEMV on CUDA cores: ``y = x @ W`` for 1 to 4 rows of ``x``, ``W`` in the AutoAWQ int4 layout.

Decode reads every weight once and does two flops per weight and row, so the kernel's job is to
stream the packed words at memory speed and spend few instructions per nibble. A program owns
``BLOCK_N`` output columns and a ``K / split_k`` slice of the rows. Per K step (one group or part
of one) it loads a ``[BLOCK_K, BLOCK_N / 8]`` tile of words once, broadcasts each word against the
eight shifts of its columns (AWQ's nibble order), and ORs each nibble into the mantissa of 2^23:
``bits(2^23) | q`` is the float ``2^23 + q``, so subtracting ``2^23 + z`` gives ``q - z`` exactly
without an integer-to-float conversion. ``x * (q - z)`` is summed over the step's rows in float32
and multiplied once by the group's scales. The K loop is a ``tl.range`` with ``NUM_STAGES``, which
makes Triton pipeline every load of the loop (words, zero points, scales, activations) through
shared memory although no ``tl.dot`` consumes them. Split-K partial sums are combined in-kernel by
the last program of each column tile (``w4a16_gemm._store_tile``'s counter scheme).

Launched by ``w4a16_gemm.w4a16_gemm`` (path ``gemv``); see that module for the other paths.
"""

from __future__ import annotations

import triton
import triton.language as tl

_F32_MAGIC = tl.constexpr(0x4B000000)  # the bits of 2^23; the low 23 bits are the mantissa


@triton.jit
def _lop3_nibble(v, magic: tl.constexpr):
    """``(v & 0xF) | magic`` in one PTX ``lop3`` (GPU only; not for the interpreter)."""
    m = tl.full(v.shape, magic, tl.int32)
    return tl.inline_asm_elementwise(
        "lop3.b32 $0, $1, 0xF, $2, 0xEA;", "=r,r,r", [v, m], dtype=tl.int32, is_pure=True, pack=1
    )


@triton.jit
def _load_pairs(ptr, base, PAIRS: tl.constexpr, mask):
    """``2 * PAIRS`` consecutive 16-bit floats from ``ptr + base`` (``base [R, 1]``, even) as float32
    ``[R, 2 * PAIRS]``, read as 32-bit words: Triton pipelines loads of words, not of 16-bit
    elements. A float32 ``ptr`` is read directly."""
    if ptr.dtype.element_ty == tl.float32:
        return tl.load(ptr + base + tl.arange(0, 2 * PAIRS)[None, :], mask=mask, other=0.0)
    else:
        words = tl.load(
            ptr.to(tl.pointer_type(tl.int32)) + base // 2 + tl.arange(0, PAIRS)[None, :], mask=mask, other=0
        )
        lo = words.to(tl.int16).to(ptr.dtype.element_ty, bitcast=True).to(tl.float32)
        hi = (words >> 16).to(tl.int16).to(ptr.dtype.element_ty, bitcast=True).to(tl.float32)
        return tl.reshape(tl.join(lo, hi), (base.shape[0], 2 * PAIRS))


@triton.jit
def _gemv_row(x_ptr, row, stride_xm, rows_k0, f, BLOCK_K: tl.constexpr):
    """``sum_k x[row, k] * f[k, :, :]`` -> ``[BLOCK_N / 8, 8]`` in float32 (x's K stride is 1)."""
    base = tl.zeros((1, 1), tl.int32) + row * stride_xm + rows_k0
    xv = tl.reshape(_load_pairs(x_ptr, base, BLOCK_K // 2, True), (BLOCK_K,))
    return tl.sum(xv[:, None, None] * f, axis=0)


@triton.jit
def _flush_row(acc, out_ptr, ws_ptr, row, pid_k, offs_n, mask_n, M, N, SPLIT: tl.constexpr):
    """Store a finished row (no split) or this split's partial of it."""
    if not SPLIT:
        tl.store(out_ptr + row * N + offs_n, acc.to(out_ptr.dtype.element_ty), mask=mask_n)
    else:
        tl.store(ws_ptr + (pid_k * M + row) * N + offs_n, acc, mask=mask_n)


@triton.jit
def _sum_row(out_ptr, ws_ptr, row, split_k, offs_n, mask_n, M, N, BLOCK_N: tl.constexpr):
    """The last split of a column tile: add the partials of ``row`` in split order and store."""
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for s in range(split_k):
        total += tl.load(ws_ptr + (s * M + row) * N + offs_n, mask=mask_n, other=0.0, cache_modifier=".cg")
    tl.store(out_ptr + row * N + offs_n, total.to(out_ptr.dtype.element_ty), mask=mask_n)


@triton.jit
def _last_split_arrives(cnt_ptr, pid_n, split_k):
    """Count this program's split of column tile ``pid_n`` in; true for the last to arrive, which
    then adds the partials (and resets the counter)."""
    tl.debug_barrier()  # every thread's partial is stored before the release below
    arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
    return arrived == split_k - 1


@triton.jit
def _w4a16_gemv_kernel(
    x_ptr,
    qw_ptr,
    qz_ptr,
    s_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    n8,
    stride_xm,
    stride_xk,
    split_k,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    FIXUP: tl.constexpr,
    LOP3: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    BLOCK_N8: tl.constexpr = BLOCK_N // 8
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_w = pid_n * BLOCK_N8 + tl.arange(0, BLOCK_N8)
    mask_w = offs_w < n8
    col = tl.arange(0, 8)
    shifts = (col % 2) * 16 + (col // 2) * 4  # column c of a word sits in nibble (c % 2) * 4 + c // 2
    mask_n2 = mask_w[:, None]
    offs_k = tl.arange(0, BLOCK_K)

    k_per_split = tl.multiple_of(K // split_k, BLOCK_K)  # whole BLOCK_K steps (the launcher's rule)
    k_begin = tl.multiple_of(pid_k * k_per_split, BLOCK_K)
    acc0 = tl.zeros((BLOCK_N8, 8), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N8, 8), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N8, 8), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N8, 8), dtype=tl.float32)
    for kk in tl.range(0, k_per_split, BLOCK_K, num_stages=NUM_STAGES):
        rows_k = k_begin + kk + offs_k
        w = tl.load(qw_ptr + rows_k[:, None] * n8 + offs_w[None, :], mask=mask_w[None, :], other=0)
        group = (k_begin + kk) // GROUP_SIZE
        zw = tl.load(qz_ptr + group * n8 + offs_w, mask=mask_w, other=0)
        sc = _load_pairs(s_ptr, group * N + offs_w[:, None] * 8, 4, mask_n2)  # [BLOCK_N8, 8]
        zf = (((zw[:, None] >> shifts[None, :]) & 0xF) | _F32_MAGIC).to(tl.float32, bitcast=True)
        if LOP3:  # mask and OR in one PTX instruction (the compiler emits two)
            fq = _lop3_nibble(w[:, :, None] >> shifts[None, None, :], _F32_MAGIC)
        else:
            fq = ((w[:, :, None] >> shifts[None, None, :]) & 0xF) | _F32_MAGIC
        f = fq.to(tl.float32, bitcast=True) - zf[None, :, :]  # q - z, exact
        acc0 += _gemv_row(x_ptr, 0, stride_xm, k_begin + kk, f, BLOCK_K) * sc
        if BLOCK_M > 1:
            acc1 += _gemv_row(x_ptr, 1, stride_xm, k_begin + kk, f, BLOCK_K) * sc
        if BLOCK_M > 2:
            acc2 += _gemv_row(x_ptr, 2, stride_xm, k_begin + kk, f, BLOCK_K) * sc
        if BLOCK_M > 3:
            acc3 += _gemv_row(x_ptr, 3, stride_xm, k_begin + kk, f, BLOCK_K) * sc

    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    _flush_row(tl.reshape(acc0, (BLOCK_N,)), out_ptr, ws_ptr, 0, pid_k, offs_n, mask_n, M, N, SPLIT)
    if BLOCK_M > 1:
        _flush_row(tl.reshape(acc1, (BLOCK_N,)), out_ptr, ws_ptr, 1, pid_k, offs_n, mask_n, M, N, SPLIT)
    if BLOCK_M > 2:
        _flush_row(tl.reshape(acc2, (BLOCK_N,)), out_ptr, ws_ptr, 2, pid_k, offs_n, mask_n, M, N, SPLIT)
    if BLOCK_M > 3:
        _flush_row(tl.reshape(acc3, (BLOCK_N,)), out_ptr, ws_ptr, 3, pid_k, offs_n, mask_n, M, N, SPLIT)
    if SPLIT and FIXUP:
        if _last_split_arrives(cnt_ptr, pid_n, split_k):
            _sum_row(out_ptr, ws_ptr, 0, split_k, offs_n, mask_n, M, N, BLOCK_N)
            if BLOCK_M > 1:
                _sum_row(out_ptr, ws_ptr, 1, split_k, offs_n, mask_n, M, N, BLOCK_N)
            if BLOCK_M > 2:
                _sum_row(out_ptr, ws_ptr, 2, split_k, offs_n, mask_n, M, N, BLOCK_N)
            if BLOCK_M > 3:
                _sum_row(out_ptr, ws_ptr, 3, split_k, offs_n, mask_n, M, N, BLOCK_N)
            tl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed", scope="gpu")


@triton.jit
def _lop3_and_or(v, m, c):
    """``(v & m) | c`` in one PTX ``lop3`` (GPU only; not for the interpreter)."""
    return tl.inline_asm_elementwise(
        "lop3.b32 $0, $1, $2, $3, 0xEA;", "=r,r,r,r", [v, m, c], dtype=tl.int32, is_pure=True, pack=1
    )


@triton.jit
def _w4a16_gemv_mask_kernel(
    x_ptr,
    qw_ptr,
    qz_ptr,
    s_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    n8,
    stride_xm,
    stride_xk,
    split_k,
    GROUP_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr,
    FIXUP: tl.constexpr,
    LOP3: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """One row of ``x`` (the ``unpack="mask"`` GEMV): nibbles are masked in place, not shifted.

    AWQ's order puts column ``2j`` in nibble ``j`` of a word's low half and column ``2j + 1`` in
    nibble ``j`` of its high half. ORing ``nibble j`` (still at bits ``4j..4j+3``) into 2^23 gives
    the float ``2^23 + q * 16^j`` exactly, and the zero point the same way gives ``2^23 + z * 16^j``,
    so their difference is ``(q - z) * 16^j``, exact; the ``16^-j`` goes into the column's scale
    (a power of two: exact). Per word: one shift (the high half), then per weight one mask-and-OR
    and one subtraction, where the shift-per-column kernel above spends a shift, a mask and an OR.
    The even and odd columns stay apart to the end and are stored interleaved."""
    BLOCK_N8: tl.constexpr = BLOCK_N // 8
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_w = pid_n * BLOCK_N8 + tl.arange(0, BLOCK_N8)
    mask_w = offs_w < n8
    j = tl.arange(0, 4)
    masks = 15 << (4 * j)  # nibble j of a 16-bit half, in place
    inv16 = ((127 - 4 * j) << 23).to(tl.float32, bitcast=True)  # 16^-j: its exponent bits, exact
    offs_k = tl.arange(0, BLOCK_K)
    magic = tl.full((BLOCK_K, BLOCK_N8, 4), _F32_MAGIC, tl.int32)
    mask3 = tl.broadcast_to(masks[None, None, :], (BLOCK_K, BLOCK_N8, 4))

    k_per_split = tl.multiple_of(K // split_k, BLOCK_K)
    k_begin = tl.multiple_of(pid_k * k_per_split, BLOCK_K)
    acc_e = tl.zeros((BLOCK_N8, 4), dtype=tl.float32)
    acc_o = tl.zeros((BLOCK_N8, 4), dtype=tl.float32)
    for kk in tl.range(0, k_per_split, BLOCK_K, num_stages=NUM_STAGES):
        rows_k = k_begin + kk + offs_k
        w = tl.load(qw_ptr + rows_k[:, None] * n8 + offs_w[None, :], mask=mask_w[None, :], other=0)
        group = (k_begin + kk) // GROUP_SIZE
        zw = tl.load(qz_ptr + group * n8 + offs_w, mask=mask_w, other=0)
        z_e = ((zw[:, None] & masks[None, :]) | _F32_MAGIC).to(tl.float32, bitcast=True)  # 2^23 + z 16^j
        z_o = (((zw[:, None] >> 16) & masks[None, :]) | _F32_MAGIC).to(tl.float32, bitcast=True)
        cols = group * N + offs_w[:, None] * 8 + 2 * j[None, :]
        sc_e = tl.load(s_ptr + cols, mask=mask_w[:, None], other=0.0).to(tl.float32) * inv16[None, :]
        sc_o = tl.load(s_ptr + cols + 1, mask=mask_w[:, None], other=0.0).to(tl.float32) * inv16[None, :]
        lo = tl.broadcast_to(w[:, :, None], (BLOCK_K, BLOCK_N8, 4))
        hi = tl.broadcast_to((w >> 16)[:, :, None], (BLOCK_K, BLOCK_N8, 4))
        if LOP3:
            fe = _lop3_and_or(lo, mask3, magic)
            fo = _lop3_and_or(hi, mask3, magic)
        else:
            fe = (lo & mask3) | magic
            fo = (hi & mask3) | magic
        f_e = fe.to(tl.float32, bitcast=True) - z_e[None, :, :]  # (q - z) 16^j, exact
        f_o = fo.to(tl.float32, bitcast=True) - z_o[None, :, :]
        base = tl.zeros((1, 1), tl.int32) + k_begin + kk
        xv = tl.reshape(_load_pairs(x_ptr, base, BLOCK_K // 2, True), (BLOCK_K,))
        acc_e += tl.sum(xv[:, None, None] * f_e, axis=0) * sc_e
        acc_o += tl.sum(xv[:, None, None] * f_o, axis=0) * sc_o

    cols_e = offs_w[:, None] * 8 + 2 * j[None, :]
    mask_c = mask_w[:, None] & (cols_e < N)
    _flush_row(acc_e, out_ptr, ws_ptr, 0, pid_k, cols_e, mask_c, M, N, SPLIT)
    _flush_row(acc_o, out_ptr, ws_ptr, 0, pid_k, cols_e + 1, mask_c, M, N, SPLIT)
    if SPLIT and FIXUP:
        if _last_split_arrives(cnt_ptr, pid_n, split_k):
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            _sum_row(out_ptr, ws_ptr, 0, split_k, offs_n, offs_n < N, M, N, BLOCK_N)
            tl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed", scope="gpu")
