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

One row of 16-bit activations can instead take ``_w4a16_gemv_half2_kernel`` (``unpack="half2"``):
dequantization and multiply-add two columns per instruction in packed 16-bit PTX, partial sums over
a few k rows in 16 bits, then float32 (its docstring; about half the instructions per weight).

Launched by ``w4a16_gemm.w4a16_gemm`` (path ``gemv``); see that module for the other paths.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hotloop.kernels.pdl import gdc_launch_dependents, gdc_wait

_F32_MAGIC = tl.constexpr(0x4B000000)  # the bits of 2^23; the low 23 bits are the mantissa


@triton.jit
def lop3_and_or(v, m, c):
    """``(v & m) | c`` (int32 tensors) in one PTX ``lop3``, where the compiler would emit an AND and
    an OR (GPU only: inline PTX does not run in the interpreter). Constant ``m`` / ``c`` become
    immediates in the SASS."""
    return tl.inline_asm_elementwise(
        "lop3.b32 $0, $1, $2, $3, 0xEA;", "=r,r,r,r", [v, m, c], dtype=tl.int32, is_pure=True, pack=1
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
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()  # programmatic dependent launch (kernels/pdl.py): x is written by the kernel before
        gdc_launch_dependents()
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
            v = w[:, :, None] >> shifts[None, None, :]
            fq = lop3_and_or(v, tl.full(v.shape, 0xF, tl.int32), tl.full(v.shape, _F32_MAGIC, tl.int32))
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
    PDL: tl.constexpr,
):
    """One row of ``x`` (the ``unpack="mask"`` GEMV): nibbles are masked in place, not shifted.

    AWQ's order puts column ``2j`` in nibble ``j`` of a word's low half and column ``2j + 1`` in
    nibble ``j`` of its high half. ORing ``nibble j`` (still at bits ``4j..4j+3``) into 2^23 gives
    the float ``2^23 + q * 16^j`` exactly, and the zero point the same way gives ``2^23 + z * 16^j``,
    so their difference is ``(q - z) * 16^j``, exact; the ``16^-j`` goes into the column's scale
    (a power of two: exact). Per word: one shift (the high half), then per weight one mask-and-OR
    and one subtraction, where the shift-per-column kernel above spends a shift, a mask and an OR.
    The even and odd columns stay apart to the end and are stored interleaved."""
    if PDL:
        gdc_wait()  # programmatic dependent launch (kernels/pdl.py): x is written by the kernel before
        gdc_launch_dependents()
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
            fe = lop3_and_or(lo, mask3, magic)
            fo = lop3_and_or(hi, mask3, magic)
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


# -- the packed 16-bit GEMV (``unpack="half2"``) ------------------------------------------------------
# A 32-bit register holds two 16-bit floats (a "half2"); one PTX ``f16x2`` / ``bf16x2`` instruction
# works on both. ``lop3(v, mask, magic2, 0xEA)`` is ``(v & mask) | magic2``, the magic in both halves:
# fp16 1024.0 (0x6400, ulp 1: ten mantissa bits, room for a nibble at bits 0-3 or 4-7), bf16 128.0
# (0x4300, ulp 1: seven mantissa bits, room for a nibble at bits 0-3 only).
#
# Column pair ``i`` of a word (columns ``2i`` and ``2i + 1``, nibbles ``i`` and ``i + 4``) is read as
# ``lop3(w >> SHIFT_i, MASK_i, magic2)``, the floats ``magic + q * 16^e_i``; one packed fma
# ``v * S_i + Z_i``, ``S_i = 16^-e_i / D`` and ``Z_i = -(magic + z * 16^e_i) * S_i`` (from the zero-point
# word, once per K step), leaves ``(q - z) / D`` exactly (a 4-bit integer over a power of two), and a
# second packed fma adds ``x (q - z) / D`` to the 16-bit partial sum. fp16: pairs 0 and 1 in place
# (nibbles at bits 0-3 and 4-7 of each half, ``e`` 0 and 1), pairs 2 and 3 from ``w >> 8``: one
# shift per word; ``D = 16`` gives the fp16 partial sums 16 times the headroom below 65504 (the
# result is multiplied back in float32). bf16: every pair at bits 0-3 (shifts by 4, 8 and 12),
# ``S = 1``, ``D = 1`` (bf16 has float32's range). fp16's D is fixed: the PTX constants ``s4``, ``s8``
# and ``neg_s`` and ``_pair_params``'s scales encode it; they change together.
_HALF2_D_F16 = tl.constexpr(16.0)

