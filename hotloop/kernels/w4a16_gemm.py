"""W4A16 GEMM in Triton: ``y = x @ W`` with ``W`` in the AutoAWQ int4 layout, dequantized in registers.

Four launches:

- ``gemv`` (M of 1 to 4, ``kernels/w4a16_gemv.py``): CUDA cores only, float32 arithmetic (the
  fastest launch at M = 1 on an H200); for one row also ``unpack="half2"``, packed 16-bit
  dequantization and multiply-add (two columns per instruction; partial sums of ``HALF2_ROWS`` k
  rows in 16 bits, then float32).
- ``splitk`` (small M): tensor cores on 16- to 64-row tiles, for M <= 32 with the operands
  swapped (``out^T = W^T x^T``) so that the weight tile is the MMA's 64-row side and M (padded to
  16) its narrow side; the K loop is split across programs so that even a narrow layer fills the
  GPU.
- ``tiled`` (prefill, large M): classic M x N output tiles (grouped for L2 reuse), each walking all
  of K.
- ``dequant`` (large M): dequantize the weight into a scratch matrix (``kernels/w4a16_dequant.py``,
  one pass over the weight) and multiply with ``torch.matmul`` (cuBLAS), as vLLM's AWQ path does
  from 256 tokens. Only the tuner picks it (it is a candidate above 64 rows), where it is faster.

``splitk`` and ``tiled`` share one kernel. A K step loads a ``[BLOCK_K, BLOCK_N / 8]`` tile of
packed words once and unpacks it in registers (:func:`_unpack_awq`): ORing a nibble into the
mantissa of a 16-bit constant (``0x4300`` is bf16 128.0, ``0x6400`` fp16 1024.0) gives
``magic + q`` exactly with no integer-to-float conversion, and AWQ's nibble order
``[0, 2, 4, 6, 1, 3, 5, 7]`` puts columns ``2j`` and ``2j + 1`` 16 bits apart, so one shift and one
``lop3`` make two of them. ``(magic + q) - (magic + z)`` is then exact, one multiply by the
group's scale rounds it like the reference, and the tile feeds ``tl.dot`` (float32 accumulation).
Every load of the K loop (activations, packed words, zero points, scales) feeds that dot, so
Triton's software pipeliner keeps ``num_stages - 1`` steps of all of them in flight: no load's
latency is waited for inside the loop. ``BLOCK_K`` divides the group size, so a step lies in one
group.

Split-K partial sums (float32) go to a workspace; the last program of a tile to finish (an atomic
counter per tile, reset by that program) adds them in a fixed order and writes the output, so a
split launch is still a single kernel and its result does not depend on timing.

Which launch: :func:`choose_config` gives a static choice per path and M (``TUNED``). ``auto``
on a GPU instead times a few candidates once per (device, dtype, M bucket, N, K, group) -- each
in a CUDA graph with the L2 cache flushed before every launch, so that what is measured is the
kernel streaming its weights from memory, as in a decode step -- and keeps the fastest
(``tuning_log`` holds the timings). The choice is also kept on disk (``tuning_cache``, keyed by the
GPU's name and the torch and Triton versions), so the next start on the same GPU does not time
again. Set ``HOTLOOP_W4A16_TUNE=0`` to use the static choice; during a CUDA-graph capture an
untuned shape also gets the static choice.

The torch reference is ``kernels.reference.w4a16_matmul``; the layout is in ``kernels.w4a16_layout``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from typing import Any

import torch
import triton
import triton.language as tl

from hotloop.kernels import counters, tuning_cache
from hotloop.kernels.launch_math import cdiv
from hotloop.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_kwargs, pdl
from hotloop.kernels.w4a16_gemv import lop3_and_or
from hotloop.kernels.w4a16_layout import PACK_FACTOR, check_awq_shapes

logger = logging.getLogger(__name__)

PATHS = ("auto", "gemv", "splitk", "tiled", "dequant")
KINDS = ("gemv", "dot", "dequant", "cuda", "cuda_tc")
UNPACK_MODES = ("nibble", "pair", "lop3", "mask", "half2")  # "mask", "half2": the one-row GEMV only
ONE_ROW_UNPACK = ("mask", "half2")
GEMV_MAX_M = 4  # the CUDA-core GEMV takes at most this many rows
SPLITK_MAX_M = 64  # at or below this many rows the static ``auto`` choice is the split-K launch
COUNTER_SLOTS = counters.SLOTS  # split-K tile counters kept per device
TUNE_ENV = "HOTLOOP_W4A16_TUNE"

# A 16-bit pattern whose mantissa takes a nibble: 128.0 in bf16 (ulp 1), 1024.0 in fp16 (ulp 1);
# 2^23 in float32.
_MAGIC = {torch.bfloat16: 0x4300, torch.float16: 0x6400, torch.float32: 0x4B000000}
_TL_DTYPE = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}
# k rows per 16-bit partial sum of the ``half2`` GEMV (its precision knob: a multiple of 4). Measured
# (an ad-hoc script, not in the repository; test_gpu_gemv_half2 checks the bounds) on an H200 against float32 dequantize-then-matmul at the four Llama-3-8B shapes, M = 1, activations
# N(0, 1) with 8 outliers of 20 to 50 (max error / max |y|; rms error / rms y):
#   fp16, 8 rows: max 4.2-8.2e-4, rms 4.5-5.6e-4 (the mask kernel: 2.7-4.0e-4, 2.0-2.1e-4)
#   bf16, 8 rows: max 3.7-5.9e-3, rms 3.7-4.3e-3 (mask: 2.1-3.0e-3, 1.6-1.7e-3)
#   bf16, 4 rows: max 3.0-4.7e-3, rms 3.1-3.3e-3, and 6-13% slower at the two large shapes
# bf16's floor is the 8-bit rounding of the running partial sum at each fused multiply-add (and of
# the first product), which 4 rows do not remove; both
# dtypes take 8 rows, well inside the GPU tests' 2e-2 (the half2 test asks 2e-3 fp16, 1e-2 bf16).
HALF2_ROWS = {torch.float16: 8, torch.bfloat16: 8}


@triton.jit
def _as_float(v, DTYPE: tl.constexpr):
    """int32 holding a float's bits (in its low 16 bits for 16-bit ``DTYPE``) -> that float."""
    if DTYPE == tl.float32:
        return v.to(tl.float32, bitcast=True)
    else:
        return v.to(tl.int16).to(DTYPE, bitcast=True)


