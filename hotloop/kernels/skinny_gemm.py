"""Dense GEMM for a few rows on tensor cores, Triton: ``y = x @ W^T + b`` for ``x [M, K]``, ``M <= 64``.

Decode at batch 2-64 reads every weight once per step, so its projections are bound by the weight
bytes, like batch 1, but have too many rows for the CUDA-core GEMV (``dense_gemv``). cuBLAS' own
choice at these M left the Llama-3-8B q/k/v and o projections at 52-59% of their bandwidth floor on
an H200 (BENCHMARKS.md). This kernel is built for the bytes:

- swap A and B: ``acc^T [BLOCK_N, BLOCK_M] += W [BLOCK_N, BLOCK_K] @ x^T``, so the weight tile is the
  MMA's M side and the rows of x pad only to 16 or 32;
- the weight tile is read along K (``nn.Linear``'s ``[N, K]`` layout, no transposed copy), marked
  evict-first, and the K loop is a ``tl.range`` with ``NUM_STAGES`` so Triton keeps several tiles
  in flight;
- K is split until the launch has about ``waves`` programs per multiprocessor; the last split to
  reach a column tile's counter adds the float32 partials in split order (deterministic), adds the
  bias, rounds once and stores (``kernels/counters.py``).

``plan`` picks the launch per (GPU, dtype, M bucket, N, K): on the GPU it times every candidate
template and cuBLAS (``F.linear``) once, with a cold L2, and keeps the fastest (``None`` for
cuBLAS), memoised and kept on disk (``kernels/tuning_cache.py``).

Status: no engine path calls it. On an H200 (2026-11-30, ``benchmarks/skinny_gemm.py``) its best
launch was within 0.8-1.05x of cuBLAS per Llama-3-8B projection at M = 2-64 (cuBLAS' q/k/v and o at
51-61% of their floor, this kernel no closer), and routed through the dense layers it made the
batch-16 decode step slower (5.78 against 5.59 ms), so the layers keep ``F.linear``. The routed
version also failed one GPU parity case (chunked prefill through CUDA graphs, a wrong first token)
that was not diagnosed before it was taken out: reconnect it only with that case passing.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from functools import partial

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from hotloop.kernels import counters, tuning_cache
from hotloop.kernels.checks import check, check_dtype, check_last_contiguous, check_same_device
from hotloop.kernels.launch_math import cdiv

MAX_M = 64  # rows this kernel takes (one row tile of at most 64)
COUNTER_FAMILY = "skinny_gemm"
TUNING_FAMILY = "skinny_gemm"


@triton.jit
def _skinny_gemm_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    split_k,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    # the launcher makes every split a whole number of BLOCK_K steps
    k_per_split = tl.multiple_of(K // split_k, BLOCK_K)
    k_begin = tl.multiple_of(pid_k * k_per_split, BLOCK_K)
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + (k_begin + offs_k)[None, :]
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + (k_begin + offs_k)[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for _ in tl.range(0, k_per_split, BLOCK_K, num_stages=NUM_STAGES):
        w = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0, eviction_policy="evict_first")
        a = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
        acc = tl.dot(w, tl.trans(a), acc, input_precision=PRECISION)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    acc_t = tl.trans(acc)  # [BLOCK_M, BLOCK_N]

    mask = mask_m[:, None] & mask_n[None, :]
    offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
    if not SPLIT:
        if HAS_BIAS:
            acc_t += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offs, acc_t.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ws_ptr + pid_k * M * N + offs, acc_t, mask=mask)
        tl.debug_barrier()  # every thread's partial is stored before the release below
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == split_k - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(split_k):
                total += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
            tl.store(out_ptr + offs, total.to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed", scope="gpu")


@dataclass(frozen=True, slots=True)
class SkinnyConfig:
    """One launch: the row tile (16, 32 or 64), the column tile, K per loop step, the K split,
    warps and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 4

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name}={v} must be a power of two >= 16")
        if self.block_m > MAX_M:
            raise ValueError(f"block_m={self.block_m} must be at most {MAX_M}")
        if self.split_k < 1 or self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"split_k, num_warps and num_stages must be >= 1: {self}")


