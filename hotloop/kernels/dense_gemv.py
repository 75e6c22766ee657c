"""One-row dense GEMV with its neighbours in the decoder fused in, Triton: the batch-1 decode path.

``y = epilogue(W @ prologue(x) + b)`` for rows ``x [M, K]`` and a dense ``W`` in the ``nn.Linear``
layout ``[N, K]`` (``[2N, K]`` with ``silu``). One program computes ``BLOCK_N`` outputs of one row
over the whole of K: no split over K, hence no reduction kernel and no atomics; a row's outputs
are spread over ``N / BLOCK_N`` programs. W is read once per row, so this is the kernel for M = 1
(decode at batch 1), where cuBLAS' skinny GEMMs add a split-K reduction kernel per call and the
neighbouring RMSNorm and SiLU kernels are launches of their own.

The weights (and bias, norm weight) must not be written by the kernel launched just before: on
Hopper the first weight tiles are read before the wait for it (below). Every decoder weight is
static, which is what the one-row path passes.

What can be fused, each rounding where the unfused kernels round (``kernels/reference.py``; the
order of the float32 sums differs, so a bit can differ):

- prologue ``norm_weight``: ``x -> rms_norm(x) * norm_weight``. Every program reads the whole row
  (``K <= MAX_NORM_K``) for its sum of squares; the row is a few KB, from L2.
- epilogue ``silu``: W holds ``[gate; up]``; ``y = silu(gate) * up`` (``silu_and_mul``).
- epilogue ``residual``: ``y = round(W x + b) + residual`` (the decoder's residual add).
- epilogue ``rope`` (``dense_gemv_qkv_rope``): W is the fused ``[q; k; v]`` projection; a program
  computes rotation pairs (rows j and j + D/2 of one head), rotates q and k as ``rotary_kv_write``
  does, writes k and v into a float KV cache at the token's slot and returns the rotated q.
  ``dense_gemv_qkv_rope_staged`` writes no cache: it returns k (rotated) and v beside q, for the int8
  decode kernel to quantize and write (``kv_int8_decode_cuda.FusedWrite`` with ``rotated``).

On Hopper the launches are programmatic dependents (``kernels/pdl.py``): a GEMV may start while the
kernel before it drains, requesting its first weight tiles before it waits for that kernel's output.
The rope variant lets the next launch (decode attention) start only after its K loop.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from hotloop.kernels import counters, kv_quant
from hotloop.kernels.checks import FLOAT_DTYPES, check, check_dtype, check_last_contiguous, check_same_device
from hotloop.kernels.kv_quant_triton import block_packed, quant_rows
from hotloop.kernels.launch_math import cdiv, next_power_of_2
from hotloop.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_kwargs, pdl
from hotloop.kernels.rotary_kv_write import quant_write

# The norm prologue holds the whole row in registers.
MAX_NORM_K = 16384


@dataclass(frozen=True, slots=True)
class GemvConfig:
    """A launch: outputs per program, K per loop step, warps, the weights' cache policy."""

    block_n: int
    block_k: int
    num_warps: int
    evict_first: bool = True  # weight loads marked evict-first (each weight is read once per step)

    def __post_init__(self) -> None:
        for name in ("block_n", "block_k", "num_warps"):
            v = getattr(self, name)
            if v < 1 or v & (v - 1):
                raise ValueError(f"GemvConfig.{name}={v} must be a power of two")


