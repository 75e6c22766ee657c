"""Triton building blocks for the int8 / int4 KV cache (the format is defined in ``kv_quant.py``).

Reading (attention): a 16-bit model's kernels dot fp16 ``1024 + code`` values
(``load_kv_codes_offset``) and take the offset back through row sums; a float32 model's read the
codes themselves (``load_kv_codes``). Codes are in natural head-dim order (int4: byte ``d // 2``,
low nibble for even ``d``). How codes are read is a bit field, the kernels' ``ASM`` constexpr
(``code_mode``): bit 1 builds the fp16 values with PTX byte permutes (GPU only; the interpreter
keeps integer ops), bit 2 reads int8 codes as 16-bit pairs split into even and odd codes (the
decode kernel's choice; prefill reads bytes), bit 4 dots q's even and odd head dims with the codes
of even and odd dims apart (``load_kv_codes_split``; int8 then always read as pairs; 16-bit models,
the decode kernel). ``HOTLOOP_KV_PRMT=0``, ``HOTLOOP_KV_INT8_PAIRS=0|1`` and ``HOTLOOP_KV_SPLIT_EO=0``
override them for comparisons; all are read once, at import. ``quant_rows`` finds a row's codes and its
(scale, zero) pair in a cache block (``kv_quant.py``: codes first, then the pairs, in the model
dtype), and ``load_kv_params`` reads the pair.

Writing: ``quant_params`` and ``quant_codes`` reproduce ``kv_quant.quantize`` bit for bit on values
that are already in the model dtype: the zero is the row minimum (exact in that dtype), the scale
``(max - min) / qmax`` is divided with IEEE rounding and rounded up into the model dtype, codes are
``round_half_even(clamp((x - zero) / scale))`` computed as ``(x - zero) * (1 / scale)`` like the
reference.

Code pointers are plain ``uint8`` pointers into the cache (offsets in bytes); a block's scales and
zeros are reached by casting the pointer to its pair region to the model dtype's pointer type
(``quant_rows``).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from hotloop.kernels.launch_math import next_power_of_2

# float32 min normal (torch.finfo(torch.float32).tiny): the reference's clamp before 1 / scale
_F32_TINY = tl.constexpr(1.1754943508222875e-38)
# Adding then subtracting 1.5 * 2**23 rounds a float32 in [0, 2**22) to the nearest integer, ties to
# even (what torch.round does), with ordinary round-to-nearest adds: no libdevice, so the same code
# runs under the interpreter.
_ROUND_MAGIC = tl.constexpr(12582912.0)


@triton.jit
def load_kv_codes(rows, mask_n, dtype_ptr, BLOCK_D: tl.constexpr, NPACK: tl.constexpr, QUANT: tl.constexpr):
    """Codes of cache rows ``rows`` (``[N]`` uint8 pointers to each row's first byte) as
    ``[N, BLOCK_D]`` values of ``dtype_ptr``'s element type (the model dtype: codes up to 255 are
    exact in fp16 and bf16), in natural head-dim order; 0 for rows off ``mask_n`` and past the row.

    Value ``2i`` of an int4 row is byte ``i``'s low nibble, ``2i + 1`` its high one. Only float32
    models read codes this way (16-bit ones use ``load_kv_codes_offset``)."""
    dt = dtype_ptr.dtype.element_ty
    if QUANT == 8:
        offs = tl.arange(0, BLOCK_D)
        b = tl.load(rows[:, None] + offs[None, :], mask=mask_n[:, None] & (offs < NPACK)[None, :], other=0)
        return b.to(dt)
    else:
        # one load per code (each byte read twice, from L1): a join + reshape feeding a float32 dot
        # crashes Triton's TritonGPUOptimizeDotOperands pass (sm_90, Triton 3.x), and only float32
        # models come here, where speed is not the point
        offs = tl.arange(0, BLOCK_D)
        b = tl.load(
            rows[:, None] + (offs // 2)[None, :], mask=mask_n[:, None] & (offs // 2 < NPACK)[None, :], other=0
        )
        return ((b >> ((offs % 2) * 4).to(tl.uint8)[None, :]) & 15).to(dt)


# fp16 bits of 1024.0: OR-ing a code c < 256 into the low mantissa bits gives the fp16 value
# 1024 + c exactly, with integer instructions only (a conversion instruction runs at a quarter of the
# integer rate and would bound the attention kernels at large batch).
CODE_OFFSET = tl.constexpr(1024.0)
_F16_1024_BITS = tl.constexpr(0x6400)


# Byte permutes build the fp16 codes on a GPU (``_bytes_to_offset_f16``); HOTLOOP_KV_PRMT=0 turns
# them off (the integer-op path, as in the interpreter), for comparison.
PRMT = os.environ.get("HOTLOOP_KV_PRMT", "1") != "0"


_INT8_PAIRS = os.environ.get("HOTLOOP_KV_INT8_PAIRS")  # "0" / "1" overrides each kernel's choice
# Even/odd split dots (bit 4, 16-bit models, the decode kernel): see ``load_kv_codes_split``.
# HOTLOOP_KV_SPLIT_EO=0 turns it off. On an H200 it took int8 decode from 0.261 to 0.218 ms and int4
# from 0.332 to 0.194 ms per layer at B=256 x 1k; in the prefill kernel it was slower (BENCHMARKS.md).
SPLIT_EO = os.environ.get("HOTLOOP_KV_SPLIT_EO", "1") != "0"


def split_eo_mask(dtype: torch.dtype, block_d: int) -> int:
    """The code-mode bits a decode launch keeps: the even/odd split (bit 4) needs fp16 dots at least
    16 wide (a 16-bit model, ``BLOCK_D >= 32``)."""
    return ~4 if dtype == torch.float32 or block_d < 32 else ~0


def code_mode(x: torch.Tensor, int8_pairs: bool) -> int:
    """The ``ASM`` bits of a quantized-KV kernel on ``x``'s device (see ``code_mode_bits``)."""
    on_gpu = x.is_cuda and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    return code_mode_bits(on_gpu, int8_pairs)


