"""The split merge of an int8-KV decode step that also writes the step's token (Triton).

At batch 1 a float cache's step has four launches a layer around attention: the q/k/v GEMV (whose
epilogue rotates q and k and writes the cache), the decode kernel, its split merge, the o GEMV. An
int8 cache needs each head's whole row for its scale and zero, which the GEMV's programs do not
hold, so the quantized write was a launch of its own (``rotary_kv_write``): one more a layer, the
1% by which int8 trailed fp16 at batch 1. Here it rides in the merge instead:

- the q/k/v GEMV rotates q and k and hands k and v over (``dense_gemv_qkv_rope_staged``);
- the CUDA int8 decode kernel attends over the context *before* the step's token
  (``kv_int8_decode_cuda.launch``'s ``exclude_newest``): every row it reads is already in the cache,
  so all its tiles are requested before it waits for the GEMV;
- this kernel, per (sequence, query head), quantizes the step's k and v rows exactly as
  ``rotary_kv_write`` does (``kv_quant_triton``'s arithmetic, so the cache bytes are the same),
  writes them at the token's slot (the group's first query head writes), and merges the splits'
  partials with the token as one more split of one key: its score is q against the dequantized k,
  its value the dequantized v. The quantization and the write run before the kernel waits for the
  decode launch (griddepcontrol): they read only what the GEMV two launches back wrote, which the
  decode kernel waited for before it let this launch start.

The batch-1 step over an int8 cache takes this path by default; ``HOTLOOP_KV_MERGE_WRITE=0``
(``enabled``) restores the separate write. ``decode_with_merge_write`` falls back to the write
followed by the plain decode where the CUDA kernel cannot take the launch or there is only one split
(no merge launch to ride in). Measured on an H100 (Llama-3-8B shape, batch 1, 128 / 512, alternating
on one host, benchmarks/results/gpu_2026-12-06b): int8 KV 193.12 / 192.99 tokens/s with it against
191.96 / 191.86 without, fp16 KV 193.12 / 192.92; with 8 steps a launch 193.65 / 193.61 against
192.53 / 192.51, fp16 193.47 / 193.53.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from hotloop.kernels import kv_int8_decode_cuda, kv_quant
from hotloop.kernels.checks import check
from hotloop.kernels.kv_quant_triton import quant_codes, quant_params, quant_rows
from hotloop.kernels.launch_math import next_power_of_2
from hotloop.kernels.launch_replay import recordable
from hotloop.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_kwargs, pdl

ENV = "HOTLOOP_KV_MERGE_WRITE"
_LOG2E = 1.4426950408889634


def enabled() -> bool:
    """``HOTLOOP_KV_MERGE_WRITE`` is not 0 (read at each call; on by default)."""
    raw = os.environ.get(ENV, "1")
    if raw not in ("0", "1", ""):
        raise ValueError(f"{ENV}={raw!r} must be 0 or 1")
    return raw == "1"


def applies(k_cache: torch.Tensor, head_dim: int, dtype: torch.dtype, sliding_window: int | None) -> bool:
    """Whether a decode step over ``k_cache`` (a layer of ``head_dim`` in a ``dtype`` model) takes the
    merge write: ``enabled``, an int8 cache, no sliding window (the CUDA kernel attends over the
    whole context). An int4 cache keeps the separate quantized write."""
    if k_cache.dtype != torch.uint8 or sliding_window:
        return False
    return kv_quant.cache_policy(k_cache, head_dim, dtype) == 8 and enabled()


@recordable
@triton.jit
def _merge_write_kernel(
    part_ptr,  # [B, H, S, D] float32: the splits' partial outputs (the step's token excluded)
    lse_ptr,  # [B, H, S] float32, log2 units
    q_ptr,  # [B, H, D] model dtype, rotated
    kv_ptr,  # [B, 2 KV, D] model dtype: the step's k (rotated), then v
    slot_ptr,  # [B] int64: the step's token's slot (negative: a padding row, not written)
    k_cache_ptr,  # uint8 blocks (kv_quant.py)
    v_cache_ptr,
    out_ptr,  # [B, H, D] model dtype
    scale_log2,
    stride_qb,
    stride_qh,
    stride_kvb,
    stride_kb,
    stride_vb,
    stride_ob,
    stride_oh,
    H: tl.constexpr,
    KV: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SCALE_BITS: tl.constexpr,
    PDL: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    G: tl.constexpr = H // KV
    kvh = h // G
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    md = mask_d[None, :]
    # ---- before the wait: the step's q, k and v (written by the q/k/v GEMV, which the decode
    # launch waited for before it let this one start)
    kv_row = kv_ptr + b * stride_kvb
    xk = tl.load(kv_row + kvh * D + offs_d[None, :], mask=md, other=0.0).to(tl.float32)  # [1, BLOCK_D]
    xv = tl.load(kv_row + (KV + kvh) * D + offs_d[None, :], mask=md, other=0.0).to(tl.float32)
    lo_k = tl.min(tl.where(md, xk, float("inf")), 1)  # [1]: the zero, a model-dtype value
    hi_k = tl.max(tl.where(md, xk, float("-inf")), 1)
    lo_v = tl.min(tl.where(md, xv, float("inf")), 1)
    hi_v = tl.max(tl.where(md, xv, float("-inf")), 1)
    sc_k, inv_k = quant_params(lo_k, hi_k, kv_ptr, 255, SCALE_BITS)
    sc_v, inv_v = quant_params(lo_v, hi_v, kv_ptr, 255, SCALE_BITS)
    ck = quant_codes(xk, lo_k, inv_k, 255)  # int32 [1, BLOCK_D]
    cv = quant_codes(xv, lo_v, inv_v, 255)
    slot = tl.load(slot_ptr + b)
    if (h % G == 0) & (slot >= 0):  # the group's first query head writes the row for all of them
        tok = slot % BS
        codes_k, params_k = quant_rows(k_cache_ptr + (slot // BS) * stride_kb, tok, kvh, kv_ptr, BS, KV, D)
        codes_v, params_v = quant_rows(v_cache_ptr + (slot // BS) * stride_vb, tok, kvh, kv_ptr, BS, KV, D)
        tl.store(codes_k + offs_d[None, :], ck.to(tl.uint8), mask=md)
        tl.store(codes_v + offs_d[None, :], cv.to(tl.uint8), mask=md)
        one = tl.arange(0, 1)
        tl.store(params_k + one, sc_k)
        tl.store(params_k + 1 + one, lo_k.to(kv_ptr.dtype.element_ty))
        tl.store(params_v + one, sc_v)
        tl.store(params_v + 1 + one, lo_v.to(kv_ptr.dtype.element_ty))
    # the token's score and value as the decode kernel reads a cached row: q rounded to fp16 (clamped
    # into its range), codes times the scale plus the zero
    qf = tl.load(q_ptr + b * stride_qb + h * stride_qh + offs_d[None, :], mask=md, other=0.0).to(tl.float32)
    qd = tl.minimum(tl.maximum(qf, -65504.0), 65504.0).to(tl.float16).to(tl.float32)
    dot = tl.sum(qd * ck.to(tl.float32), 1)  # [1]
    s_new = tl.max((dot * sc_k.to(tl.float32) + lo_k * tl.sum(qd, 1)) * scale_log2, 0)  # scalar
    v_new = tl.sum(cv.to(tl.float32) * sc_v.to(tl.float32)[:, None] + lo_v[:, None], 0)  # [BLOCK_D]
    # ---- the splits' partials: written by the decode launch
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < NUM_SPLITS
    base = (b * H + h) * NUM_SPLITS
    lse = tl.load(lse_ptr + base + offs_s, mask=mask_s, other=float("-inf"))
    m = tl.maximum(tl.max(lse, 0), s_new)  # finite: the token's score is
    w = tl.exp2(lse - m)
    w_new = tl.exp2(s_new - m)
    part = tl.load(
        part_ptr + (base + offs_s)[:, None] * D + offs_d[None, :],
        mask=mask_s[:, None] & md,
        other=0.0,
    )
    o = (tl.sum(part * w[:, None], 0) + w_new * v_new) / (tl.sum(w, 0) + w_new)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, o.to(out_ptr.dtype.element_ty), mask=mask_d)


def merge_and_write(
    part: torch.Tensor,
    lse: torch.Tensor,
    q: torch.Tensor,
    kv: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Merge the decode splits ``part [B, H, S, D]`` / ``lse [B, H, S]`` (float32, log2 units) of a
    launch that stopped before each sequence's newest token, with that token as one more split;
    quantize the token's ``kv [B, 2 KV, D]`` (k rotated, then v, in q's dtype) into the int8
    ``k_cache`` / ``v_cache`` ``[NB, BS, KV, D + 2 itemsize]`` at ``slots [B]`` (int64; negative: not
    written). ``q [B, H, D]`` rotated; ``scale`` the softmax scale. Returns ``[B, H, D]`` in q's
    dtype (into ``out`` where given)."""
    B, H, S, D = part.shape
    KV = k_cache.shape[2]
    check(q.shape == (B, H, D) and q.stride(-1) == 1, f"q {tuple(q.shape)} must be [{B}, {H}, {D}]")
    check(lse.shape == (B, H, S) and lse.is_contiguous() and part.is_contiguous(), "part / lse: dense")
    check(
        kv.shape == (B, 2 * KV, D) and kv.stride(2) == 1 and kv.stride(1) == D,
        f"kv must be [{B}, {2 * KV}, {D}]",
    )
    check(kv.dtype == q.dtype, f"kv is {kv.dtype}, q {q.dtype}")
    check(H % KV == 0, f"num_heads={H} is not a multiple of num_kv_heads={KV}")
    check(kv_quant.cache_policy(k_cache, D, q.dtype) == 8, "the cache must be int8 (kv_quant.py)")
    check(v_cache.shape == k_cache.shape and v_cache.dtype == k_cache.dtype, "k_cache and v_cache differ")
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        _nb, bs, kvh, row = c.shape
        check(c.stride()[1:] == (kvh * row, row, 1), f"{name}: a quantized cache's blocks must be dense")
    check(slots.shape == (B,) and slots.dtype == torch.int64, f"slots must be int64 [{B}]")
    if out is None:
        out = torch.empty_like(q)
    check(out.shape == q.shape and out.stride(-1) == 1, f"out {tuple(out.shape)} must match q")
    if B == 0:
        return out
    _merge_write_kernel[(B, H)](
        part,
        lse,
        q,
        kv,
        slots,
        k_cache,
        v_cache,
        out,
        scale * _LOG2E,
        q.stride(0),
        q.stride(1),
        kv.stride(0),
        k_cache.stride(0),
        v_cache.stride(0),
        out.stride(0),
        out.stride(1),
        H=H,
        KV=KV,
        D=D,
        BS=k_cache.shape[1],
        NUM_SPLITS=S,
        BLOCK_S=max(2, next_power_of_2(S)),
        BLOCK_D=max(16, next_power_of_2(D)),
        SCALE_BITS=8 * q.element_size(),
        PDL=pdl(q.device),
        num_warps=4,
        **launch_kwargs(q.device),
    )
    return out