# One k row of one word-column: ``$4`` the AWQ word, ``$5`` the activation in both halves, ``$6..$9``
# ``Z_0..Z_3``, ``$10..$13`` the four packed partial sums; out ``$0..$3``, the new partial sums.
_HALF2_ROW_F16 = tl.constexpr("""{
.reg .b32 t, d, s4, s8;
mov.b32 s4, 0x2C002C00;
mov.b32 s8, 0x1C001C00;
lop3.b32 d, $4, 0x000F000F, 0x64006400, 0xEA;
fma.rn.f16x2 d, d, s4, $6;
fma.rn.f16x2 $0, d, $5, $10;
lop3.b32 d, $4, 0x00F000F0, 0x64006400, 0xEA;
fma.rn.f16x2 d, d, s8, $7;
fma.rn.f16x2 $1, d, $5, $11;
shr.u32 t, $4, 8;
lop3.b32 d, t, 0x000F000F, 0x64006400, 0xEA;
fma.rn.f16x2 d, d, s4, $8;
fma.rn.f16x2 $2, d, $5, $12;
lop3.b32 d, t, 0x00F000F0, 0x64006400, 0xEA;
fma.rn.f16x2 d, d, s8, $9;
fma.rn.f16x2 $3, d, $5, $13;
}""")
_HALF2_ROW_BF16 = tl.constexpr("""{
.reg .b32 t, d, one;
mov.b32 one, 0x3F803F80;
lop3.b32 d, $4, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 d, d, one, $6;
fma.rn.bf16x2 $0, d, $5, $10;
shr.u32 t, $4, 4;
lop3.b32 d, t, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 d, d, one, $7;
fma.rn.bf16x2 $1, d, $5, $11;
shr.u32 t, $4, 8;
lop3.b32 d, t, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 d, d, one, $8;
fma.rn.bf16x2 $2, d, $5, $12;
shr.u32 t, $4, 12;
lop3.b32 d, t, 0x000F000F, 0x43004300, 0xEA;
fma.rn.bf16x2 d, d, one, $9;
fma.rn.bf16x2 $3, d, $5, $13;
}""")


@triton.jit
def _half(v, HIGH: tl.constexpr, DTYPE: tl.constexpr):
    """The low or high 16-bit float of the int32 ``v``, in ``DTYPE``."""
    if HIGH:
        v = v >> 16
    return v.to(tl.int16).to(DTYPE, bitcast=True)


@triton.jit
def _bits16(f, DTYPE: tl.constexpr):
    """float32 ``f`` rounded to the nearest 16-bit ``DTYPE`` float (ties to even), its bits in the
    low half of an int32. bf16 by integer arithmetic: the interpreter's float32-to-bf16 conversion
    truncates."""
    if DTYPE == tl.bfloat16:
        b = f.to(tl.int32, bitcast=True)
        return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) & 0xFFFF  # finite values only
    else:
        return f.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF


@triton.jit
def _pack_rounded(lo, hi, DTYPE: tl.constexpr):
    """Two float32 tensors, each rounded to ``DTYPE`` -> the int32 with ``lo`` in its low half."""
    return _bits16(lo, DTYPE) | (_bits16(hi, DTYPE) << 16)