def code_mode_bits(on_gpu: bool, int8_pairs: bool) -> int:
    """1 = inline PTX permutes (compiled for a GPU, not interpreted), 2 = int8 codes read as 16-bit
    pairs (``int8_pairs``, the kernel's measured preference, unless HOTLOOP_KV_INT8_PAIRS says
    otherwise), 4 = even/odd split dots (HOTLOOP_KV_SPLIT_EO, on by default; the decode launcher
    masks it with ``split_eo_mask``, the prefill launcher drops it)."""
    pairs = int8_pairs if _INT8_PAIRS is None else _INT8_PAIRS != "0"
    return int(PRMT and on_gpu) | (2 if pairs else 0) | (4 if SPLIT_EO else 0)


# PTX for four bytes (one register, ``$2``) -> four fp16 ``1024 + byte`` (two registers): one byte
# permute per pair, the high byte of each half taken from 0x64 (fp16 1024.0 is 0x6400).
_PRMT_BYTES = tl.constexpr(
    "{ .reg .b32 t; mov.b32 t, 0x64646464; prmt.b32 $0, $2, t, 0x4140; prmt.b32 $1, $2, t, 0x4342; }"
)
# The same for the low and the high nibbles of four bytes (int4): permute, then mask each low byte.
_PRMT_LO_NIBBLES = tl.constexpr(
    "{ .reg .b32 t; mov.b32 t, 0x64646464; prmt.b32 $0, $2, t, 0x4140; prmt.b32 $1, $2, t, 0x4342;"
    " and.b32 $0, $0, 0xFF0FFF0F; and.b32 $1, $1, 0xFF0FFF0F; }"
)
_PRMT_HI_NIBBLES = tl.constexpr(
    "{ .reg .b32 t, w; mov.b32 t, 0x64646464; shr.b32 w, $2, 4; prmt.b32 $0, w, t, 0x4140;"
    " prmt.b32 $1, w, t, 0x4342; and.b32 $0, $0, 0xFF0FFF0F; and.b32 $1, $1, 0xFF0FFF0F; }"
)


@triton.jit
def _bytes_to_offset_f16(b, ASM: tl.constexpr, NIBBLE: tl.constexpr):
    """uint8 ``b`` -> fp16 ``1024 + v`` where v is the byte (``NIBBLE`` 0), its low (1) or high (2)
    nibble. ``ASM``: with byte permutes (GPU; two instructions per four bytes, four or five for
    nibbles); otherwise with 16-bit integer ops (also in the interpreter)."""
    if ASM:
        if NIBBLE == 0:
            return tl.inline_asm_elementwise(
                _PRMT_BYTES, "=r,=r,r", [b], dtype=tl.float16, is_pure=True, pack=4
            )
        elif NIBBLE == 1:
            return tl.inline_asm_elementwise(
                _PRMT_LO_NIBBLES, "=r,=r,r", [b], dtype=tl.float16, is_pure=True, pack=4
            )
        else:
            return tl.inline_asm_elementwise(
                _PRMT_HI_NIBBLES, "=r,=r,r", [b], dtype=tl.float16, is_pure=True, pack=4
            )
    else:
        w = b.to(tl.uint16)
        if NIBBLE == 1:
            w = w & 15
        elif NIBBLE == 2:
            w = w >> 4
        return (w | _F16_1024_BITS).to(tl.float16, bitcast=True)