def decode_with_merge_write(
    q: torch.Tensor,
    kv: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    slots: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    graph_plan: bool = False,
    max_splits: int | None = None,
    num_splits: int | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Decode attention over a quantized cache where this step's token (``kv [B, 2 KV, D]``: k
    rotated, then v) is not yet in it: for an int8 cache the CUDA kernel over the older context, then
    ``merge_and_write``. Where that cannot run (an int4 cache, a sliding window, no CUDA kernel
    here, or a launch of one split: no merge to ride in) the token is written first
    (``write_kv_cache``) and the plain decode runs. Arguments as ``paged_decode_attention``'s
    (``seq_lens`` counts the step's token)."""
    from hotloop.kernels.paged_decode_attention import (
        decode_attention_partials,
        decode_plan,
        num_decode_splits,
        paged_decode_attention,
    )
    from hotloop.kernels.rotary_kv_write import write_kv_cache

    B, H, D = q.shape
    KV = k_cache.shape[2]
    quant = kv_quant.cache_policy(k_cache, D, q.dtype)
    if num_splits is None:
        num_splits = (
            decode_plan(B, KV, quant, D, q.element_size(), max_splits)[0]
            if graph_plan
            else num_decode_splits(B, KV, quant)
        )
    if (
        quant == 8
        and not sliding_window  # (the CUDA kernel attends over the whole context)
        and num_splits > 1
        and kv_int8_decode_cuda.takes(q, k_cache, v_cache, quant, H // KV, 0, False)
    ):
        res = decode_attention_partials(
            q, k_cache, v_cache, block_tables, seq_lens, scale, None, num_splits, out, fuse_merge=False,
            exclude_newest=True,
        )  # fmt: skip
        assert res.part is not None and res.lse is not None
        return merge_and_write(res.part, res.lse, q, kv, slots, k_cache, v_cache, scale, res.out)
    write_kv_cache(kv[:, :KV], kv[:, KV:], k_cache, v_cache, slots)
    return paged_decode_attention(
        q, k_cache, v_cache, block_tables, seq_lens, scale, sliding_window, num_splits, out, fuse_merge=False
    )
