"""Prefill attention over the paged KV cache (variable lengths, causal), Triton, flash-attention style.

Each sequence contributes ``query_len`` new tokens whose K/V are already in the cache, after a cached
prefix of ``seq_len - query_len`` tokens (a chunk of a chunked prefill, or a prompt after a prefix
cache hit). One program handles ``BLOCK_M`` queries of one head and streams the keys it may see
from the cache with an online softmax. Decode rows (``query_len == 1``) are just short sequences, so
a mixed batch is one launch.

A quantized (``uint8``) cache is read through the same kernel with ``QUANT`` 8 or 4 and dequantized
per tile in registers, as in ``paged_decode_attention.py``. Given this step's K/V as well (``k_new`` /
``v_new``, ``FRESH``), a row of more than one new token reads only its cached prefix from the cache
and its own tokens' keys from those, in the model dtype: the prompt attends to itself unquantized (as
vLLM's and LMDeploy's quantized caches do), at the float kernel's speed, and later steps read the
quantized copy that ``rotary_kv_write`` stored. A single-token row (a decode, or a one-token chunk)
reads everything from the cache, as the decode kernel does.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

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
    quant_weighted_values,
    to_dot_dtype,
)
from hotloop.kernels.launch_math import cdiv, next_power_of_2
from hotloop.kernels.launch_replay import recordable
from hotloop.kernels.paged_decode_attention import check_cache

_LOG2E = 1.4426950408889634


# int8 codes read as bytes: 1.313 against 1.489 ms per layer as 16-bit pairs (4096 tokens, H200)
INT8_PAIRS = False

# The key tiles every query of a query tile sees (below its first query; with a sliding window,
# also inside its last query's window) run without the causal, window and length masks (a loop of
# their own), the diagonal and window-edge tiles with them: faster with every tile configuration
# timed without a window (8 of 8, bf16 and int8, 1,024 and 4,096 tokens; ``prefill_config``); the
# windowed loops are tested, not timed. ``HOTLOOP_PREFILL_DIAG_SPLIT=0`` turns it off.
DIAG_SPLIT = os.environ.get("HOTLOOP_PREFILL_DIAG_SPLIT", "1") != "0"


# One longest-query length per launch configuration ``prefill_config`` can choose (its thresholds are
# 16, 256 and 4,096 tokens): the engine's warm-up runs a prompt of each (capped at what a request
# may hold), so that no configuration compiles while serving (tests/kernels: every length maps to
# the configuration of one of these).
CONFIG_LENGTHS = (8, 64, 1024, 4096)


def prefill_config(
    block_d: int, max_query_len: int, quant: int = 0, diag_split: bool | None = None
) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of the prefill kernel.

    Head dims 65-128 (``block_d == 128``) with prompts of 1,024 tokens or more use the fastest of
    ``benchmarks/kv_attention_sweep.py``'s grid on an H200 with ``DIAG_SPLIT`` (2026-11-30, twelfth
    session, ``call6``; ms per layer, Llama-3-8B shape):

    | prompt, cache | (64, 64, 4, 2) | before |
    |---|---|---|
    | 1,024, bf16 | 0.052 | 0.097 (64, 64, 8, 2) |
    | 4,096, bf16 | 0.417 | 0.553 (128, 32, 8, 2) |
    | 1,024, int8 | 0.096 | 0.163 (64, 64, 8, 2) |
    | 4,096, int8 | 0.824 | 1.034 (64, 64, 4, 2) |

    (The int8 rows read the prompt back from the cache. With its own keys from ``k_new`` / ``v_new``
    and no cached prefix, the same tiles took 0.040 / 0.413 ms for int8 and 0.056 / 0.412 for int4,
    2026-12-01.) int4 keeps its earlier tiles (not timed with the split). Prompts of 256 to 1,023
    tokens take the same tiles since the thirty-ninth session (before, (64, 64, 8, 2)); on an H100,
    bf16, ms per layer: 0.0084 against 0.0092 at 256 tokens, 0.0153 against 0.0265 at 512, 0.0415
    against 0.0715 at 1,008 (benchmarks/results/gpu_2026-12-06j). Shorter prompts keep theirs (at 128
    tokens the two were within 4%).
    Without the split (``diag_split`` False; default ``DIAG_SPLIT``) a 16-bit cache keeps (128, 32,
    8, 2) from 4,096 tokens: 0.552 against 0.573 ms there."""
    if diag_split is None:
        diag_split = DIAG_SPLIT
    if max_query_len <= 16:
        return 16, 64 if block_d <= 128 else 32, 4 if block_d <= 64 else 8, 2
    if block_d == 128 and max_query_len >= 4096 and quant == 0 and not diag_split:
        return 128, 32, 8, 2
    if block_d == 128 and max_query_len >= 256 and quant in (0, 8):
        return 64, 64, 4, 2
    if block_d == 128 and max_query_len >= 4096:
        return 64, 64, 4, 2  # int4
    block = 64 if block_d <= 128 else 32
    return block, block, 4 if block_d <= 64 else 8, 2