_PRMT_EVEN_BYTES = tl.constexpr("{ .reg .b32 t; mov.b32 t, 0x64646464; prmt.b32 $0, $1, t, 0x4240; }")
_PRMT_ODD_BYTES = tl.constexpr("{ .reg .b32 t; mov.b32 t, 0x64646464; prmt.b32 $0, $1, t, 0x4341; }")


@triton.jit
def _pairs_to_offset_f16(w, ASM: tl.constexpr, ODD: tl.constexpr):
    """uint16 ``w`` (two int8 codes, little-endian) -> fp16 ``1024 + code`` of its low (``ODD`` 0)
    or high (1) byte; ``ASM`` as in ``_bytes_to_offset_f16`` (one permute per two values)."""
    if ASM:
        if ODD == 0:
            return tl.inline_asm_elementwise(
                _PRMT_EVEN_BYTES, "=r,r", [w], dtype=tl.float16, is_pure=True, pack=2
            )
        else:
            return tl.inline_asm_elementwise(
                _PRMT_ODD_BYTES, "=r,r", [w], dtype=tl.float16, is_pure=True, pack=2
            )
    else:
        if ODD == 0:
            w = w & 255
        else:
            w = w >> 8
        return (w | _F16_1024_BITS).to(tl.float16, bitcast=True)