@triton.jit
def _interleave_columns(lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Eight ``[ROWS, BLOCK_N / 8]`` tensors, column ``2j`` of each word in ``loj`` and ``2j + 1`` in
    ``hij``, -> ``[ROWS, BLOCK_N]`` with word ``c``'s columns at ``8c .. 8c + 7``."""
    # join adds a minor axis: join(join(a0, a2), join(a1, a3))[.., i, j] = a_{2i + j}
    lo = tl.reshape(tl.join(tl.join(lo0, lo2), tl.join(lo1, lo3)), (ROWS, BLOCK_N // 8, 4))
    hi = tl.reshape(tl.join(tl.join(hi0, hi2), tl.join(hi1, hi3)), (ROWS, BLOCK_N // 8, 4))
    return tl.reshape(tl.join(lo, hi), (ROWS, BLOCK_N))


@triton.jit
def _unpack_awq(
    words,
    ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DTYPE: tl.constexpr,
    MAGIC: tl.constexpr,
    UNPACK: tl.constexpr,
):
    """int32 ``[ROWS, BLOCK_N / 8]`` AWQ words -> ``[ROWS, BLOCK_N]`` of ``DTYPE`` holding ``magic + q``.

    UNPACK 0 (nibble): eight shifts by constants, one column each; 1 (pair, 16-bit dtypes only):
    four shifts, two columns per 32-bit word; 2 (lop3): pair with the mask and the OR in one
    inline-PTX instruction (GPU only).
    """
    if UNPACK == 0:
        lo0 = _as_float((words & 0xF) | MAGIC, DTYPE)
        lo1 = _as_float(((words >> 4) & 0xF) | MAGIC, DTYPE)
        lo2 = _as_float(((words >> 8) & 0xF) | MAGIC, DTYPE)
        lo3 = _as_float(((words >> 12) & 0xF) | MAGIC, DTYPE)
        hi0 = _as_float(((words >> 16) & 0xF) | MAGIC, DTYPE)
        hi1 = _as_float(((words >> 20) & 0xF) | MAGIC, DTYPE)
        hi2 = _as_float(((words >> 24) & 0xF) | MAGIC, DTYPE)
        hi3 = _as_float(((words >> 28) & 0xF) | MAGIC, DTYPE)
        return _interleave_columns(lo0, lo1, lo2, lo3, hi0, hi1, hi2, hi3, ROWS, BLOCK_N)
    else:
        magic2: tl.constexpr = MAGIC * 65537  # the pattern in both 16-bit halves
        if UNPACK == 1:
            v0 = (words & 0x000F000F) | magic2
            v1 = ((words >> 4) & 0x000F000F) | magic2
            v2 = ((words >> 8) & 0x000F000F) | magic2
            v3 = ((words >> 12) & 0x000F000F) | magic2
        else:
            m2 = tl.full(words.shape, magic2, tl.int32)
            low = tl.full(words.shape, 0x000F000F, tl.int32)
            v0 = lop3_and_or(words, low, m2)
            v1 = lop3_and_or(words >> 4, low, m2)
            v2 = lop3_and_or(words >> 8, low, m2)
            v3 = lop3_and_or(words >> 12, low, m2)
        return _interleave_columns(
            _as_float(v0, DTYPE),
            _as_float(v1, DTYPE),
            _as_float(v2, DTYPE),
            _as_float(v3, DTYPE),
            _as_float(v0 >> 16, DTYPE),
            _as_float(v1 >> 16, DTYPE),
            _as_float(v2 >> 16, DTYPE),
            _as_float(v3 >> 16, DTYPE),
            ROWS,
            BLOCK_N,
        )


@triton.jit
def _load_scales(s_ptr, group, N, pid_n, BLOCK_N: tl.constexpr, DTYPE: tl.constexpr):
    """Row ``group`` of the scales, columns of tile ``pid_n``, as ``[1, BLOCK_N]``.

    16-bit scales are read as 32-bit words (two columns each) and split in registers: a load of
    16-bit elements is not pipelined by Triton, one of words is."""
    if DTYPE == tl.float32:
        offs = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        return tl.load(s_ptr + group * N + offs[None, :], mask=offs[None, :] < N, other=0.0)
    else:
        offs = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        words = tl.load(
            s_ptr.to(tl.pointer_type(tl.int32)) + group * (N // 2) + offs[None, :],
            mask=offs[None, :] < N // 2,
            other=0,
        )
        lo = _as_float(words, DTYPE)
        hi = _as_float(words >> 16, DTYPE)
        return tl.reshape(tl.join(lo, hi), (1, BLOCK_N))


@triton.jit
def _store_tile(
    acc,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    tile_id,
    pid_k,
    split_k,
    offs_m,
    offs_n,
    M,
    N,
    SPLIT: tl.constexpr,
    FIXUP: tl.constexpr,
):
    """Write a float32 ``[BLOCK_M, BLOCK_N]`` tile: directly, or as split ``pid_k``'s partial sum.

    With ``FIXUP`` the last split to arrive at the tile's counter adds the partials (in split order,
    so the sum does not depend on arrival order), writes the output and resets the counter.
    """
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    if not SPLIT:
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ws_ptr + pid_k * M * N + offs, acc, mask=mask)
        if FIXUP:
            tl.debug_barrier()  # every thread's partial is stored before the release below
            arrived = tl.atomic_add(cnt_ptr + tile_id, 1, sem="acq_rel", scope="gpu")
            if arrived == split_k - 1:
                total = tl.zeros_like(acc)
                for s in range(split_k):
                    total += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)
                tl.atomic_xchg(cnt_ptr + tile_id, 0, sem="relaxed", scope="gpu")


@triton.jit
def _w4a16_dot_kernel(
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
    GROUP_M: tl.constexpr,
    DTYPE: tl.constexpr,
    MAGIC: tl.constexpr,
    UNPACK: tl.constexpr,
    SWAP_AB: tl.constexpr,
    SPLIT: tl.constexpr,
    FIXUP: tl.constexpr,
    PRECISION: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        gdc_wait()  # programmatic dependent launch (kernels/pdl.py): x is written by the kernel before
        gdc_launch_dependents()
    BLOCK_N8: tl.constexpr = BLOCK_N // 8
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    # GROUP_M row tiles share their column tiles in L2
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    rows_here = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows_here
    pid_n = (pid % per_group) // rows_here

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_w = pid_n * BLOCK_N8 + tl.arange(0, BLOCK_N8)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_w = offs_w < n8

    # the launcher makes every split a whole number of BLOCK_K steps; saying so lets the x loads be
    # vectorised (and so pipelined)
    k_per_split = tl.multiple_of(K // split_k, BLOCK_K)
    k_begin = tl.multiple_of(pid_k * k_per_split, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + (k_begin + offs_k)[None, :] * stride_xk
    w_ptrs = qw_ptr + (k_begin + offs_k)[:, None] * n8 + offs_w[None, :]
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, k_per_split, BLOCK_K):
        a = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
        w = tl.load(w_ptrs, mask=mask_w[None, :], other=0)
        group = (k_begin + kk) // GROUP_SIZE
        zw = tl.load(qz_ptr + group * n8 + offs_w, mask=mask_w, other=0)
        sc = _load_scales(s_ptr, group, N, pid_n, BLOCK_N, DTYPE)  # [1, BLOCK_N]
        t = _unpack_awq(w, BLOCK_K, BLOCK_N, DTYPE, MAGIC, UNPACK)  # magic + q, exact
        zt = _unpack_awq(zw[None, :], 1, BLOCK_N, DTYPE, MAGIC, UNPACK)  # magic + z, exact
        b = (t - zt) * sc  # (q - z) exact, then one rounding by the scale
        if SWAP_AB:  # acc^T += W^T x^T: the weight tile is the MMA's (64-row) M side
            acc = tl.dot(tl.trans(b), tl.trans(a), acc, input_precision=PRECISION)
        else:
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * n8

    if SWAP_AB:
        acc = tl.trans(acc)
    _store_tile(acc, out_ptr, ws_ptr, cnt_ptr, pid, pid_k, split_k, offs_m, offs_n, M, N, SPLIT, FIXUP)


@dataclass(frozen=True, slots=True)
class GemmConfig:
    """One launch shape. ``kind`` "gemv" (CUDA cores; ``block_m`` is the row count, at most 4),
    "dot" (tensor cores: the ``splitk`` and ``tiled`` paths) or "dequant" (dequantize to scratch,
    then cuBLAS; of its fields only ``block_k`` is checked against the group, the rest are unused) or
    "cuda" (the CUDA C one-row GEMV, ``w4a16_cuda.py``: ``block_n`` its columns per block, ``block_k``
    its rows per thread, ``split_k`` follows from them) or "cuda_tc" (the tensor-core one-row GEMV on the
    AutoAWQ layout, ``w4a16_gemv_tc.py``: ``block_n`` its columns per block, ``block_k`` each lane's
    rows, ``num_warps`` the block's warps). ``unpack``, ``swap_ab`` and
    ``group_m`` apply to "dot" only, save the one-row GEMV kernels ``unpack="mask"`` and
    ``unpack="half2"`` (the latter for 16-bit activations only); ``fixup`` (in-kernel split-K reduction) to both."""

    kind: str
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    unpack: str = "lop3"
    swap_ab: bool = False
    group_m: int = 8
    fixup: bool = True

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r} must be one of {KINDS}")
        if self.unpack not in UNPACK_MODES:
            raise ValueError(f"unpack={self.unpack!r} must be one of {UNPACK_MODES}")
        if self.unpack in ONE_ROW_UNPACK and (self.kind != "gemv" or self.block_m != 1):
            raise ValueError(f"unpack={self.unpack!r} is a one-row gemv kernel's (kind='gemv', block_m=1)")
        if self.block_n % 8 or (self.kind == "dot" and self.block_n < 16):
            raise ValueError(f"block_n={self.block_n} must be a multiple of 8 (and >= 16 for dot)")


@lru_cache(maxsize=8)
def _num_sms(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _sm_count(device: torch.device) -> int:
    return _num_sms(_device_index(device)) if device.type == "cuda" else 4


def _block_k(group_size: int, preferred: int) -> int:
    if group_size % 16:
        raise ValueError(f"group_size={group_size} must be a multiple of 16 for the W4A16 kernel")
    block = min(preferred, group_size)
    while group_size % block:
        block //= 2
    return block


def _split_for(tiles: int, k: int, block_k: int, target: int, max_split: int = 32) -> int:
    """The power-of-two split of K that brings ``tiles`` programs up to ``target`` (keeping whole
    ``block_k`` steps, at least two per split)."""
    split = 1
    while (
        tiles * split < target
        and split * 2 <= max_split
        and k % (split * 2 * block_k) == 0
        and k // (split * 2) >= 2 * block_k
    ):
        split *= 2
    return split


def fit_config(
    template: GemmConfig, m: int, n: int, k: int, group_size: int, device: torch.device, waves: float
) -> GemmConfig:
    """``template`` with ``block_k`` made to divide the group and K split until the launch has about
    ``waves`` programs per multiprocessor (``waves`` 0: no split)."""
    if template.kind == "cuda":  # the variant fixes the split: K over the rows one block covers
        from hotloop.kernels import w4a16_cuda

        cols, rows = w4a16_cuda.tile(template.block_n // 32, template.block_k, template.num_warps * 32)
        if n % cols or k % rows or group_size % template.block_k:
            raise ValueError(f"{template} does not tile N={n}, K={k} with group_size={group_size}")
        return replace(template, block_m=m, split_k=k // rows)
    if template.kind == "cuda_tc":
        from hotloop.kernels import w4a16_gemv_tc

        variant = (template.block_n // 64, template.block_k, template.num_warps)
        why = w4a16_gemv_tc.fits(1, n, k, group_size, torch.float16, *variant)
        if why is not None:
            raise ValueError(f"{template} does not tile N={n}, K={k} with group_size={group_size}: {why}")
        return replace(template, block_m=m, split_k=k // w4a16_gemv_tc.tile(*variant)[1])
    block_k = _block_k(group_size, template.block_k)
    if template.kind == "dequant":
        return replace(template, block_k=block_k)
    if template.kind == "gemv":
        block_m, tiles = m, cdiv(n, template.block_n)
    else:
        block_m, tiles = template.block_m, cdiv(m, template.block_m) * cdiv(n, template.block_n)
    split = _split_for(tiles, k, block_k, int(waves * _sm_count(device))) if waves > 0 else 1
    return replace(template, block_m=block_m, block_k=block_k, split_k=split)


def _dot(block_m: int, block_n: int, block_k: int, warps: int, stages: int, swap: bool) -> GemmConfig:
    return GemmConfig("dot", block_m, block_n, block_k, num_warps=warps, num_stages=stages, swap_ab=swap)


# (launch template, programs per multiprocessor that the K split aims at; 0: no split). The lists
# hold the launches that were fastest somewhere on an H200 at the Llama-3-8B layer shapes
# (benchmarks/results/gpu_2026-11-30/awq_gemm.json, "tuning") and the runner-up where it was close.
Template = tuple[GemmConfig, float]
GEMV_TEMPLATES: tuple[Template, ...] = (
    (GemmConfig("gemv", 1, 256, 64, num_warps=4, num_stages=4), 2.0),
    (GemmConfig("gemv", 1, 128, 128, num_warps=4, num_stages=4), 2.0),
)
# the one-row GEMV that masks nibbles in place (``w4a16_gemv._w4a16_gemv_mask_kernel``): 5.3 SASS
# instructions per weight against 6.4 (ptxas); with it the tuner took batch-1 W4A16 decode on an H200
# from 276.6 to 307.1 tokens/s (BENCHMARKS.md)
GEMV_MASK_TEMPLATES: tuple[Template, ...] = (
    (GemmConfig("gemv", 1, 256, 64, num_warps=4, num_stages=4, unpack="mask"), 2.0),
    (GemmConfig("gemv", 1, 128, 128, num_warps=4, num_stages=4, unpack="mask"), 2.0),
)
# the packed 16-bit one-row GEMV (``w4a16_gemv._w4a16_gemv_half2_kernel``; 16-bit activations, so
# the tuner skips it for float32): 2.4-2.9 (fp16) and 2.7-3.1 (bf16) SASS instructions per weight
# against the mask kernel's 5.3 (benchmarks/ptxas_report.py gemv). On an H200 (CUDA graph, L2 flushed;
# an ad-hoc script: benchmarks/awq_gemm.py records the tuner's per-candidate times next) the
# fastest of these took 28.3 us at 4096x28672 and 16.9 us at 14336x4096 where the mask kernel's best
# took 37.2 and 22.3 (fp16 and bf16 alike), and tied it (9.8-12.5 us) at 4096x6144 and 4096x4096;
# n512/k64 and n512/k128 with 8 warps were slower everywhere and are left out
GEMV_HALF2_TEMPLATES: tuple[Template, ...] = (
    (GemmConfig("gemv", 1, 256, 128, num_warps=4, num_stages=3, unpack="half2"), 2.0),
    (GemmConfig("gemv", 1, 256, 64, num_warps=2, num_stages=4, unpack="half2"), 4.0),
    (GemmConfig("gemv", 1, 128, 128, num_warps=4, num_stages=4, unpack="half2"), 2.0),
)


# the CUDA C one-row GEMV (``kernels/w4a16_cuda.py``), one template per variant: ``block_n`` is its
# columns per block (32 lanes' worth per lane along N), ``block_k`` its rows per thread,
# ``num_warps`` its block's warps; timed only where nvcc can build it (``w4a16_cuda.available``)
def _cuda_templates() -> tuple[Template, ...]:
    from hotloop.kernels import w4a16_cuda

    return tuple(
        (GemmConfig("cuda", 1, 32 * nl, r, num_warps=threads // 32, num_stages=1), 0.0)
        for nl, r, threads in w4a16_cuda.VARIANTS
    )


# the tensor-core one-row GEMV on the AutoAWQ layout (``kernels/w4a16_gemv_tc.py``), one template per
# variant: ``block_n`` its columns per block (64 per word a lane loads per row), ``block_k`` each
# lane's rows, ``num_warps`` its block's warps; timed only where nvcc can build it
def _cuda_tc_templates() -> tuple[Template, ...]:
    from hotloop.kernels import w4a16_gemv_tc

    return tuple(
        (GemmConfig("cuda_tc", 1, 64 * wpl, it, num_warps=warps, num_stages=1), 0.0)
        for wpl, it, warps in w4a16_gemv_tc.VARIANTS
    )


SMALL_TEMPLATES: tuple[Template, ...] = (  # M <= 16
    (_dot(16, 64, 128, 4, 4, True), 4.0),
    (_dot(16, 128, 128, 4, 4, True), 2.0),
    (_dot(16, 128, 128, 4, 4, True), 4.0),
)
MID_TEMPLATES: tuple[Template, ...] = (  # 16 < M <= 64, and split tiles up to 256
    (_dot(64, 128, 64, 4, 4, False), 2.0),
    (_dot(32, 128, 128, 4, 4, True), 2.0),
    (_dot(64, 128, 64, 4, 4, True), 2.0),
)
LARGE_TEMPLATES: tuple[Template, ...] = (  # M > 64
    (_dot(128, 128, 64, 4, 4, False), 0.0),
    (_dot(128, 128, 64, 8, 4, False), 0.0),
)
# M > 64: dequantize the weight into a scratch matrix (``kernels/w4a16_dequant.py``), then cuBLAS.
# The dequantization is one pass over the weight whatever M is, so it pays only at large M; the
# tuner times it beside the in-register launches (block sizes here are not used by the launch).
DEQUANT_TEMPLATES: tuple[Template, ...] = ((GemmConfig("dequant", 1, 256, 32), 0.0),)

# The static choice per path: (largest M, template), from the same run.
TUNED: dict[str, tuple[tuple[int, Template], ...]] = {
    "gemv": ((GEMV_MAX_M, GEMV_TEMPLATES[0]),),
    "splitk": ((16, SMALL_TEMPLATES[0]), (32, MID_TEMPLATES[1]), (1 << 62, MID_TEMPLATES[0])),
    "tiled": ((1 << 62, LARGE_TEMPLATES[0]),),
    "dequant": ((1 << 62, DEQUANT_TEMPLATES[0]),),
}
AUTO_GEMV_MAX_M = 1  # the static ``auto`` choice: the CUDA-core GEMV at or below this many rows
AUTO_SPLITK_MAX_M = SPLITK_MAX_M


def choose_config(
    m: int, n: int, k: int, group_size: int, device: torch.device, path: str = "auto"
) -> GemmConfig:
    """The static launch for an ``[m, k] @ [k, n]`` product; ``path`` is auto, gemv, splitk, tiled or
    dequant (the static ``auto`` choice never takes dequant: only the tuner does, where it times faster)."""
    if path not in PATHS:
        raise ValueError(f"path={path!r} must be one of {PATHS}")
    if path == "auto":
        path = "gemv" if m <= AUTO_GEMV_MAX_M else "splitk" if m <= AUTO_SPLITK_MAX_M else "tiled"
    if path == "gemv" and m > GEMV_MAX_M:
        raise ValueError(f"the gemv path takes at most {GEMV_MAX_M} rows; got {m}")
    entries = TUNED[path]
    _, (template, waves) = next((e for e in entries if m <= e[0]), entries[-1])
    return fit_config(template, m, n, k, group_size, device, waves)


HALF2_ENV = "HOTLOOP_W4A16_HALF2"


def half2_allowed() -> bool:
    """Whether the tuner may pick the ``half2`` GEMV (HOTLOOP_W4A16_HALF2=0 keeps float32 partial
    sums everywhere: about twice the mask kernel's error, ``HALF2_ROWS``, for 1.3x its speed at the
    large shapes)."""
    return os.environ.get(HALF2_ENV, "1") != "0"


def candidates(m: int) -> tuple[Template, ...]:
    """The launch templates ``auto`` times for ``m`` rows."""
    if m == 1:
        half2 = GEMV_HALF2_TEMPLATES if half2_allowed() else ()
        cuda = _cuda_templates() if half2 and _cuda_buildable() else ()
        # float32 sums throughout: not subject to HOTLOOP_W4A16_HALF2
        cuda_tc = _cuda_tc_templates() if _cuda_tc_enabled() and _cuda_buildable() else ()
        return GEMV_TEMPLATES + GEMV_MASK_TEMPLATES + half2 + cuda + cuda_tc + SMALL_TEMPLATES
    if m <= GEMV_MAX_M:
        return GEMV_TEMPLATES + SMALL_TEMPLATES
    if m <= 16:
        return SMALL_TEMPLATES
    if m <= 64:
        return MID_TEMPLATES
    if m <= 256:
        return MID_TEMPLATES[:1] + LARGE_TEMPLATES + DEQUANT_TEMPLATES
    return LARGE_TEMPLATES + DEQUANT_TEMPLATES


CUDA_TC_ENV = "HOTLOOP_W4A16_TC"


def _cuda_tc_enabled() -> bool:
    """Whether the tuner may time the tensor-core one-row GEMV (``HOTLOOP_W4A16_TC=1``; off by default:
    in the engine at batch 1 it measured neither faster nor slower on an H100, and its final form,
    weight loads that really start before the kernel's wait, has not run in the engine yet)."""
    value = os.environ.get(CUDA_TC_ENV, "0")
    if value not in ("0", "1") and value not in _warned_tc_values:
        _warned_tc_values.add(value)
        logger.warning("%s=%r: use 0 or 1; taking 0", CUDA_TC_ENV, value)
    return value == "1"


_warned_tc_values: set[str] = set()


def _cuda_buildable() -> bool:
    """Whether the CUDA C kernels could be built here (a GPU, nvcc, not turned off); whether they
    actually build is found at their first launch (the tuner skips a launch that fails)."""
    from hotloop.kernels import w4a16_cuda

    return torch.cuda.is_available() and w4a16_cuda.available(torch.device("cuda"))


def m_bucket(m: int) -> int:
    """The tuning bucket of ``m`` rows: 1, 2, 4, 8, ... up to 512, then 1024, then one for all."""
    if m > 1024:
        return 1 << 62
    return 1 << (m - 1).bit_length()


def _tile_counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """Zeroed int32 counters for the split-K fixup, one per output tile (``kernels/counters.py``);
    ``None``: use the two-kernel reduction."""
    return counters.counters(device, "w4a16_splitk", tiles)


def _check_half2(cfg: GemmConfig, dtype: torch.dtype) -> None:
    """The ``half2`` GEMV's own limits: 16-bit activations, and K steps of whole ``ROWS``-row
    elements, a power of two of them."""
    if dtype not in HALF2_ROWS:
        raise ValueError(f"unpack='half2' needs float16 or bfloat16 activations; got {dtype}")
    per = cfg.block_k // HALF2_ROWS[dtype]
    if cfg.block_k % HALF2_ROWS[dtype] or per & (per - 1):
        raise ValueError(
            f"unpack='half2' needs block_k a power of two times {HALF2_ROWS[dtype]}; got {cfg.block_k}"
        )


_dequant_oom_warned = False
_cuda_fallback_warned = False


def _warn_cuda_fallback(e: Exception) -> None:
    global _cuda_fallback_warned
    _cuda_fallback_warned = True
    logger.warning("W4A16: the CUDA GEMV cannot run here (%s); using the Triton GEMV", e)


def _warn_dequant_oom(n: int, k: int) -> None:
    global _dequant_oom_warned
    _dequant_oom_warned = True
    logger.warning(
        "W4A16: no memory for the dequant launch's %d x %d scratch weight; using the tiled kernel "
        "(a lower --cache-max-entry-count leaves room for it)",
        k,
        n,
    )


def _launch(
    cfg: GemmConfig,
    x2: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """Run one launch shape on ``x2 [m, k]``; returns ``[m, n]``."""
    m, k = x2.shape
    n = qweight.shape[1] * PACK_FACTOR
    if k % (cfg.split_k * cfg.block_k) or group_size % cfg.block_k:
        raise ValueError(f"{cfg} does not tile K={k} with group_size={group_size}")
    if cfg.kind == "dequant":
        from hotloop.kernels.w4a16_dequant import w4a16_dequantize

        if scales.dtype != x2.dtype:
            raise ValueError(f"the dequant launch needs scales in x's dtype {x2.dtype}; got {scales.dtype}")
        try:
            # cuBLAS may reduce split-K partials in 16 bits (torch's allow_*_reduced_precision_reduction);
            # the Triton launches always accumulate in float32. Both stay within the tests' bounds.
            return torch.matmul(x2, w4a16_dequantize(qweight, qzeros, scales, group_size))
        except torch.OutOfMemoryError:
            # The scratch weight ([K, N] in 16 bits) comes out of the memory the KV cache leaves; a
            # choice tuned (and stored on disk) with more headroom falls back to the tiled kernel.
            if not _dequant_oom_warned:
                _warn_dequant_oom(n, k)
            return _launch(
                choose_config(m, n, k, group_size, x2.device, "tiled"),
                x2,
                qweight,
                qzeros,
                scales,
                group_size,
            )
    if cfg.kind == "cuda":
        from hotloop.kernels import cuda_jit, w4a16_cuda

        try:
            return w4a16_cuda.gemv(
                x2, qweight, qzeros, scales, group_size, cfg.block_n // 32, cfg.block_k, cfg.num_warps * 32
            )
        except (cuda_jit.CudaError, ValueError) as e:
            # a choice tuned (and stored) where the CUDA kernel ran, used where it cannot (no nvcc
            # now, a first launch inside a CUDA-graph capture): the Triton GEMV instead
            if not _cuda_fallback_warned:
                _warn_cuda_fallback(e)
            return _launch(choose_config(m, n, k, group_size, x2.device, "gemv"), x2, qweight, qzeros, scales,
                           group_size)  # fmt: skip
    if cfg.kind == "cuda_tc":
        from hotloop.kernels import cuda_jit, w4a16_gemv_tc

        try:
            return w4a16_gemv_tc.gemv(
                x2,
                qweight,
                qzeros,
                scales,
                group_size,
                cfg.block_n // 64,
                cfg.block_k,
                cfg.num_warps,
            )
        except (cuda_jit.CudaError, ValueError) as e:
            if not _cuda_fallback_warned:
                _warn_cuda_fallback(e)
            return _launch(choose_config(m, n, k, group_size, x2.device, "gemv"), x2, qweight, qzeros, scales,
                           group_size)  # fmt: skip
    if cfg.kind == "gemv":
        rows = 1 if cfg.unpack in ONE_ROW_UNPACK else GEMV_MAX_M
        if m > rows:
            raise ValueError(f"the {cfg.unpack} gemv kernel takes at most {rows} rows; got {m}")
        if cfg.unpack == "half2":
            _check_half2(cfg, x2.dtype)
        tiles = cdiv(n, cfg.block_n)
    else:
        tiles = cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n)
    out = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    tile_counts = _tile_counters(x2.device, tiles) if cfg.split_k > 1 and cfg.fixup else None
    fixup = tile_counts is not None
    ws = torch.empty(cfg.split_k, m, n, dtype=torch.float32, device=x2.device) if cfg.split_k > 1 else out
    cnt = tile_counts if tile_counts is not None else out
    grid = (tiles, cfg.split_k)
    on_gpu = x2.device.type == "cuda"
    if cfg.kind == "gemv":
        from hotloop.kernels import w4a16_gemv

        extra: dict[str, int]
        if cfg.unpack == "mask":  # one row; masks nibbles in place
            kernel, extra = w4a16_gemv._w4a16_gemv_mask_kernel, {"LOP3": int(on_gpu)}
        elif cfg.unpack == "half2":  # one row; packed 16-bit arithmetic (inline PTX on a GPU)
            kernel = w4a16_gemv._w4a16_gemv_half2_kernel
            extra = {"ROWS": HALF2_ROWS[x2.dtype], "ASM": int(on_gpu)}
        else:
            kernel, extra = (
                w4a16_gemv._w4a16_gemv_kernel,
                {"BLOCK_M": m, "LOP3": int(cfg.unpack == "lop3" and on_gpu)},
            )
        kernel[grid](
            x2,
            qweight,
            qzeros,
            scales,
            out,
            ws,
            cnt,
            m,
            n,
            k,
            n // PACK_FACTOR,
            x2.stride(0),
            x2.stride(1),
            cfg.split_k,
            GROUP_SIZE=group_size,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            SPLIT=cfg.split_k > 1,
            FIXUP=fixup,
            NUM_STAGES=cfg.num_stages,
            PDL=pdl(x2.device),
            num_warps=cfg.num_warps,
            **extra,
            **launch_kwargs(x2.device),
        )
    else:
        sixteen = x2.dtype != torch.float32
        unpack = UNPACK_MODES.index(cfg.unpack)
        if not sixteen:
            unpack = 0  # two columns per word need 16-bit values
        elif unpack == 2 and not on_gpu:
            unpack = 1  # inline PTX does not run in the interpreter
        _w4a16_dot_kernel[grid](
            x2,
            qweight,
            qzeros,
            scales,
            out,
            ws,
            cnt,
            m,
            n,
            k,
            n // PACK_FACTOR,
            x2.stride(0),
            x2.stride(1),
            cfg.split_k,
            GROUP_SIZE=group_size,
            BLOCK_M=cfg.block_m,
            BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k,
            GROUP_M=cfg.group_m,
            DTYPE=_TL_DTYPE[x2.dtype],
            MAGIC=_MAGIC[x2.dtype],
            UNPACK=unpack,
            SWAP_AB=cfg.swap_ab,
            SPLIT=cfg.split_k > 1,
            FIXUP=fixup,
            PRECISION="tf32" if sixteen else "ieee",
            PDL=pdl(x2.device),
            num_warps=cfg.num_warps,
            num_stages=cfg.num_stages,
            **launch_kwargs(x2.device),
        )
    if cfg.split_k > 1 and not fixup:
        out = ws.sum(dim=0).to(x2.dtype)
    return out


_flush_buffers: dict[int, torch.Tensor] = {}


def graph_time_us(fn: Callable[[], object], device: torch.device, reps: int = 8, trials: int = 3) -> float:
    """GPU time of ``fn()`` in microseconds with a cold L2: ``reps`` calls, each after a write of
    twice the L2 size, captured in one CUDA graph, less the same graph without the calls (best of
    ``trials`` replays each). Host launch overhead is not counted."""
    index = _device_index(device)
    flush = _flush_buffers.get(index)
    if flush is None:
        l2 = int(getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 64 << 20))
        flush = _flush_buffers[index] = torch.empty(max(2 * l2, 64 << 20), dtype=torch.int8, device=device)
    fn()
    torch.cuda.synchronize(device)
    graphs = []
    for with_fn in (False, True):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                flush.zero_()
                if with_fn:
                    fn()
        graphs.append(graph)
    best = []
    for graph in graphs:
        graph.replay()  # warm
        times = []
        for _ in range(trials):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
        best.append(min(times))
    return max(best[1] - best[0], 0.0) / reps


# (device index, dtype, M bucket, N, K, group) -> the fastest launch, and every candidate's time
_tuned: dict[tuple, GemmConfig] = {}
tuning_log: dict[tuple, list[tuple[GemmConfig, float]]] = {}


def tuned_launches() -> list[dict[str, Any]]:
    """The launches the tuner has chosen in this process (tuned or read from disk), one record per
    (dtype, M bucket, N, K, group): what a benchmark ran, for its JSON."""
    out = []
    for (_index, dtype, mb, n, k, group), cfg in sorted(_tuned.items(), key=lambda kv: str(kv[0])):
        out.append({"dtype": str(dtype).removeprefix("torch."), "m_bucket": mb, "n": n, "k": k, "group": group,
                    "kind": cfg.kind, "block_m": cfg.block_m, "block_n": cfg.block_n, "block_k": cfg.block_k,
                    "split_k": cfg.split_k, "num_warps": cfg.num_warps, "unpack": cfg.unpack})  # fmt: skip
    return out


def _tuning_enabled() -> bool:
    return os.environ.get(TUNE_ENV, "1") not in ("0", "", "false", "False")


def _tune(
    x2: torch.Tensor, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int
) -> GemmConfig:
    m, k = x2.shape
    n = qweight.shape[1] * PACK_FACTOR
    timed: list[tuple[GemmConfig, float]] = []
    for template, waves in candidates(m):
        if template.kind in ("cuda", "cuda_tc") and x2.dtype not in (torch.float16, torch.bfloat16):
            continue  # 16-bit activations only (their launch would fall back to the Triton GEMV)
        try:
            cfg = fit_config(template, m, n, k, group_size, x2.device, waves)
        except ValueError:  # a template that cannot tile this shape
            continue
        if any(c == cfg for c, _ in timed):
            continue
        try:
            us = graph_time_us(partial(_launch, cfg, x2, qweight, qzeros, scales, group_size), x2.device)
        except Exception:  # a candidate this GPU or compiler cannot run: skip it
            torch.cuda.synchronize(x2.device)
            continue
        timed.append((cfg, us))
    key = (_device_index(x2.device), x2.dtype, m_bucket(m), n, k, group_size)
    tuning_log[key] = timed
    if not timed:
        return choose_config(m, n, k, group_size, x2.device)
    return min(timed, key=lambda t: t[1])[0]


_plans: dict[tuple, GemmConfig] = {}
_disk: dict[str, dict] | None = None
TUNING_FAMILY = "w4a16_gemm"


def candidates_tag(m: int) -> str:
    """A short fingerprint of the templates ``auto`` times for ``m`` rows: a stored choice made
    among other candidates (an older version's) is not reused, so a new candidate gets timed."""
    import hashlib

    return hashlib.sha1(repr(candidates(m)).encode()).hexdigest()[:8]


def disk_key(tkey: tuple) -> str:
    """The on-disk key of a tuning key ``(device index, dtype, M bucket, N, K, group)``: the GPU's
    name and the compiler versions instead of the device index, and the candidate set; for one row
    also the CUDA GEMV's early-load form (``HOTLOOP_W4A16_EARLY``), whose kernels may want other
    variants (a choice tuned under one form is not reused under another)."""
    from hotloop.kernels import w4a16_cuda

    index, dtype, mb, n, k, group = tkey
    name = torch.cuda.get_device_name(index) if torch.cuda.is_available() else "cpu"
    cand = candidates_tag(min(mb, 1 << 20))
    early = f"|e{w4a16_cuda.early_form()}" if mb == 1 else ""
    return f"{tuning_cache.environment_key(name)}|{dtype}|m{mb}|n{n}|k{k}|g{group}|c{cand}{early}"


def config_from_dict(d: dict) -> GemmConfig | None:
    """A stored config, or None when it does not describe a valid one (an older or foreign file)."""
    try:
        return GemmConfig(**d)
    except (TypeError, ValueError):
        return None


def _from_disk(tkey: tuple) -> GemmConfig | None:
    global _disk
    if _disk is None:
        _disk = tuning_cache.load(TUNING_FAMILY)
    d = _disk.get(disk_key(tkey))
    return config_from_dict(d) if d is not None else None


def _to_disk(tkey: tuple, cfg: GemmConfig) -> None:
    from dataclasses import asdict

    key = disk_key(tkey)
    tuning_cache.store(TUNING_FAMILY, key, asdict(cfg))
    if _disk is not None:
        _disk[key] = asdict(cfg)


def _plan(
    x2: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    path: str,
) -> GemmConfig:
    """The launch for this call, memoised per (shape, dtype, device, path)."""
    m, k = x2.shape
    n = qweight.shape[1] * PACK_FACTOR
    dev = x2.device
    tune = path == "auto" and dev.type == "cuda" and _tuning_enabled()
    key = (m, n, k, group_size, x2.dtype, dev.type, dev.index, path, tune)
    cfg = _plans.get(key)
    if cfg is not None:
        return cfg
    if tune:
        tkey = (_device_index(dev), x2.dtype, m_bucket(m), n, k, group_size)
        best = _tuned.get(tkey) or _from_disk(tkey)
        if best is None:
            if torch.cuda.is_current_stream_capturing():
                return choose_config(m, n, k, group_size, dev)  # not remembered: tune outside the capture
            best = _tune(x2, qweight, qzeros, scales, group_size)
            _to_disk(tkey, best)
        _tuned[tkey] = best
        # a dot launch's tiles cover any m of the bucket; the gemv takes its rows as a constant
        cfg = replace(best, block_m=m) if best.kind == "gemv" else best
    else:
        cfg = choose_config(m, n, k, group_size, dev, path)
    if len(_plans) > 4096:
        _plans.clear()
    _plans[key] = cfg
    return cfg


def plan(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    path: str = "auto",
) -> GemmConfig:
    """The launch :func:`w4a16_gemm` uses for these arguments (``auto`` on a GPU: tuned, see above)."""
    if path not in PATHS:
        raise ValueError(f"path={path!r} must be one of {PATHS}")
    x2, qweight, qzeros, scales = (_aligned(t) for t in (x.reshape(-1, x.shape[-1]), qweight, qzeros, scales))
    return _plan(x2, qweight, qzeros, scales, group_size, path)


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous with a 16-byte aligned start (a copy where it is not)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def w4a16_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    path: str = "auto",
    config: GemmConfig | None = None,
) -> torch.Tensor:
    """``x [..., in] @ W [in, out]`` -> ``[..., out]`` in x's dtype (scales must share x's dtype).

    ``qweight`` int32 ``[in, out // 8]``, ``qzeros`` int32 ``[in // group_size, out // 8]``,
    ``scales`` ``[in // group_size, out]`` (AutoAWQ GEMM layout). ``path`` forces a launch
    (auto, gemv, splitk, tiled, dequant); ``config`` overrides the whole launch shape.
    """
    check_awq_shapes(qweight, qzeros, scales, group_size)
    k, n = qweight.shape[0], qweight.shape[1] * PACK_FACTOR
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} input features; the weight has {k}")
    if scales.dtype != x.dtype:
        raise ValueError(f"scales dtype {scales.dtype} must equal x dtype {x.dtype}")
    if x.dtype not in _MAGIC:
        raise ValueError(f"x dtype {x.dtype} must be float16, bfloat16 or float32")
    if path not in PATHS:
        raise ValueError(f"path={path!r} must be one of {PATHS}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if m == 0:
        return x.new_empty(*lead, n)
    # the kernels read 16-bit scales and activations as 32-bit words, and the activations with K
    # stride 1
    x2, qweight, qzeros, scales = (_aligned(t) for t in (x2, qweight, qzeros, scales))
    if config is not None:
        cfg = replace(config, block_m=m) if config.kind == "gemv" else config
    else:
        cfg = _plan(x2, qweight, qzeros, scales, group_size, path)
    return _launch(cfg, x2, qweight, qzeros, scales, group_size).view(*lead, n)


def w4a16_silu_mul_gemm(
    gate_up: torch.Tensor,
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
) -> torch.Tensor | None:
    """``silu(gate) * up @ W`` for one row ``gate_up [1, 2K]`` ([gate | up]) in one launch
    (``w4a16_cuda.gemv_silu_mul``, with the variant the tuner chose for the plain ``[1, K]`` product),
    or None where that does not apply: off (``HOTLOOP_W4A16_FUSED_SILU``), not one 16-bit row on CUDA,
    the tuned launch not the CUDA GEMV, or a launch that cannot run here (no counters inside a capture,
    no nvcc). The caller then runs ``silu_and_mul`` and :func:`w4a16_gemm`."""
    from hotloop.kernels import cuda_jit, w4a16_cuda

    if not w4a16_cuda.silu_fusion() or gate_up.device.type != "cuda" or gate_up.dim() != 2:
        return None
    k = qweight.shape[0]
    if (
        gate_up.shape[0] != 1
        or gate_up.shape[1] != 2 * k
        or gate_up.dtype not in (torch.float16, torch.bfloat16)
    ):
        return None
    if scales.dtype != gate_up.dtype or not gate_up.is_contiguous() or gate_up.data_ptr() % 16 or k % 8:
        return None
    qweight, qzeros, scales = (_aligned(t) for t in (qweight, qzeros, scales))
    cfg = _plan(gate_up[:, :k], qweight, qzeros, scales, group_size, "auto")
    if cfg.kind != "cuda":
        return None
    try:
        return w4a16_cuda.gemv_silu_mul(
            gate_up, qweight, qzeros, scales, group_size, cfg.block_n // 32, cfg.block_k, cfg.num_warps * 32
        )
    except (cuda_jit.CudaError, ValueError):
        return None