def row_tile(m: int) -> int:
    """The row tile for ``m`` rows: 16, 32 or 64 (the MMA's N side)."""
    check(1 <= m <= MAX_M, f"the skinny GEMM takes 1 to {MAX_M} rows; got {m}")
    return max(16, 1 << (m - 1).bit_length())


def _split_for(tiles: int, k: int, block_k: int, target: int, max_split: int = 16) -> int:
    """The smallest split of K's ``block_k`` steps into equal parts of at least two steps that brings
    ``tiles`` programs up to ``target`` (the largest such split below ``max_split`` if none does)."""
    steps = k // block_k
    split = 1
    for s in range(2, max_split + 1):
        if tiles * split >= target:
            break
        if steps % s == 0 and steps // s >= 2:
            split = s
    return split


# (column tile, K step, warps, stages, programs per multiprocessor the K split aims at)
Template = tuple[int, int, int, int, float]
TEMPLATES: tuple[Template, ...] = (
    (64, 128, 4, 4, 2.0),
    (128, 128, 4, 4, 2.0),
    (128, 64, 4, 6, 2.0),
    (64, 256, 4, 3, 2.0),
    (128, 128, 8, 4, 1.0),
    (256, 64, 8, 4, 1.0),
    (32, 256, 4, 4, 4.0),
)


def fit(template: Template, m: int, n: int, k: int, sms: int) -> SkinnyConfig | None:
    """``template`` for an ``[m, k] x [n, k]^T`` product on ``sms`` multiprocessors: the K step halved
    until it divides K (``None`` below 16), K split toward the template's programs per SM."""
    block_n, block_k, warps, stages, waves = template
    while block_k >= 16 and k % block_k:
        block_k //= 2
    if block_k < 16:
        return None
    split = _split_for(cdiv(n, block_n), k, block_k, int(waves * sms))
    return SkinnyConfig(row_tile(m), block_n, block_k, split, warps, stages)


def skinny_gemm(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: SkinnyConfig
) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for ``x [..., K]`` with at most ``MAX_M`` rows, ``weight [N, K]``
    (K contiguous), one ``config`` launch; float32 accumulation, one rounding to x's dtype."""
    check_dtype("x", x, (torch.float16, torch.bfloat16, torch.float32))
    check(weight.dim() == 2, f"weight must be [N, K]; got shape {tuple(weight.shape)}")
    check(weight.dtype == x.dtype, f"weight dtype {weight.dtype} must equal x dtype {x.dtype}")
    n, k = weight.shape
    check(x.shape[-1] == k, f"x has K={x.shape[-1]} input features; the weight has {k}")
    check_last_contiguous("weight", weight)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    check(m <= config.block_m, f"{m} rows do not fit the row tile block_m={config.block_m}")
    check(
        k % (config.split_k * config.block_k) == 0,
        f"K={k} is not a whole number of block_k={config.block_k} steps per split of {config.split_k}",
    )
    if bias is not None:
        check(tuple(bias.shape) == (n,), f"bias must be [{n}]; got {tuple(bias.shape)}")
        check(bias.dtype == x.dtype, f"bias dtype {bias.dtype} must equal x dtype {x.dtype}")
        check_same_device(x=x2, weight=weight, bias=bias)
    else:
        check_same_device(x=x2, weight=weight)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out.view(*lead, n)
    cnt = None
    if config.split_k > 1:
        cnt = counters.counters(x.device, COUNTER_FAMILY, cdiv(n, config.block_n))
        if cnt is None:
            # no counters (more column tiles than slots, or a first use inside a CUDA-graph
            # capture): one launch over the whole of K instead
            config = replace(config, split_k=1)
    ws = torch.empty(config.split_k, m, n, dtype=torch.float32, device=x.device) if cnt is not None else out
    grid = (cdiv(n, config.block_n), config.split_k)
    _skinny_gemm_kernel[grid](
        x2,
        weight,
        bias if bias is not None else out,
        out,
        ws,
        cnt if cnt is not None else out,
        m,
        n,
        k,
        x2.stride(0),
        weight.stride(0),
        config.split_k,
        HAS_BIAS=bias is not None,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        NUM_STAGES=config.num_stages,
        SPLIT=config.split_k > 1,
        PRECISION="ieee" if x2.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps,
    )
    return out.view(*lead, n)