@triton.jit
def _merged_x(mp_ptr, ml_ptr, row, kk, K, H: tl.constexpr, HD: tl.constexpr, NUM_SPLITS: tl.constexpr,
              BLOCK_S: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
    """Elements ``kk`` of the attention row ``row`` (head ``kk // HD``, dim ``kk % HD``) from the
    decode splits' partials, merged as ``paged_decode_attention._merge_kernel`` merges them (the
    splits' log-sum-exp maximum, their weights ``exp2(lse - max)``, the weighted sum over the weights'
    sum), in float32; the caller rounds to the dtype as the merge kernel's store does."""
    head = kk // HD
    dim = kk - head * HD
    offs_s = tl.arange(0, BLOCK_S)
    base = (row * H + head) * NUM_SPLITS  # [BLOCK_K]: the row's split 0 of each element's head
    mask = (offs_s < NUM_SPLITS)[:, None]
    if not EVEN:
        mask = mask & (kk < K)[None, :]
    idx = base[None, :] + offs_s[:, None]  # [BLOCK_S, BLOCK_K]
    lse = tl.load(ml_ptr + idx, mask=mask, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m[None, :])
    part = tl.load(mp_ptr + idx * HD + dim[None, :], mask=mask, other=0.0)
    denom = tl.sum(w, 0)
    return tl.sum(part * w, 0) / tl.where(denom > 0.0, denom, 1.0)


@triton.jit
def _merged_x_by_split(mp_ptr, ml_ptr, row, kk, K, H: tl.constexpr, HD: tl.constexpr,
                       NUM_SPLITS: tl.constexpr, EVEN: tl.constexpr):  # fmt: skip
    """``_merged_x`` one split at a time (unrolled: every split's loads are independent, so they are
    all in flight at once), for a launch whose one K step covers the row. The weighted sum runs in
    split order, not the merge kernel's tree order: a float32 sum can differ in its last bits."""
    head = kk // HD
    dim = kk - head * HD
    base = (row * H + head) * NUM_SPLITS
    kmask = kk < K
    m = tl.full(kk.shape, float("-inf"), tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        if EVEN:
            m = tl.maximum(m, tl.load(ml_ptr + base + s))
        else:
            m = tl.maximum(m, tl.load(ml_ptr + base + s, mask=kmask, other=float("-inf")))
    m = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros(kk.shape, tl.float32)
    denom = tl.zeros(kk.shape, tl.float32)
    for s in tl.static_range(NUM_SPLITS):
        if EVEN:
            w = tl.exp2(tl.load(ml_ptr + base + s) - m)
            part = tl.load(mp_ptr + (base + s) * HD + dim)
        else:
            w = tl.exp2(tl.load(ml_ptr + base + s, mask=kmask, other=float("-inf")) - m)
            part = tl.load(mp_ptr + (base + s) * HD + dim, mask=kmask, other=0.0)
        acc += part * w
        denom += w
    return acc / tl.where(denom > 0.0, denom, 1.0)


@triton.jit
def _dense_gemv_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K] ([2N, K] with SILU: gate rows, then up rows)
    b_ptr,  # [N] ([2N] with SILU), read when HAS_BIAS
    nw_ptr,  # [K], read when NORM
    r_ptr,  # [M, N], read when RES
    out_ptr,  # [M, N] ([M, H * HD] with ROPE: the rotated q)
    cos_ptr,  # ROPE: [M, HD / 2] float32, and sin
    sin_ptr,
    slot_ptr,  # ROPE: [M] int64 cache slots (negative: not written)
    kc_ptr,  # ROPE: the K and V caches, [slots, KV, HD] in x's dtype, or uint8 blocks (QUANT)
    vc_ptr,
    stage_ptr,  # ROPE + QUANT: [M, 2 KV, HD] in x's dtype, k (rotated) and v before quantization
    cnt_ptr,  # ROPE + QUANT: [M * 2 KV] int32 arrival counters, zero between launches
    mp_ptr,  # MERGE: the decode splits' partials [M, H, NUM_SPLITS, HD] float32, x = their merge
    ml_ptr,  # MERGE: their log-sum-exp [M, H, NUM_SPLITS] float32 (log2 units)
    N,
    K,
    stride_xm,
    stride_wn,
    stride_rm,
    stride_om,
    stride_cs,
    stride_kcs,
    stride_kch,
    stride_vcs,
    stride_vch,
    stride_kb,  # QUANT: the caches' block strides (kv_quant.py addresses a quantized cache per block)
    stride_vb,
    eps,
    NORM: tl.constexpr,
    SILU: tl.constexpr,
    ROPE: tl.constexpr,  # W is a fused [q; k; v] projection: rotate q and k, write k and v
    H: tl.constexpr,  # ROPE: query heads, KV heads, head dim
    KV: tl.constexpr,
    HD: tl.constexpr,
    RES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN: tl.constexpr,  # N % BLOCK_N == 0 and K % BLOCK_K == 0: no masks
    K_POW2: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    EVICT: tl.constexpr,  # the weights' eviction policy ("evict_first" or "")
    PDL: tl.constexpr,  # launched as a programmatic dependent: wait before reading x
    QUANT: tl.constexpr = 0,  # ROPE: 0 (float cache), 8 or 4 (kv_quant.py)
    STAGE_KV: tl.constexpr = False,  # ROPE: k (rotated) and v into stage_ptr, no cache write
    NO_FMA: tl.constexpr = False,  # ROPE: each rotation product and sum rounded on its own (GPU)
    LATE: tl.constexpr = True,  # ROPE + PDL: the launch trigger after the loop (else after the wait)
    BS: tl.constexpr = 1,  # QUANT: block size, packed bytes per row, their tile, model dtype bits
    NPACK: tl.constexpr = 1,
    BLOCK_P: tl.constexpr = 2,
    SCALE_BITS: tl.constexpr = 16,
    MERGE: tl.constexpr = False,  # x is the merge of decode partials (H heads of HD), not read
    NUM_SPLITS: tl.constexpr = 1,  # MERGE: the splits, and their power-of-two tile
    BLOCK_S: tl.constexpr = 2,
    BY_SPLIT: tl.constexpr = False,  # MERGE: one split at a time (_merged_x_by_split), not a tile
):
    pid_n = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    dt = x_ptr.dtype.element_ty  # the roundings are the unfused kernels', in x's dtype
    x_row = x_ptr + row * stride_xm
    TWO: tl.constexpr = SILU or ROPE  # two weight tiles per step
    if ROPE:
        # BLOCK_N rotation pairs of one head: rows j and j + HD / 2 of head ``head``
        per_head: tl.constexpr = (HD // 2) // BLOCK_N
        head = pid_n // per_head
        pair = (pid_n % per_head) * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_n = head * HD + pair
        second = HD // 2
    else:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        second = N
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    gate_rows = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn
    up_rows = gate_rows + second * stride_wn

    # The weight tiles of the first step are requested before anything waits: the norm's
    # reduction (a barrier) then overlaps them. In the loop, the next step's tiles are requested
    # before this step's are used (two steps in flight; the last request is masked off).
    if EVEN:
        w = tl.load(gate_rows + offs_k[None, :], eviction_policy=EVICT)
    else:
        w = tl.load(
            gate_rows + offs_k[None, :],
            mask=n_mask[:, None] & (offs_k < K)[None, :],
            other=0.0,
            eviction_policy=EVICT,
        )
    wu = w
    if TWO:
        if EVEN:
            wu = tl.load(up_rows + offs_k[None, :], eviction_policy=EVICT)
        else:
            wu = tl.load(
                up_rows + offs_k[None, :],
                mask=n_mask[:, None] & (offs_k < K)[None, :],
                other=0.0,
                eviction_policy=EVICT,
            )

    if PDL:
        gdc_wait()  # the kernel before this one is done: x and the residual are written
        if not (ROPE and LATE):
            gdc_launch_dependents()  # the next launch may start requesting its weights
    rstd = 1.0
    if NORM:
        offs_all = tl.arange(0, K_POW2)
        xa = tl.load(x_row + offs_all, mask=offs_all < K, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xa * xa, 0) / K + eps)

    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        kn = kk + BLOCK_K
        if EVEN:
            next_mask = (kn < K)[None, :]
        else:
            next_mask = n_mask[:, None] & (kn < K)[None, :]
        w_next = tl.load(gate_rows + kn[None, :], mask=next_mask, other=0.0, eviction_policy=EVICT)
        wu_next = w_next
        if TWO:
            wu_next = tl.load(up_rows + kn[None, :], mask=next_mask, other=0.0, eviction_policy=EVICT)
        if MERGE:
            if BY_SPLIT:
                xk = _merged_x_by_split(mp_ptr, ml_ptr, row, kk, K, H, HD, NUM_SPLITS, EVEN).to(dt)
            else:
                xk = _merged_x(mp_ptr, ml_ptr, row, kk, K, H, HD, NUM_SPLITS, BLOCK_S, EVEN).to(dt)
        elif EVEN:
            xk = tl.load(x_row + kk)
        else:
            xk = tl.load(x_row + kk, mask=kk < K, other=0.0)
        if NORM:
            if EVEN:
                nw = tl.load(nw_ptr + kk)
            else:
                nw = tl.load(nw_ptr + kk, mask=kk < K, other=0.0)
            # reference.rms_norm: normalised in float32, rounded, times the weight, rounded
            xk = ((xk.to(tl.float32) * rstd).to(dt).to(tl.float32) * nw.to(tl.float32)).to(dt)
        xf = xk.to(tl.float32)[None, :]
        acc += w.to(tl.float32) * xf
        if TWO:
            acc_up += wu.to(tl.float32) * xf
        w = w_next
        wu = wu_next

    if PDL and ROPE and LATE:
        # after the loop: the next kernel (decode attention) has no weights to prefetch, and its
        # programs, resident early and waiting, likely take SM slots from this GEMV's later ones
        # (measured faster this way at batch 1, 2026-11-30; the reason is not profiled)
        gdc_launch_dependents()
    y = tl.sum(acc, 1)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    if ROPE:
        y2 = tl.sum(acc_up, 1)
        if HAS_BIAS:
            y2 += tl.load(b_ptr + offs_n + second).to(tl.float32)
        # as the projection (rounded) then rotary_kv_write (rotate-half in float32, rounded)
        x1 = y.to(dt).to(tl.float32)
        x2 = y2.to(dt).to(tl.float32)
        hv = head + tl.zeros_like(pair)  # the head, per pair (masks are vectors)
        rotate = hv < H + KV  # q and k heads; v passes through
        c = tl.load(cos_ptr + row * stride_cs + pair, mask=rotate, other=1.0)
        s = tl.load(sin_ptr + row * stride_cs + pair, mask=rotate, other=0.0)
        # v is stored as projected (as rotary_kv_write stores it; no 1 * x - 0 * y arithmetic)
        if NO_FMA:  # rotary_kv_write's quantized launch (fp fusion off): no fused multiply-add
            y1 = libdevice.sub_rn(libdevice.mul_rn(x1, c), libdevice.mul_rn(x2, s))
            y2 = libdevice.add_rn(libdevice.mul_rn(x2, c), libdevice.mul_rn(x1, s))
        else:
            y1 = x1 * c - x2 * s
            y2 = x2 * c + x1 * s
        r1 = tl.where(rotate, y1, x1).to(dt)
        r2 = tl.where(rotate, y2, x2).to(dt)
        q_dst = out_ptr + row * stride_om + offs_n
        tl.store(q_dst, r1, mask=hv < H)
        tl.store(q_dst + second, r2, mask=hv < H)
        if STAGE_KV:
            if head >= H:  # k (rotated, rounded) or v: row head - H of the token's [2 KV, HD]
                row_stage = stage_ptr + (row * (2 * KV) + head - H) * HD
                tl.store(row_stage + pair, r1)
                tl.store(row_stage + pair + second, r2)
        elif QUANT == 0:
            slot = tl.load(slot_ptr + row) + tl.zeros_like(pair).to(tl.int64)
            is_k = (slot >= 0) & (hv >= H) & rotate
            k_dst = kc_ptr + slot * stride_kcs + (hv - H) * stride_kch + pair
            tl.store(k_dst, r1, mask=is_k)
            tl.store(k_dst + second, r2, mask=is_k)
            is_v = (slot >= 0) & (hv >= H + KV)
            v_dst = vc_ptr + slot * stride_vcs + (hv - H - KV) * stride_vch + pair
            tl.store(v_dst, r1, mask=is_v)
            tl.store(v_dst + second, r2, mask=is_v)
        elif head >= H:
            # A quantized row needs the whole head (its minimum and maximum): each program stages
            # its pairs of k (rotated, rounded) or v, and the head's last program to arrive
            # quantizes the staged row as rotary_kv_write does (the same quant_write).
            kvs = head - H  # 0 .. 2 KV - 1: k heads, then v heads
            row_stage = stage_ptr + (row * (2 * KV) + kvs) * HD
            tl.store(row_stage + pair, r1)
            tl.store(row_stage + pair + second, r2)
            tl.debug_barrier()  # every thread's values are stored before the release below
            cnt = cnt_ptr + row * (2 * KV) + kvs
            arrived = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
            if arrived == per_head - 1:
                slot_s = tl.load(slot_ptr + row)
                if slot_s >= 0:
                    kvh = kvs % KV + tl.arange(0, 1)
                    if kvs < KV:
                        blk = kc_ptr + (slot_s // BS) * stride_kb
                    else:
                        blk = vc_ptr + (slot_s // BS) * stride_vb
                    codes, params = quant_rows(blk, slot_s % BS, kvh, stage_ptr, BS, KV, NPACK)
                    src = row_stage + tl.zeros([1], dtype=tl.int32)
                    quant_write(
                        src,
                        cos_ptr,
                        sin_ptr,
                        codes,
                        params,
                        kvh < KV,
                        HD,
                        0,
                        QUANT,
                        NPACK,
                        BLOCK_P,
                        SCALE_BITS,
                    )
                tl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")
    else:
        if SILU:
            up = tl.sum(acc_up, 1)
            if HAS_BIAS:
                up += tl.load(b_ptr + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
            # silu_and_mul: silu rounded to the dtype, then the product rounded
            gate = y.to(dt).to(tl.float32)
            act = (gate / (1.0 + tl.exp(-gate))).to(dt).to(tl.float32)
            y = act * up.to(dt).to(tl.float32)
        if RES:
            res = tl.load(r_ptr + row * stride_rm + offs_n, mask=n_mask, other=0.0)
            y = y.to(dt).to(tl.float32) + res.to(tl.float32)
        # out may be float32 (logits): the value is still rounded to x's dtype first, as
        # ``F.linear(x, W).float()`` rounds it
        tl.store(out_ptr + row * stride_om + offs_n, y.to(dt).to(out_ptr.dtype.element_ty), mask=n_mask)


def default_config(n: int, k: int, silu: bool, norm: bool = False) -> GemvConfig:
    """The launch for ``n`` outputs over ``k``, from a grid timed on an H200
    (``benchmarks/dense_gemv.py``: Llama-3-8B and SmolLM2-135M layer shapes, each launch over 8
    distinct weights back to back in a CUDA graph, as a decode step runs them).

    - A long K (Llama-3-8B): 512-wide steps over 4 warps, 4 outputs per program (o 11.4 us,
      down 29.6 us against cuBLAS' 13.4 and 31.1), 16 with the norm prologue (qkv 15.2 against
      16.5 + the norm kernel); gate/up's two tiles: 4 outputs, 256-wide steps, 2 warps (59.2 us
      against cuBLAS' 55.2 + the norm and SiLU kernels).
    - A short K (SmolLM2's 576 and 1536): the whole of K in one step (8 warps at 2048), 2 outputs
      per program, 4 with gate/up's two tiles.
    """
    if k > 2048:
        if silu:
            return GemvConfig(4, 256, 2)
        return GemvConfig(16 if norm else 4, 512, 4)
    if silu:
        return GemvConfig(4, min(1024, max(16, next_power_of_2(k))), 4)
    block_k = min(2048, max(16, next_power_of_2(k)))
    return GemvConfig(2, block_k, 8 if block_k >= 2048 else 4)


def lm_head_config(k: int) -> GemvConfig:
    """The LM head's launch (``ops.lm_head_logits``), from ``benchmarks/dense_gemv.py --sections
    lm_head`` on an H200 (2026-11-30): Llama-3-8B's 128256 x 4096 239.1 us (the default launch
    247.5, cuBLAS + the cast 254.4). A short K takes 64 rows a program in 64-wide steps
    (2026-12-02, the grid over 2-64 rows and 64-1,024-wide steps): SmolLM2-135M's 49152 x 576
    17.7 us against 26.4 for the whole K in one step of 4 rows (cuBLAS + the cast 22.1; floor 13.6);
    SmolLM2 batch 1 2,407 / 2,411 tokens/s against 2,363 / 2,362. Between 1,024 and 2,048 (not
    timed) the earlier one-step launch stays."""
    if k > 2048:
        return GemvConfig(4, 256, 2)
    if k <= 1024:
        return GemvConfig(64, 64, 4)
    return GemvConfig(4, min(2048, max(16, next_power_of_2(k))), 4)


def rope_default_config(k: int) -> GemvConfig:
    """``dense_gemv_qkv_rope``'s launch (``block_n``: rotation pairs, two weight rows each).

    A long K takes the q/k/v-with-norm launch of ``default_config`` (16 weight rows, 512-wide steps,
    4 warps): Llama-3-8B's 6,144 rows then give 384 programs. On an H200 at batch 1 (2026-11-30),
    with the late launch trigger, 256.1 tokens/s against 254.0 without the rope fusion; gate/up's
    launch (4 pairs at 256, 2 warps) and the early trigger had given 243.5 against 248.0. A short K
    (SmolLM2-135M) keeps gate/up's short-K launch: 2,175 against 2,129 tokens/s.
    """
    if k > 2048:
        return GemvConfig(8, 512, 4)
    return default_config(2, k, True)


def _check_common(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    **others: torch.Tensor | None,
) -> tuple[int, int, int]:
    """Shared argument checks -> ``(M, K, weight rows)``."""
    check(x.dim() == 2, f"x must be [M, K], got {tuple(x.shape)}")
    check(weight.dim() == 2, f"weight must be [N, K], got {tuple(weight.shape)}")
    check_dtype("x", x, FLOAT_DTYPES)
    m, k = x.shape
    rows, wk = weight.shape
    check(wk == k, f"weight [{rows}, {wk}] does not take x's K={k}")
    check(weight.dtype == x.dtype, f"weight dtype {weight.dtype} != x dtype {x.dtype}")
    check_last_contiguous("x", x)
    check_last_contiguous("weight", weight)
    extra = {"bias": bias, "norm_weight": norm_weight, **others}
    check_same_device(x=x, weight=weight, **{k: v for k, v in extra.items() if v is not None})
    if bias is not None:
        check(bias.shape == (rows,), f"bias must be [{rows}], got {tuple(bias.shape)}")
        check(bias.dtype == x.dtype and bias.is_contiguous(), "bias must be contiguous, in x's dtype")
    if norm_weight is not None:
        check(norm_weight.shape == (k,), f"norm_weight must be [{k}], got {tuple(norm_weight.shape)}")
        check(
            norm_weight.dtype == x.dtype and norm_weight.is_contiguous(), "norm_weight: x's dtype, contiguous"
        )
        check(k <= MAX_NORM_K, f"the norm prologue holds the row: K={k} > {MAX_NORM_K}")
    return m, k, rows


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _rope_late_trigger() -> bool:
    """Where the rope GEMV lets the next launch start: after its loop (the default, measured faster
    for the float cache's write at batch 1), or after its wait with ``HOTLOOP_ROPE_TRIGGER=early``
    (for timing the staged int8 path, whose decode kernel requests its first tiles before waiting)."""
    v = os.environ.get("HOTLOOP_ROPE_TRIGGER", "late")
    if v not in ("late", "early"):
        raise ValueError(f"HOTLOOP_ROPE_TRIGGER must be 'late' or 'early', got {v!r}")
    return v == "late"


def _launch(
    grid: tuple[int, int],
    cfg: GemvConfig,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float,
    out: torch.Tensor,
    n: int,
    even: bool,
    residual: torch.Tensor | None = None,
    silu: bool = False,
    rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    heads: tuple[int, int, int] = (1, 1, 2),
    quant: tuple[int, torch.Tensor, torch.Tensor] | None = None,
    stage_kv: torch.Tensor | None = None,
    merge: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """``quant``: (policy, stage, counters) for a quantized cache (``dense_gemv_qkv_rope``);
    ``stage_kv`` ``[M, 2 KV, D]``: k and v go there instead of a cache (``rope``'s slots and caches
    are then not read); ``merge``: (partials, lse) that x is merged from (x only gives the dtype)."""
    k = x.shape[1]
    cos, sin, slots, k_cache, v_cache = rope if rope is not None else (out, out, out, out, out)
    policy, stage, cnt = quant if quant is not None else (0, out, out)
    if stage_kv is not None:
        stage = stage_kv
    npack = kv_quant.packed_bytes(heads[2], policy) if policy else 1
    # a float cache [blocks, block_size, KV, D], dense over tokens: a flat slot's stride, a head's
    writes_cache = rope is not None and not policy and stage_kv is None
    kc_st = (k_cache.stride(1), k_cache.stride(2)) if writes_cache else (0, 0)
    vc_st = (v_cache.stride(1), v_cache.stride(2)) if writes_cache else (0, 0)
    _dense_gemv_kernel[grid](
        x,
        weight,
        bias if bias is not None else weight,
        norm_weight if norm_weight is not None else weight,
        residual if residual is not None else out,
        out,
        cos,
        sin,
        slots,
        k_cache,
        v_cache,
        stage,
        cnt,
        merge[0] if merge is not None else out,
        merge[1] if merge is not None else out,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        residual.stride(0) if residual is not None else 0,
        out.stride(0),
        cos.stride(0) if rope is not None else 0,
        kc_st[0],
        kc_st[1],
        vc_st[0],
        vc_st[1],
        k_cache.stride(0) if policy else 0,
        v_cache.stride(0) if policy else 0,
        eps,
        NORM=norm_weight is not None,
        SILU=silu,
        ROPE=rope is not None,
        H=heads[0],
        KV=heads[1],
        HD=heads[2],
        RES=residual is not None,
        HAS_BIAS=bias is not None,
        EVEN=even,
        K_POW2=next_power_of_2(k) if norm_weight is not None else 16,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        EVICT="evict_first" if cfg.evict_first else "",
        PDL=pdl(x.device),
        QUANT=policy,
        STAGE_KV=stage_kv is not None,
        # the roundings of rotary_kv_write's quantized launch, which turns fp fusion off (the
        # interpreter never fuses, and has no libdevice)
        NO_FMA=(bool(policy) or stage_kv is not None) and x.is_cuda and not _interpreting(),
        LATE=_rope_late_trigger(),
        BS=k_cache.shape[1] if policy else 1,
        NPACK=npack,
        BLOCK_P=block_packed(npack),
        SCALE_BITS=8 * x.element_size(),
        MERGE=merge is not None,
        NUM_SPLITS=merge[0].shape[2] if merge is not None else 1,
        BLOCK_S=max(2, next_power_of_2(merge[0].shape[2])) if merge is not None else 2,
        BY_SPLIT=merge is not None and cfg.block_k >= k,
        num_warps=cfg.num_warps,
        **launch_kwargs(x.device),
    )


def dense_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    silu: bool = False,
    config: GemvConfig | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``x [M, K]`` -> ``[M, N]``: ``epilogue(weight @ prologue(x) + bias)`` (see the module doc).

    ``weight [N, K]`` (``[2N, K]`` when ``silu``, gate rows first), ``bias [N]`` / ``[2N]``,
    ``norm_weight [K]``, ``residual [M, N]``; all in x's dtype. Returns a new tensor in x's dtype,
    or in ``out_dtype`` (float32 for logits: each value is rounded to x's dtype, then widened).
    """
    m, k, rows = _check_common(x, weight, bias, norm_weight, residual=residual)
    if silu:
        check(rows % 2 == 0, f"silu needs [gate; up] weight rows, got an odd {rows}")
    n = rows // 2 if silu else rows
    if residual is not None:
        check(residual.shape == (m, n), f"residual must be [{m}, {n}], got {tuple(residual.shape)}")
        check(residual.dtype == x.dtype, f"residual dtype {residual.dtype} != x dtype {x.dtype}")
        check_last_contiguous("residual", residual)
    if out_dtype is not None:
        check(out_dtype in (x.dtype, torch.float32), f"out_dtype {out_dtype} must be x's dtype or float32")
    cfg = config or default_config(n, k, silu, norm_weight is not None)
    out = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    even = n % cfg.block_n == 0 and k % cfg.block_k == 0
    _launch((cdiv(n, cfg.block_n), m), cfg, x, weight, bias, norm_weight, eps, out, n, even, residual, silu)
    return out


def merge_config(n: int, k: int) -> GemvConfig:
    """``dense_gemv_merged``'s launch. A K step that covers the row merges one split at a time
    (``_merged_x_by_split``); a shorter one merges a splits x ``block_k`` tile per step
    (``_merged_x``). ``HOTLOOP_ONE_ROW_MERGE_CONFIG=block_n,block_k,warps`` overrides the default.

    H200, SmolLM2-135M batch 1 (o projection 576 x 576, 16 splits; benchmarks/results/
    gpu_2026-12-01g/call2), ms per decode step against 0.430-0.433 with the merge launch: tiles of 64
    with 2 / 4 / 8 / 16 outputs 0.720 / 0.688 / 0.666 / 0.750, tiles of 128 with 4 outputs 0.642.
    Each K step waits for its partials' loads: that chain of steps costs more than the launch. The
    by-split merge over the whole row (``call3``, ``call4``): 8 / 16 / 32 / 64 outputs over 8 warps
    0.427 / 0.420-0.421 / 0.511 / 2.34 ms (32 over 16 warps 0.494; 16 over 4 warps 0.447), against
    0.431-0.433 with the merge launch in the same calls: 16 outputs, 2,376-2,380 against 2,310-2,318
    tokens/s, is the default."""
    raw = os.environ.get("HOTLOOP_ONE_ROW_MERGE_CONFIG", "").strip()
    if raw:
        try:
            bn, bk, warps = (int(v) for v in raw.split(","))
            return GemvConfig(bn, bk, warps)
        except ValueError as e:
            raise ValueError(
                f"HOTLOOP_ONE_ROW_MERGE_CONFIG={raw!r} must be block_n,block_k,warps (powers of two): {e}"
            ) from e
    if k <= 1024:  # (ops.ONE_ROW_MERGE_MAX_BYTES admits K <= 1024 at 16 splits)
        return GemvConfig(16, max(16, next_power_of_2(k)), 8)
    return GemvConfig(4, 128, 4)


def dense_gemv_merged(
    part: torch.Tensor,
    lse: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    residual: torch.Tensor | None = None,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """``dense_gemv(x, weight, bias, residual=residual)`` where x ``[M, H * D]`` is the attention
    output that ``paged_decode_attention``'s merge launch would have written from the decode splits'
    ``part [M, H, S, D]`` and ``lse [M, H, S]`` (float32; ``DecodeResult``): each program merges the
    elements of x it reads, with the merge kernel's formula and its rounding to the dtype, so the
    merge launch goes (the o projection of batch-1 decode). The float32 sums over the splits may run
    in another order than the merge kernel's (split by split where one K step covers the row), so a
    merged value can differ from the merge launch's in its last bit. Returns ``[M, N]`` in the
    weight's dtype."""
    check(
        part.dim() == 4 and lse.shape == part.shape[:3], f"part {tuple(part.shape)}, lse {tuple(lse.shape)}"
    )
    check(part.dtype == torch.float32 and lse.dtype == torch.float32, "part and lse must be float32")
    check(part.is_contiguous() and lse.is_contiguous(), "part and lse must be contiguous")
    m, H, _splits, D = part.shape
    k = H * D
    check(
        weight.dim() == 2 and weight.shape[1] == k,
        f"weight {tuple(weight.shape)} does not take K = H * D = {k}",
    )
    check_dtype("weight", weight, FLOAT_DTYPES)
    check_last_contiguous("weight", weight)
    n = weight.shape[0]
    check_same_device(
        part=part, lse=lse, weight=weight, **({"residual": residual} if residual is not None else {})
    )
    if bias is not None:
        check(
            bias.shape == (n,) and bias.dtype == weight.dtype and bias.is_contiguous(),
            "bias: [N], weight's dtype",
        )
    if residual is not None:
        check(residual.shape == (m, n) and residual.dtype == weight.dtype, f"residual must be [{m}, {n}]")
        check_last_contiguous("residual", residual)
    cfg = config or merge_config(n, k)
    out = torch.empty(m, n, dtype=weight.dtype, device=weight.device)
    if m == 0 or n == 0:
        return out
    x = weight.as_strided((m, k), (0, 1))  # not read (MERGE): the launch takes the dtype and K from it
    even = n % cfg.block_n == 0 and k % cfg.block_k == 0
    _launch((cdiv(n, cfg.block_n), m), cfg, x, weight, bias, None, 0.0, out, n, even, residual,
            heads=(H, 1, D), merge=(part, lse))  # fmt: skip
    return out


def rope_pairs(head_dim: int, block_n: int) -> int:
    """Rotation pairs per program for ``dense_gemv_qkv_rope``: the largest power of two that is at
    most ``block_n`` and divides ``head_dim / 2``."""
    half = head_dim // 2
    return min(half & -half, 1 << (max(block_n, 1).bit_length() - 1))


def _launch_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    eps: float,
    out: torch.Tensor,
    rope: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    heads: tuple[int, int, int],
    config: GemvConfig | None,
    quant: tuple[int, torch.Tensor, torch.Tensor] | None = None,
    stage_kv: torch.Tensor | None = None,
) -> None:
    """The rope epilogue's launch: one program per ``block_n`` rotation pairs of a head."""
    H, KV, D = heads
    k = x.shape[1]
    base = config or rope_default_config(k)
    pairs = rope_pairs(D, base.block_n)
    cfg = GemvConfig(pairs, base.block_k, base.num_warps, base.evict_first)
    grid = ((H + 2 * KV) * (D // 2 // pairs), x.shape[0])
    rows = weight.shape[0]
    _launch(grid, cfg, x, weight, bias, norm_weight, eps, out, rows, k % cfg.block_k == 0, rope=rope,
            heads=heads, quant=quant, stage_kv=stage_kv)  # fmt: skip


def _check_rope(m: int, rows: int, cos: torch.Tensor, sin: torch.Tensor, H: int, KV: int) -> int:
    """The rope epilogue's checks: ``(H + 2 KV)`` heads of weight rows, full rotary ``cos`` / ``sin``
    ``[M, D / 2]`` float32. Returns the head dim D."""
    check(rows % (H + 2 * KV) == 0, f"weight rows {rows} are not (H + 2 KV) = {H + 2 * KV} heads")
    D = rows // (H + 2 * KV)
    check(D % 2 == 0, f"head_dim {D} must be even")
    for name, t in (("cos", cos), ("sin", sin)):
        check(t.shape == (m, D // 2), f"{name} must be [{m}, {D // 2}] (full rotary), got {tuple(t.shape)}")
        check(t.dtype == torch.float32 and t.stride(-1) == 1, f"{name}: float32, last dim contiguous")
    check(cos.stride() == sin.stride(), "cos and sin must have the same strides")
    return D


def dense_gemv_qkv_rope_staged(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    norm_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    config: GemvConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``dense_gemv_qkv_rope`` without the cache write: the fused q/k/v projection of ``x [M, K]``
    (input norm in front) with q and k rotated. Returns ``(q [M, H * D], kv [M, 2 KV, D])``, kv's
    rows k (rotated) then v, each rounded where the projection and ``rotary_kv_write`` round
    (``reference.fused_qkv_rope_staged``). For an int8 cache whose decode kernel quantizes and writes
    this step's k and v itself (``kv_int8_decode_cuda.FusedWrite`` with ``rotated``): the batch-1
    step then has the float cache's launches."""
    m, k, rows = _check_common(x, weight, bias, norm_weight, cos=cos, sin=sin)
    H, KV = num_heads, num_kv_heads
    D = _check_rope(m, rows, cos, sin, H, KV)
    out = torch.empty(m, H * D, dtype=x.dtype, device=x.device)
    kv = torch.empty(m, 2 * KV, D, dtype=x.dtype, device=x.device)
    if m:
        _launch_rope(
            x, weight, bias, norm_weight, eps, out, (cos, sin, out, out, out), (H, KV, D), config, stage_kv=kv
        )
    return out, kv


def dense_gemv_qkv_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    norm_weight: torch.Tensor | None,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    config: GemvConfig | None = None,
) -> torch.Tensor:
    """The fused q/k/v projection of ``x [M, K]`` (``weight [(H + 2 KV) * D, K]``, the input norm
    fused in front) with the rotary embedding and the KV-cache write fused behind: k (rotated) and
    v go to ``k_cache`` / ``v_cache`` ``[num_blocks, block_size, KV, D]`` (a float cache in x's
    dtype, or a ``uint8`` int8 / int4 cache in ``kv_quant``'s format, quantized as written) at
    ``slot_mapping [M]`` (negative: not written); returns the rotated q ``[M, H * D]``.

    The same roundings as the projection followed by ``rotary_kv_write``. Full rotary only
    (``cos``/``sin`` ``[M, D / 2]`` float32: every dim of a head is rotated). A quantized cache
    is written by the last of a head's programs to arrive (arrival counters, ``kernels/counters.py``);
    where no counters can be had (a first call inside a CUDA-graph capture) the projection and
    ``rotary_kv_write`` run as two launches instead.
    """
    m, k, rows = _check_common(
        x,
        weight,
        bias,
        norm_weight,
        cos=cos,
        sin=sin,
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=slot_mapping,
    )
    H, KV = num_heads, num_kv_heads
    D = _check_rope(m, rows, cos, sin, H, KV)
    check(
        slot_mapping.shape == (m,) and slot_mapping.dtype == torch.int64 and slot_mapping.stride(0) == 1,
        "slot_mapping: int64 [M], contiguous",
    )
    check(v_cache.dtype == k_cache.dtype and v_cache.shape == k_cache.shape, "k_cache and v_cache differ")
    policy = kv_quant.cache_policy(k_cache, D, x.dtype)  # a uint8 row of the wrong width raises
    if policy:
        kv_quant.check_head_dim(D, policy)
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        check(c.dim() == 4 and c.shape[2] == KV, f"{name} must be [blocks, block_size, {KV}, row]")
        if policy:  # addressed per block (kv_quant.py): each block's bytes must be dense
            check(c.stride()[1:] == (KV * c.shape[3], c.shape[3], 1), f"{name}: blocks must be dense")
        else:
            check(c.shape[3] == D, f"{name} must be [blocks, block_size, {KV}, {D}]")
            check(c.dtype == x.dtype, f"{name} dtype {c.dtype} != x dtype {x.dtype}")
            check(c.stride(3) == 1 and c.stride(0) == c.shape[1] * c.stride(1), f"{name}: dense over tokens")
    quant = None
    if policy:
        cnt = counters.counters(x.device, "rope_quant", m * 2 * KV)
        if cnt is None:  # no counters here: the two launches
            from hotloop.kernels.rotary_kv_write import rotary_kv_write

            qkv = dense_gemv(x, weight, bias, norm_weight=norm_weight, eps=eps, config=config)
            q, kk, v = qkv.split([H * D, KV * D, KV * D], dim=-1)
            q = q.reshape(m, H, D)
            rotary_kv_write(
                q, kk.reshape(m, KV, D), v.reshape(m, KV, D), cos, sin, k_cache, v_cache, slot_mapping
            )
            return q.reshape(m, H * D).contiguous()
        quant = (policy, torch.empty(m, 2 * KV, D, dtype=x.dtype, device=x.device), cnt)
    out = torch.empty(m, H * D, dtype=x.dtype, device=x.device)
    if m:
        rope = (cos, sin, slot_mapping, k_cache, v_cache)
        _launch_rope(x, weight, bias, norm_weight, eps, out, rope, (H, KV, D), config, quant=quant)
    return out