@triton.jit
def _attend_tile(
    acc,
    m_i,
    l_i,
    n0,
    hi,
    qd,
    q,
    q_sum,
    q_pos,
    table,
    k_cache_ptr,
    v_cache_ptr,
    q_ptr,
    scale_log2,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    kvh,
    offs_d,
    mask_d,
    BS: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr,
    NPACK: tl.constexpr,
    KV: tl.constexpr,
    ASM: tl.constexpr,
    MASKED: tl.constexpr,  # False: every key of the tile exists and every query of the tile sees it
):
    """One key tile of the online softmax: ``(acc, m_i, l_i)`` updated with keys ``[n0, n0 + BLOCK_N)``."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    if MASKED:
        mask_n = offs_n < hi
    else:
        mask_n = tl.full([BLOCK_N], 1, tl.int1)
    page = tl.load(table + offs_n // BS, mask=mask_n, other=0).to(tl.int64)
    tok = offs_n % BS
    kmask = mask_n[:, None] & mask_d[None, :]
    if QUANT == 0:
        k = tl.load(
            k_cache_ptr
            + page[:, None] * stride_kb
            + tok[:, None] * stride_kt
            + kvh * stride_kh
            + offs_d[None, :],
            mask=kmask,
            other=0.0,
        )
        s = tl.dot(q, tl.trans(k)) * scale_log2  # [BLOCK_M, BLOCK_N]
    else:
        # codes at constexpr offsets in the block: Triton sees 16-byte alignment and vectorizes
        k_rows, k_par = quant_rows(k_cache_ptr + page * stride_kb, tok, kvh, q_ptr, BS, KV, NPACK)
        k_scale, k_zero = load_kv_params(k_par, mask_n)
        s = quant_scores(qd, q_sum, k_rows, mask_n, q_ptr, BLOCK_D, NPACK, QUANT, ASM)  # q . codes
        s = (s * k_scale[None, :] + q_sum[:, None] * k_zero[None, :]) * scale_log2
    if MASKED:
        visible = (offs_n[None, :] <= q_pos[:, None]) & mask_n[None, :]
        if WINDOW > 0:
            visible = visible & (offs_n[None, :] > q_pos[:, None] - WINDOW)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = m_new
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    if QUANT == 0:
        v = tl.load(
            v_cache_ptr
            + page[:, None] * stride_vb
            + tok[:, None] * stride_vt
            + kvh * stride_vh
            + offs_d[None, :],
            mask=kmask,
            other=0.0,
        )
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    else:
        v_rows, v_par = quant_rows(v_cache_ptr + page * stride_vb, tok, kvh, q_ptr, BS, KV, NPACK)
        v_scale, v_zero = load_kv_params(v_par, mask_n)
        pv = quant_weighted_values(
            p, v_scale, v_zero, v_rows, mask_n, q_ptr, qd.dtype, BLOCK_D, NPACK, QUANT, ASM
        )
        acc = acc * alpha[:, None] + pv
    return acc, m_new, l_i


@triton.jit
def _attend_fresh_tile(
    acc,
    m_i,
    l_i,
    j0,
    hi_l,
    q,
    offs_m,
    kn_ptr,
    vn_ptr,
    q_start,
    scale_log2,
    stride_knt,
    stride_knh,
    stride_vnt,
    stride_vnh,
    kvh,
    offs_d,
    mask_d,
    WINDOW: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,  # False: every key of the tile exists and every query of the tile sees it
):
    """One tile of this step's own keys, read from ``k_new`` / ``v_new`` (rows ``q_start + j``):
    local key ``j`` sits at the same position as local query ``j``, so the causal mask is
    ``j <= offs_m`` and the window ``j > offs_m - WINDOW``."""
    offs_j = j0 + tl.arange(0, BLOCK_N)
    if MASKED:
        mask_n = offs_j < hi_l
    else:
        mask_n = tl.full([BLOCK_N], 1, tl.int1)
    kmask = mask_n[:, None] & mask_d[None, :]
    rows = (q_start + offs_j).to(tl.int64)
    k = tl.load(
        kn_ptr + rows[:, None] * stride_knt + kvh * stride_knh + offs_d[None, :], mask=kmask, other=0.0
    )
    s = tl.dot(q, tl.trans(k.to(q.dtype))) * scale_log2  # [BLOCK_M, BLOCK_N]
    if MASKED:
        visible = (offs_j[None, :] <= offs_m[:, None]) & mask_n[None, :]
        if WINDOW > 0:
            visible = visible & (offs_j[None, :] > offs_m[:, None] - WINDOW)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = m_new
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = tl.load(
        vn_ptr + rows[:, None] * stride_vnt + kvh * stride_vnh + offs_d[None, :], mask=kmask, other=0.0
    ).to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


# The per-sequence tables are read a scalar or a few entries at a time, so their alignment buys
# nothing; specialized on it, a mixed step whose prefill rows start at a row not a multiple of four
# (``seq_lens[num_decodes:]``) compiled a variant of its own while serving (a second or more each).
UNALIGNED_ARGS = ("block_tables_ptr", "seq_lens_ptr", "query_start_ptr")


@recordable
@triton.jit(do_not_specialize_on_alignment=UNALIGNED_ARGS)
def _prefill_kernel(
    q_ptr,  # [T, H, D]
    k_cache_ptr,  # [NB, BS, KV, D], or uint8 [NB, BS, KV, row_bytes] when QUANT (per block: kv_quant.py)
    v_cache_ptr,
    block_tables_ptr,  # [B, W] int32
    seq_lens_ptr,  # [B] int32
    query_start_ptr,  # [B + 1] int32
    out_ptr,  # [T, H, D]
    kn_ptr,  # [T, KV, D] this step's rotated keys (FRESH only)
    vn_ptr,  # [T, KV, D] this step's values (FRESH only)
    scale_log2,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_bt,
    stride_ot,
    stride_oh,
    stride_knt,
    stride_knh,
    stride_vnt,
    stride_vnh,
    G: tl.constexpr,
    D: tl.constexpr,
    BS: tl.constexpr,
    WINDOW: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr,  # 0: float cache; 8 / 4: int8 / int4 codes + scale and zero per row
    NPACK: tl.constexpr,  # bytes of a quantized row's codes (its block's (scale, zero) pairs follow all codes)
    KV: tl.constexpr,  # KV heads (a quantized block is [BS, KV] codes, then [BS, KV] scale/zero pairs)
    ASM: tl.constexpr,  # how codes are read: bit 1 PTX byte permutes (GPU), bit 2 int8 as pairs
    DIAG_SPLIT: tl.constexpr = False,  # unmasked loop over the key tiles below the diagonal
    FRESH: tl.constexpr = False,  # rows of more than one token read their own keys from kn / vn
    PREFIX: tl.constexpr = True,  # FRESH: some row may read the cache (False: only kn / vn are read)
):
    m_blk = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    kvh = h // G
    q_start = tl.load(query_start_ptr + b)
    q_len = tl.load(query_start_ptr + b + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + b)
    ctx = seq_len - q_len  # cached prefix

    offs_m = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < q_len
    mask_d = offs_d < D
    q = tl.load(
        q_ptr + (q_start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :],
        mask=mask_m[:, None] & mask_d[None, :],
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]
    # QUANT: the dots run in fp16 (float32 models: float32) on ``CODE_OFFSET + code`` values; q goes to
    # fp16 once, and its row sum multiplies the K zero points and cancels the offset.
    qd = to_dot_dtype(q)
    q_sum = tl.sum(qd.to(tl.float32), 1)
    q_pos = ctx + offs_m

    # Keys this tile may see: [lo, hi). Empty when the tile lies past the sequence's queries.
    hi = tl.minimum(seq_len, ctx + (m_blk + 1) * BLOCK_M)
    hi = tl.where(m_blk * BLOCK_M < q_len, hi, 0)
    lo = 0
    if WINDOW > 0:
        lo = tl.maximum(ctx + m_blk * BLOCK_M - WINDOW + 1, 0)
        lo = (lo // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table = block_tables_ptr + b * stride_bt
    # Key tiles every query of this tile sees ([full_lo, full_hi): below its first query and, with a
    # window, inside its last query's window) run without the causal, window and length masks; the
    # tiles before them (the window's edge) and from full_hi on (the diagonal) are masked. The cache is
    # read up to c_hi: the whole context, or with FRESH a multi-token row's cached prefix only (every
    # query sees all of it; a single-token row still reads its whole context), its own keys following
    # from kn / vn. (FRESH with PREFIX False: no row reads the cache, and the cache loops, with the
    # quantized path's registers, are compiled out.)
    c_hi = hi
    full_lo = lo
    full_hi = lo
    if FRESH:
        ctx_f = tl.where(q_len > 1, ctx, seq_len) if PREFIX else ctx
        c_hi = tl.minimum(ctx_f, hi)
        if WINDOW == 0 and DIAG_SPLIT:
            full_hi = tl.maximum(c_hi // BLOCK_N * BLOCK_N, lo)
    elif DIAG_SPLIT:
        p0 = ctx + m_blk * BLOCK_M  # the tile's first query position (padded rows come after)
        full_hi = tl.minimum((p0 + 1) // BLOCK_N * BLOCK_N, hi)
        if WINDOW > 0:
            first = tl.maximum(p0 + BLOCK_M - WINDOW, 0)  # the last row's first visible key
            full_lo = tl.minimum(tl.maximum((first + BLOCK_N - 1) // BLOCK_N * BLOCK_N, lo), hi)
            full_hi = tl.maximum(full_hi, full_lo)
    if PREFIX or not FRESH:
        if WINDOW > 0:
            for n0 in range(lo, full_lo, BLOCK_N):
                acc, m_i, l_i = _attend_tile(
                    acc, m_i, l_i, n0, c_hi, qd, q, q_sum, q_pos, table, k_cache_ptr, v_cache_ptr, q_ptr, scale_log2,
                    stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, kvh, offs_d, mask_d,
                    BS, WINDOW, BLOCK_N, BLOCK_D, QUANT, NPACK, KV, ASM, True,
                )  # fmt: skip
        for n0 in range(full_lo, full_hi, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, n0, c_hi, qd, q, q_sum, q_pos, table, k_cache_ptr, v_cache_ptr, q_ptr, scale_log2,
                stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, kvh, offs_d, mask_d,
                BS, WINDOW, BLOCK_N, BLOCK_D, QUANT, NPACK, KV, ASM, False,
            )  # fmt: skip
        for n0 in range(full_hi, c_hi, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, n0, c_hi, qd, q, q_sum, q_pos, table, k_cache_ptr, v_cache_ptr, q_ptr, scale_log2,
                stride_kb, stride_kt, stride_kh, stride_vb, stride_vt, stride_vh, kvh, offs_d, mask_d,
                BS, WINDOW, BLOCK_N, BLOCK_D, QUANT, NPACK, KV, ASM, True,
            )  # fmt: skip
    if FRESH:
        # this step's keys, local index j at position ctx_f + j (none for a single-token row)
        hi_l = hi - ctx_f
        f_lo = tl.maximum(lo - ctx_f, 0)
        f_full = f_lo
        if WINDOW == 0 and DIAG_SPLIT:
            f_full = tl.maximum(tl.minimum((m_blk * BLOCK_M + 1) // BLOCK_N * BLOCK_N, hi_l), f_lo)
        for j0 in range(f_lo, f_full, BLOCK_N):
            acc, m_i, l_i = _attend_fresh_tile(
                acc, m_i, l_i, j0, hi_l, q, offs_m, kn_ptr, vn_ptr, q_start, scale_log2, stride_knt,
                stride_knh, stride_vnt, stride_vnh, kvh, offs_d, mask_d, WINDOW, BLOCK_N, False,
            )  # fmt: skip
        for j0 in range(f_full, hi_l, BLOCK_N):
            acc, m_i, l_i = _attend_fresh_tile(
                acc, m_i, l_i, j0, hi_l, q, offs_m, kn_ptr, vn_ptr, q_start, scale_log2, stride_knt,
                stride_knh, stride_vnt, stride_vnh, kvh, offs_d, mask_d, WINDOW, BLOCK_N, True,
            )  # fmt: skip

    o = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + (q_start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=mask_m[:, None] & mask_d[None, :],
    )


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start: torch.Tensor,
    max_query_len: int,
    scale: float,
    sliding_window: int | None = None,
    out: torch.Tensor | None = None,
    config: tuple[int, ...] | None = None,
    k_new: torch.Tensor | None = None,
    v_new: torch.Tensor | None = None,
    cached_prefix: bool = True,
) -> torch.Tensor:
    """Causal attention of every sequence's new queries over its paged context.

    q ``[T, H, D]`` (sequences back to back); block_tables ``[B, W]``, seq_lens ``[B]`` and
    query_start ``[B + 1]`` (cumulative query lengths, ``query_start[B] == T``) are int32 on q's
    device; ``max_query_len`` is the longest ``query_len`` (a host int: it sizes the grid).
    Returns ``[T, H, D]`` in q's dtype. The caches are in q's dtype, or ``uint8`` (int8 / int4,
    ``kv_quant.py``). ``config`` overrides the launch configuration ``(BLOCK_M, BLOCK_N, num_warps,
    num_stages[, DIAG_SPLIT])`` (``benchmarks/kv_attention_sweep.py``; DIAG_SPLIT 0 or 1 overrides
    the module's ``DIAG_SPLIT``).

    ``k_new`` / ``v_new`` ``[T, KV, D]`` in q's dtype (this step's rotated keys and values, laid out
    as q; both or neither): a sequence with more than one new token reads its own tokens' keys from
    them and only its cached prefix from the cache (the module docstring says why).
    ``cached_prefix`` False (with ``k_new``) promises that every sequence has more than one new
    token and no cached prefix, so nothing is read from the cache: the kernel is then compiled without
    its cache loop (the quantized path's registers cost the float loop occupancy). Wrong if a row
    does have a prefix (its prefix would be skipped): the caller knows from the host lengths.
    """
    check(q.dim() == 3 and k_cache.dim() == 4, "q must be [T, H, D] and the caches [NB, BS, KV, D]")
    T, H, D = q.shape
    _nb, bs, kv, _row = k_cache.shape
    check(v_cache.shape == k_cache.shape, f"v_cache {tuple(v_cache.shape)} != k_cache {tuple(k_cache.shape)}")
    check_dtype("q", q, FLOAT_DTYPES)
    quant, npack = check_cache(q, k_cache, v_cache)
    check(H % kv == 0, f"num_heads={H} is not a multiple of num_kv_heads={kv}")
    B = seq_lens.shape[0]
    check(
        query_start.shape == (B + 1,),
        f"query_start must be [B + 1] = [{B + 1}], got {tuple(query_start.shape)}",
    )
    check(block_tables.dim() == 2 and block_tables.shape[0] >= B, f"block_tables {tuple(block_tables.shape)}")
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens), ("query_start", query_start)):
        check(t.dtype == torch.int32, f"{name} must be int32, got {t.dtype}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables)):
        check_last_contiguous(name, t)
    if out is None:
        out = torch.empty_like(q)
    check(out.shape == q.shape and out.stride(-1) == 1, f"out {tuple(out.shape)} must match q")
    fresh = k_new is not None
    check(fresh == (v_new is not None), "k_new and v_new are given together")
    check(fresh or cached_prefix, "cached_prefix=False needs k_new / v_new (nothing else to read)")
    if k_new is not None and v_new is not None:
        for name, t in (("k_new", k_new), ("v_new", v_new)):
            check(t.shape == (T, kv, D), f"{name} must be [T, KV, D] = {(T, kv, D)}, got {tuple(t.shape)}")
            check(t.dtype == q.dtype, f"{name} is {t.dtype}, q {q.dtype}")
            check_last_contiguous(name, t)
        kn, vn = k_new, v_new
    else:
        kn = vn = q  # unused (FRESH off)
    if T == 0 or B == 0:
        return out
    block_d = max(16, next_power_of_2(D))
    diag_split = DIAG_SPLIT
    if config is not None:
        if len(config) == 5:
            check(
                config[4] in (0, 1), f"paged_prefill_attention: config DIAG_SPLIT={config[4]} must be 0 or 1"
            )
            diag_split, config = bool(config[4]), config[:4]
        check_launch_config("paged_prefill_attention", config, ("BLOCK_M", "BLOCK_N"))
    block_m, block_n, num_warps, num_stages = config or prefill_config(
        block_d, max_query_len, quant, diag_split
    )
    grid = (cdiv(max_query_len, block_m), B, H)
    q_st, k_cache_st, v_cache_st, block_tables_st, out_st, kn_st, vn_st = (
        q.stride(),
        k_cache.stride(),
        v_cache.stride(),
        block_tables.stride(),
        out.stride(),
        kn.stride(),
        vn.stride(),
    )
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        query_start,
        out,
        kn,
        vn,
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
        out_st[0],
        out_st[1],
        kn_st[0],
        kn_st[1],
        vn_st[0],
        vn_st[1],
        G=H // kv,
        D=D,
        BS=bs,
        WINDOW=sliding_window or 0,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        QUANT=quant,
        NPACK=npack,
        KV=kv,
        # no even/odd split here: on an H200 it made the 4k int8 prefill 1.195 ms against 1.035 (BENCHMARKS.md)
        ASM=(code_mode(q, INT8_PAIRS) & ~4) if quant else 0,
        DIAG_SPLIT=diag_split,
        FRESH=fresh,
        PREFIX=cached_prefix or not fresh,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out