@triton.jit
def load_kv_codes_offset(
    rows, mask_n, BLOCK_D: tl.constexpr, NPACK: tl.constexpr, QUANT: tl.constexpr, ASM: tl.constexpr
):
    """As ``load_kv_codes``, but each value is the fp16 ``CODE_OFFSET + code`` (built with integer
    ops, no conversion); rows off ``mask_n`` and dims past the row read ``CODE_OFFSET``. Callers
    subtract the offset's contribution after their dot. ``ASM``: see ``_bytes_to_offset_f16``."""
    if QUANT == 8 and (ASM & 2) == 0:
        offs = tl.arange(0, BLOCK_D)
        b = tl.load(rows[:, None] + offs[None, :], mask=mask_n[:, None] & (offs < NPACK)[None, :], other=0)
        return _bytes_to_offset_f16(b, ASM & 1, 0)
    elif QUANT == 8:
        # read as 16-bit pairs split into even and odd codes, like int4's nibbles: the join makes
        # Triton build the fp16 values where they were loaded and move them to the dot's layout as
        # fp16 (ldmatrix), instead of moving the bytes one by one (ld.shared.b8 per code, ptxas)
        offs_p = tl.arange(0, BLOCK_D // 2)
        w = tl.load(
            rows.to(tl.pointer_type(tl.uint16))[:, None] + offs_p[None, :],
            mask=mask_n[:, None] & (offs_p < NPACK // 2)[None, :],
            other=0,
        )
        even = _pairs_to_offset_f16(w, ASM & 1, 0)
        odd = _pairs_to_offset_f16(w, ASM & 1, 1)
        return tl.reshape(tl.join(even, odd), [rows.shape[0], BLOCK_D])
    else:
        offs_p = tl.arange(0, BLOCK_D // 2)
        b = tl.load(
            rows[:, None] + offs_p[None, :], mask=mask_n[:, None] & (offs_p < NPACK)[None, :], other=0
        )
        lo = _bytes_to_offset_f16(b, ASM & 1, 1)
        hi = _bytes_to_offset_f16(b, ASM & 1, 2)
        return tl.reshape(tl.join(lo, hi), [rows.shape[0], BLOCK_D])


@triton.jit
def load_kv_codes_split(
    rows, mask_n, BLOCK_D: tl.constexpr, NPACK: tl.constexpr, QUANT: tl.constexpr, ASM: tl.constexpr
):
    """The codes of even and of odd head dims, each ``[N, BLOCK_D // 2]`` fp16 ``CODE_OFFSET + code``
    (``CODE_OFFSET`` off ``mask_n`` and past the row): int8 read as 16-bit pairs, int4 as bytes
    (low nibble even, high odd). Dotting each half with the matching half of q (or writing each
    half of the output) needs no join of the two into head-dim order, which Triton lowers to
    register permutes or a trip through shared memory."""
    offs_p = tl.arange(0, BLOCK_D // 2)
    if QUANT == 8:
        w = tl.load(
            rows.to(tl.pointer_type(tl.uint16))[:, None] + offs_p[None, :],
            mask=mask_n[:, None] & (offs_p < NPACK // 2)[None, :],
            other=0,
        )
        return _pairs_to_offset_f16(w, ASM & 1, 0), _pairs_to_offset_f16(w, ASM & 1, 1)
    else:
        b = tl.load(
            rows[:, None] + offs_p[None, :], mask=mask_n[:, None] & (offs_p < NPACK)[None, :], other=0
        )
        return _bytes_to_offset_f16(b, ASM & 1, 1), _bytes_to_offset_f16(b, ASM & 1, 2)


@triton.jit
def quant_scores_split(
    q_even, q_odd, q_sum, rows, mask_n, BLOCK_D: tl.constexpr, NPACK: tl.constexpr, QUANT: tl.constexpr,
    ASM: tl.constexpr,
):  # fmt: skip
    """``quant_scores`` for a 16-bit model from q's even and odd head dims (fp16 ``[M, BLOCK_D // 2]``)."""
    even, odd = load_kv_codes_split(rows, mask_n, BLOCK_D, NPACK, QUANT, ASM)
    s = tl.dot(q_even, tl.trans(even))
    s = tl.dot(q_odd, tl.trans(odd), s)
    return s - CODE_OFFSET * q_sum[:, None]


@triton.jit
def quant_weighted_values_split(
    p, v_scale, v_zero, rows, mask_n, BLOCK_D: tl.constexpr, NPACK: tl.constexpr, QUANT: tl.constexpr,
    ASM: tl.constexpr,
):  # fmt: skip
    """``quant_weighted_values`` for a 16-bit model, as the even and the odd head dims of the
    result (each float32 ``[M, BLOCK_D // 2]``)."""
    pv = (p * v_scale[None, :]).to(tl.float16)
    corr = tl.sum(p * v_zero[None, :] - CODE_OFFSET * pv.to(tl.float32), 1)
    even, odd = load_kv_codes_split(rows, mask_n, BLOCK_D, NPACK, QUANT, ASM)
    return tl.dot(pv, even) + corr[:, None], tl.dot(pv, odd) + corr[:, None]


@triton.jit
def to_dot_dtype(x):
    """The dtype the quantized-KV dots run in: fp16 for a 16-bit ``x`` (clamped to fp16's finite
    range: a bf16 value can exceed it), float32 for float32."""
    if x.dtype == tl.float32:
        return x
    else:
        return tl.minimum(tl.maximum(x.to(tl.float32), -65504.0), 65504.0).to(tl.float16)


@triton.jit
def quant_scores(
    qd,
    q_sum,
    rows,
    mask_n,
    dtype_ptr,
    BLOCK_D: tl.constexpr,
    NPACK: tl.constexpr,
    QUANT: tl.constexpr,
    ASM: tl.constexpr,
):
    """``qd . codes`` for a tile of cache rows: ``[rows of qd, N]`` float32, the codes exact.
    ``qd`` is ``to_dot_dtype(q)`` and ``q_sum`` its row sum (float32). A 16-bit model dots fp16
    ``CODE_OFFSET + code`` values and takes the offset back; a float32 model dots the codes."""
    if qd.dtype == tl.float32:
        # float32 models are for exactness, not speed: full-precision dots, not tf32
        codes = load_kv_codes(rows, mask_n, dtype_ptr, BLOCK_D, NPACK, QUANT)
        return tl.dot(qd, tl.trans(codes), input_precision="ieee")
    else:
        c = load_kv_codes_offset(rows, mask_n, BLOCK_D, NPACK, QUANT, ASM)
        return tl.dot(qd, tl.trans(c)) - CODE_OFFSET * q_sum[:, None]


@triton.jit
def quant_weighted_values(
    p,
    v_scale,
    v_zero,
    rows,
    mask_n,
    dtype_ptr,
    DOT_DTYPE: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NPACK: tl.constexpr,
    QUANT: tl.constexpr,
    ASM: tl.constexpr,
):
    """``sum_n p[:, n] * (code_n * scale_n + zero_n)`` for a tile of V rows: ``[rows of p, BLOCK_D]``
    float32. The scale goes onto the probabilities and the zero into a row sum, so the codes need no
    per-element arithmetic before the dot (in ``DOT_DTYPE``; fp16 with offset codes, see above)."""
    pv = (p * v_scale[None, :]).to(DOT_DTYPE)
    if DOT_DTYPE == tl.float32:
        corr = tl.sum(p * v_zero[None, :], 1)
        out = tl.dot(
            pv, load_kv_codes(rows, mask_n, dtype_ptr, BLOCK_D, NPACK, QUANT), input_precision="ieee"
        )
    else:
        # one row reduction for both corrections (the zero points, and the offset of the codes)
        corr = tl.sum(p * v_zero[None, :] - CODE_OFFSET * pv.to(tl.float32), 1)
        out = tl.dot(pv, load_kv_codes_offset(rows, mask_n, BLOCK_D, NPACK, QUANT, ASM))
    return out + corr[:, None]


@triton.jit
def quant_rows(block, tok, kvh, dtype_ptr, BS: tl.constexpr, KV: tl.constexpr, NPACK: tl.constexpr):
    """Where token ``tok`` (offset in its block) and KV head ``kvh`` sit in a quantized cache block
    that starts at ``block`` (uint8 pointer(s)): its codes (uint8 pointers) and its (scale, zero)
    pair (pointers in ``dtype_ptr``'s element type, the model dtype). The block holds all its codes,
    ``[BS, KV, NPACK]``, then all its pairs (``kv_quant.py``)."""
    r = tok * KV + kvh
    codes = block + r * NPACK
    params = (block + BS * KV * NPACK).to(tl.pointer_type(dtype_ptr.dtype.element_ty)) + 2 * r
    return codes, params


@triton.jit
def load_kv_params(params, mask_n):
    """Each row's ``(scale, zero)`` as float32 ``[N]`` from its pair's pointers ``params``
    (``quant_rows``). Rows off ``mask_n`` read 0, 0."""
    # two 2-byte loads, not one 4-byte load of the pair: the 4-byte load lets Triton pipeline the
    # pair with cp.async, which measured slower (int8 decode, B=256 x 1k: 0.42 -> 0.53 ms per layer)
    scale = tl.load(params, mask=mask_n, other=0.0).to(tl.float32)
    zero = tl.load(params + 1, mask=mask_n, other=0.0).to(tl.float32)
    return scale, zero


@triton.jit
def quant_params(lo, hi, dtype_ptr, QMAX: tl.constexpr, SCALE_BITS: tl.constexpr):
    """Scale of rows with minimum ``lo`` and maximum ``hi`` (float32 ``[N]``, both values of the
    model dtype): ``(hi - lo) / QMAX`` rounded up into the model dtype (``dtype_ptr``'s element
    type, ``SCALE_BITS`` wide). Returns the scale in the model dtype and ``1 / scale`` in float32
    (0 for a constant row)."""
    t = tl.math.div_rn(hi - lo, QMAX * 1.0)
    if SCALE_BITS == 32:
        scale = t
    else:
        # round up: the nearest (or, in the interpreter, truncated) value, one step up if below t
        r = t.to(dtype_ptr.dtype.element_ty)
        bits = r.to(tl.int16, bitcast=True)
        up = (bits + 1).to(tl.int16).to(dtype_ptr.dtype.element_ty, bitcast=True)
        scale = tl.where(r.to(tl.float32) < t, up, r)
    sf = scale.to(tl.float32)
    inv = tl.where(sf > 0.0, tl.math.div_rn(tl.zeros_like(sf) + 1.0, tl.maximum(sf, _F32_TINY)), 0.0)
    return scale, inv


@triton.jit
def quant_codes(x, zero, inv, QMAX: tl.constexpr):
    """``round_half_even(clamp((x - zero) * inv, 0, QMAX))`` as int32; ``x`` ``[N, M]``, ``zero`` and
    ``inv`` ``[N]`` float32. The clamp sits between the multiply and the rounding add, so the two can
    never fuse into an fma (which would round once instead of twice, unlike the reference)."""
    y = (x - zero[:, None]) * inv[:, None]
    y = tl.minimum(tl.maximum(y, 0.0), QMAX * 1.0)
    y = (y + _ROUND_MAGIC) - _ROUND_MAGIC
    return y.to(tl.int32)


def block_packed(packed: int) -> int:
    """The power-of-two tile width covering ``packed`` bytes."""
    return max(2, next_power_of_2(packed))