@triton.jit
def _halves_f32(v, DTYPE: tl.constexpr):
    """The two 16-bit floats of the int32 ``v`` as float32 ``(low, high)`` (exact)."""
    if DTYPE == tl.bfloat16:  # a bf16 is the top half of its float32
        return (v << 16).to(tl.float32, bitcast=True), (v & -65536).to(tl.float32, bitcast=True)
    else:
        return _half(v, False, DTYPE).to(tl.float32), _half(v, True, DTYPE).to(tl.float32)


@triton.jit
def _pair_params(i: tl.constexpr, DTYPE: tl.constexpr):
    """``(SHIFT_i, MASK_i, S_i)`` of column pair ``i`` (see the comment above the PTX)."""
    if DTYPE == tl.bfloat16:
        return 4 * i, 0x000F000F, 1.0
    else:
        if i % 2 == 0:
            return (i // 2) * 8, 0x000F000F, 1.0 / 16
        else:
            return (i // 2) * 8, 0x00F000F0, 1.0 / 256


@triton.jit
def _pair_magic(v, i: tl.constexpr, DTYPE: tl.constexpr):
    """``(v >> SHIFT_i) & MASK_i | magic2``: column pair ``i`` of the words ``v`` as ``magic + q 16^e``."""
    shift, mask, scale = _pair_params(i, DTYPE)
    magic2: tl.constexpr = 0x43004300 if DTYPE == tl.bfloat16 else 0x64006400
    return ((v >> shift) & mask) | magic2


@triton.jit
def _zero_pair(zw, i: tl.constexpr, DTYPE: tl.constexpr, ASM: tl.constexpr):
    """``Z_i = -(magic + z 16^e) S_i`` for column pair ``i`` of the zero-point words, packed (exact:
    ``S_i`` is a power of two)."""
    shift, mask, scale = _pair_params(i, DTYPE)
    v = _pair_magic(zw, i, DTYPE)
    if ASM:  # one packed multiply (an fma with -0.0: bf16x2 mul needs sm_90)
        bf16: tl.constexpr = DTYPE == tl.bfloat16
        asm: tl.constexpr = "fma.rn.bf16x2 $0, $1, $2, $3;" if bf16 else "fma.rn.f16x2 $0, $1, $2, $3;"
        # -S_i: bf16 -1.0; fp16 -2^-4 (nibble at bits 0-3) or -2^-8 (bits 4-7)
        neg_s: tl.constexpr = 0xBF80BF80 if bf16 else (0xAC00AC00 if i % 2 == 0 else 0x9C009C00)
        return tl.inline_asm_elementwise(
            asm,
            "=r,r,r,r",
            [v, tl.full(v.shape, neg_s, tl.int32), tl.full(v.shape, -2147450880, tl.int32)],  # 0x80008000
            dtype=tl.int32,
            is_pure=True,
            pack=1,
        )
    else:
        # in float32: the interpreter keeps bf16 as raw bits and cannot compute on them
        lo = _half(v, False, DTYPE).to(tl.float32) * -scale
        return _pack_rounded(lo, _half(v, True, DTYPE).to(tl.float32) * -scale, DTYPE)


@triton.jit
def _fma_pair_emulated(w, i: tl.constexpr, xx, z, p, DTYPE: tl.constexpr):
    """The PTX's two packed fmas for column pair ``i``, in Triton with the same 16-bit roundings:
    ``d = v S + Z`` is exact; the product of two 16-bit floats is exact in float32, so rounding
    ``d x + p`` to float32 and then to 16 bits is the packed fma's single rounding (save at the rare
    exact ties of the second rounding)."""
    shift, mask, scale = _pair_params(i, DTYPE)
    v = _pair_magic(w, i, DTYPE)
    x = _half(xx, False, DTYPE).to(tl.float32)
    d_lo = _half(v, False, DTYPE).to(tl.float32) * scale + _half(z, False, DTYPE).to(tl.float32)
    d_hi = _half(v, True, DTYPE).to(tl.float32) * scale + _half(z, True, DTYPE).to(tl.float32)
    lo = d_lo * x + _half(p, False, DTYPE).to(tl.float32)
    return _pack_rounded(lo, d_hi * x + _half(p, True, DTYPE).to(tl.float32), DTYPE)


@triton.jit
def _half2_row(w, xx, z0, z1, z2, z3, p0, p1, p2, p3, DTYPE: tl.constexpr, ASM: tl.constexpr):
    """One k row of AWQ words ``w`` into the packed partial sums ``p0..p3`` of column pairs 0..3:
    ``p_i += x (q - z) / D`` in 16-bit arithmetic; ``xx`` holds the row's activation in both halves,
    ``z_i`` is ``Z_i``. ``ASM``: one inline-PTX block (GPU); else the same roundings in Triton."""
    if ASM:
        asm: tl.constexpr = _HALF2_ROW_BF16 if DTYPE == tl.bfloat16 else _HALF2_ROW_F16
        return tl.inline_asm_elementwise(
            asm,
            "=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r",
            [w, xx, z0, z1, z2, z3, p0, p1, p2, p3],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True,
            pack=1,
        )
    else:
        return (
            _fma_pair_emulated(w, 0, xx, z0, p0, DTYPE),
            _fma_pair_emulated(w, 1, xx, z1, p1, DTYPE),
            _fma_pair_emulated(w, 2, xx, z2, p2, DTYPE),
            _fma_pair_emulated(w, 3, xx, z3, p3, DTYPE),
        )


@triton.jit
def _split4(t, A: tl.constexpr, B: tl.constexpr):
    """``[A, B, 4]`` -> its four ``[A, B]`` slices in order."""
    e, o = tl.split(tl.reshape(t, (A, B, 2, 2)))  # last index 2u + v: v = 0 in e, 1 in o
    e0, e1 = tl.split(e)
    o0, o1 = tl.split(o)
    return e0, o0, e1, o1


@triton.jit
def _broadcast_halves(xw, ASM: tl.constexpr):
    """int32 words of two activations ``(a, b)`` -> ``(a, a)`` and ``(b, b)``. On the GPU as 16-bit
    moves, which ptxas folds into the fma's operand (``.H0_H0`` / ``.H1_H1``): no instruction (a
    ``prmt`` here cost one per row and element)."""
    if ASM:
        lo = tl.inline_asm_elementwise(
            "{ .reg .b16 l, h; mov.b32 {l, h}, $1; mov.b32 $0, {l, l}; }",
            "=r,r",
            [xw],
            dtype=tl.int32,
            is_pure=True,
            pack=1,
        )
        hi = tl.inline_asm_elementwise(
            "{ .reg .b16 l, h; mov.b32 {l, h}, $1; mov.b32 $0, {h, h}; }",
            "=r,r",
            [xw],
            dtype=tl.int32,
            is_pure=True,
            pack=1,
        )
        return lo, hi
    else:
        return (xw & 0xFFFF) | (xw << 16), ((xw >> 16) & 0xFFFF) | (xw & -65536)


@triton.jit
def _half2_rows(w_ptrs, xw_ptrs, mask, z0, z1, z2, z3, p0, p1, p2, p3, C: tl.constexpr, BLOCK_N8: tl.constexpr,
                DTYPE: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    """Four k rows into the packed partial sums ``p0..p3`` ``[C, BLOCK_N8]`` of the column pairs:
    ``w_ptrs`` ``[C, BLOCK_N8, 4]`` (rows last), ``xw_ptrs`` ``[C, 2]`` the activation words of the
    same rows."""
    w = tl.load(w_ptrs, mask=mask, other=0)
    w0, w1, w2, w3 = _split4(w, C, BLOCK_N8)
    xa, xb = tl.split(tl.load(xw_ptrs))  # [C]: rows (0, 1) and (2, 3)
    x0, x1 = _broadcast_halves(xa[:, None], ASM)
    x2, x3 = _broadcast_halves(xb[:, None], ASM)
    p0, p1, p2, p3 = _half2_row(w0, x0, z0, z1, z2, z3, p0, p1, p2, p3, DTYPE, ASM)
    p0, p1, p2, p3 = _half2_row(w1, x1, z0, z1, z2, z3, p0, p1, p2, p3, DTYPE, ASM)
    p0, p1, p2, p3 = _half2_row(w2, x2, z0, z1, z2, z3, p0, p1, p2, p3, DTYPE, ASM)
    p0, p1, p2, p3 = _half2_row(w3, x3, z0, z1, z2, z3, p0, p1, p2, p3, DTYPE, ASM)
    return p0, p1, p2, p3


@triton.jit
def _w4a16_gemv_half2_kernel(
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
    ROWS: tl.constexpr,
    SPLIT: tl.constexpr,
    FIXUP: tl.constexpr,
    ASM: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PDL: tl.constexpr,
):
    """One row of 16-bit ``x`` (the ``unpack="half2"`` GEMV): dequantization and multiply-add of two
    columns per instruction in packed 16-bit arithmetic, over ``ROWS`` k rows at a time.

    Each program element is one word-column (8 output columns, 4 column pairs) over ``ROWS``
    consecutive k rows: a K step's ``[BLOCK_K, BLOCK_N / 8]`` word tile is loaded as
    ``[C, BLOCK_N / 8, ROWS]`` (``C = BLOCK_K / ROWS``, rows last) and split into its rows in
    registers, the activations as ``[C, ROWS / 2]`` words. Per row and column pair one ``lop3`` and
    two packed fmas (the comment above the PTX) add ``x (q - z) / D`` to a packed 16-bit partial sum:
    ``q - z`` is exact, each fma rounds once to 16 bits. After the element's ``ROWS`` rows its
    partial sums go to float32 and are multiplied by the group's scales (float32: the scale never
    enters the 16-bit arithmetic) into float32 accumulators ``[C, BLOCK_N / 8]`` per column, summed
    over ``C`` after the K loop and multiplied by ``D``. So the 16-bit error is that of ``ROWS``-term
    sums: ``ROWS`` (a multiple of 4; ``w4a16_gemm.HALF2_ROWS``) is the precision knob. An fp16 partial
    sum overflows only where ``15 / 16`` of the sum of ``|x|`` over the element's rows passes 65504.

    ``ASM`` 0 runs the same arithmetic in Triton, with the same 16-bit roundings (the interpreter,
    where inline PTX does not run). ``BLOCK_K`` divides the group; x's K stride is 1; split K as in
    the other GEMV kernels."""
    if PDL:
        gdc_wait()  # programmatic dependent launch (kernels/pdl.py): x is written by the kernel before
        gdc_launch_dependents()
    BLOCK_N8: tl.constexpr = BLOCK_N // 8
    C: tl.constexpr = BLOCK_K // ROWS
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    d_scale: tl.constexpr = 1.0 if DTYPE == tl.bfloat16 else _HALF2_D_F16
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_w = pid_n * BLOCK_N8 + tl.arange(0, BLOCK_N8)
    mask_w = offs_w < n8
    offs_c = tl.arange(0, C)
    r4 = tl.arange(0, 4)
    # element (c, j), row r of the step: tile row c * ROWS + r
    w_ptrs = qw_ptr + (offs_c[:, None, None] * ROWS + r4[None, None, :]) * n8 + offs_w[None, :, None]
    mask3 = mask_w[None, :, None]
    xw_ptrs = x_ptr.to(tl.pointer_type(tl.int32)) + offs_c[:, None] * (ROWS // 2) + tl.arange(0, 2)[None, :]
    s_ptrs = s_ptr.to(tl.pointer_type(tl.int32)) + offs_w[None, :, None] * 4 + r4[None, None, :]  # pair words

    k_per_split = tl.multiple_of(K // split_k, BLOCK_K)
    k_begin = tl.multiple_of(pid_k * k_per_split, BLOCK_K)
    zero = tl.zeros((C, BLOCK_N8), dtype=tl.float32)
    a0l, a0h, a1l, a1h, a2l, a2h, a3l, a3h = zero, zero, zero, zero, zero, zero, zero, zero
    for kk in tl.range(0, k_per_split, BLOCK_K, num_stages=NUM_STAGES):
        k0 = k_begin + kk
        group = k0 // GROUP_SIZE
        zw = tl.load(qz_ptr + group * n8 + offs_w[None, :], mask=mask_w[None, :], other=0)
        z0 = _zero_pair(zw, 0, DTYPE, ASM)
        z1 = _zero_pair(zw, 1, DTYPE, ASM)
        z2 = _zero_pair(zw, 2, DTYPE, ASM)
        z3 = _zero_pair(zw, 3, DTYPE, ASM)
        p0 = tl.zeros((C, BLOCK_N8), dtype=tl.int32)  # +0.0 in both halves
        p1 = p0
        p2 = p0
        p3 = p0
        for r in tl.static_range(0, ROWS, 4):  # one ROWS-term 16-bit sum per element and column
            p0, p1, p2, p3 = _half2_rows(w_ptrs + (k0 + r) * n8, xw_ptrs + (k0 + r) // 2, mask3, z0, z1, z2,
                                         z3, p0, p1, p2, p3, C, BLOCK_N8, DTYPE, ASM)  # fmt: skip
        sw = tl.load(s_ptrs + group * (N // 2), mask=mask3, other=0)  # [1, BLOCK_N8, 4]
        sw0, sw1, sw2, sw3 = _split4(sw, 1, BLOCK_N8)
        s_lo, s_hi = _halves_f32(sw0, DTYPE)
        f_lo, f_hi = _halves_f32(p0, DTYPE)
        a0l += f_lo * s_lo
        a0h += f_hi * s_hi
        s_lo, s_hi = _halves_f32(sw1, DTYPE)
        f_lo, f_hi = _halves_f32(p1, DTYPE)
        a1l += f_lo * s_lo
        a1h += f_hi * s_hi
        s_lo, s_hi = _halves_f32(sw2, DTYPE)
        f_lo, f_hi = _halves_f32(p2, DTYPE)
        a2l += f_lo * s_lo
        a2h += f_hi * s_hi
        s_lo, s_hi = _halves_f32(sw3, DTYPE)
        f_lo, f_hi = _halves_f32(p3, DTYPE)
        a3l += f_lo * s_lo
        a3h += f_hi * s_hi

    # column 8c + 2i + h of word-column c is a_i{l,h}: the even columns [BLOCK_N8, 4] and the odd
    # ones (join(join(a0, a2), join(a1, a3))[.., t, u] = a_{2t + u})
    acc_e = tl.join(
        tl.join(tl.sum(a0l, axis=0), tl.sum(a2l, axis=0)), tl.join(tl.sum(a1l, axis=0), tl.sum(a3l, axis=0))
    )
    acc_o = tl.join(
        tl.join(tl.sum(a0h, axis=0), tl.sum(a2h, axis=0)), tl.join(tl.sum(a1h, axis=0), tl.sum(a3h, axis=0))
    )
    acc_e = tl.reshape(acc_e, (BLOCK_N8, 4)) * d_scale
    acc_o = tl.reshape(acc_o, (BLOCK_N8, 4)) * d_scale
    cols_e = offs_w[:, None] * 8 + 2 * tl.arange(0, 4)[None, :]
    mask_c = mask_w[:, None] & (cols_e < N)
    _flush_row(acc_e, out_ptr, ws_ptr, 0, pid_k, cols_e, mask_c, M, N, SPLIT)
    _flush_row(acc_o, out_ptr, ws_ptr, 0, pid_k, cols_e + 1, mask_c, M, N, SPLIT)
    if SPLIT and FIXUP:
        if _last_split_arrives(cnt_ptr, pid_n, split_k):
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            _sum_row(out_ptr, ws_ptr, 0, split_k, offs_n, offs_n < N, M, N, BLOCK_N)
            tl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed", scope="gpu")