# ---- the choice per shape: timed on the GPU, memoised, kept on disk ----

_tuned: dict[tuple, SkinnyConfig | None] = {}
_disk: dict[str, dict] | None = None
# (device index, dtype, M bucket, N, K) -> [(config or None for cuBLAS, microseconds)]
tuning_log: dict[tuple, list[tuple[SkinnyConfig | None, float]]] = {}


def m_bucket(m: int) -> int:
    """The tuning bucket of ``m`` rows: the next power of two (2, 4, ..., 64)."""
    return 1 << (m - 1).bit_length()


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def _disk_key(key: tuple) -> str:
    index, dtype, mb, n, k = key
    cand = hashlib.sha1(repr(TEMPLATES).encode()).hexdigest()[:8]
    env = tuning_cache.environment_key(torch.cuda.get_device_name(index))
    return f"{env}|{dtype}|m{mb}|n{n}|k{k}|c{cand}"


def _tune(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> SkinnyConfig | None:
    from hotloop.kernels.w4a16_gemm import graph_time_us

    m, k = x2.shape
    n = weight.shape[0]
    sms = torch.cuda.get_device_properties(x2.device).multi_processor_count
    timed: list[tuple[SkinnyConfig | None, float]] = [
        (None, graph_time_us(partial(F.linear, x2, weight, bias), x2.device))
    ]
    for template in TEMPLATES:
        cfg = fit(template, m, n, k, sms)
        if cfg is None or any(c == cfg for c, _ in timed):
            continue
        try:
            us = graph_time_us(partial(skinny_gemm, x2, weight, bias, cfg), x2.device)
        except Exception:  # a launch this GPU or compiler cannot run: skip it
            torch.cuda.synchronize(x2.device)
            continue
        timed.append((cfg, us))
    tuning_log[(_device_index(x2.device), x2.dtype, m_bucket(m), n, k)] = timed
    return min(timed, key=lambda t: t[1])[0]


def plan(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> SkinnyConfig | None:
    """The launch for ``F.linear(x2, weight, bias)`` on the GPU, or ``None`` where cuBLAS is as fast
    (or the shape is not this kernel's). Times the candidates on the first call per shape bucket
    outside a CUDA-graph capture; inside one, an untimed shape keeps cuBLAS."""
    m, k = x2.shape
    if not (2 <= m <= MAX_M) or x2.dtype not in (torch.float16, torch.bfloat16) or k % 16:
        return None
    key = (_device_index(x2.device), x2.dtype, m_bucket(m), weight.shape[0], k)
    if key in _tuned:
        best = _tuned[key]
    else:
        global _disk
        if _disk is None:
            _disk = tuning_cache.load(TUNING_FAMILY)
        stored = _disk.get(_disk_key(key))
        if stored is not None:
            best = SkinnyConfig(**stored["config"]) if stored.get("config") else None
        elif torch.cuda.is_current_stream_capturing():
            return None
        else:
            best = _tune(x2, weight, bias)
            value = {"config": asdict(best) if best is not None else None}
            tuning_cache.store(TUNING_FAMILY, _disk_key(key), value)
            _disk[_disk_key(key)] = value
        _tuned[key] = best
    if best is None:
        return None
    # a config tuned for the bucket fits every m in it; only the row tile follows m
    return replace(best, block_m=row_tile(m))
