"""Dense GEMM for a batched decode step, Triton: ``x [M, K] @ W[N, K]^T`` in row and column tiles,
with the epilogues the step needs instead of separate launches.

At batch 256 the Llama-3-8B step spends about 6 ms in cuBLAS (BENCHMARKS.md), and two of its
choices sit far from the matmul rate: o_proj runs 96 CTAs (fewer than the H200's 132
multiprocessors) at about half of the FLOP floor, and down_proj adds a split-K reduce launch. This
kernel offers three outputs:

- ``"store"``: ``y`` rounded to x's dtype (one launch over the whole of K);
- ``"partials"``: K split ``split_k`` ways, each split's float32 partial stored to ``ws [S, M, N]``
  with no reduction here: the consumer adds them (``rms_norm_partials``, which sums the partials,
  rounds as one GEMM's output would be rounded, adds the residual and normalises), so the split
  costs no launch of its own;
- ``"silu"``: the gate/up projection with SiLU-and-mul in the epilogue. ``W [2I, K]`` holds the gate
  rows then the up rows; a program computes the same ``BLOCK_N`` columns of both, rounds each to
  x's dtype (the projection's output), and stores ``silu(gate) * up`` ``[M, I]`` with
  ``silu_and_mul``'s roundings. The ``[M, 2I]`` intermediate is never written.

Float32 accumulation on tensor cores (``tl.dot``); K is walked in ``BLOCK_K`` steps pipelined over
``num_stages``. Programs are ordered row tile fastest, so the row tiles that read one weight tile
run side by side and the weight is read from DRAM once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hotloop.kernels.checks import check, check_dtype, check_last_contiguous, check_same_device
from hotloop.kernels.launch_math import cdiv

MODES = ("store", "partials", "silu")


@triton.jit
def _tiled_gemm_kernel(
    x_ptr,  # [M, K]
    w_ptr,  # [N, K] ("silu": [2N, K], gate rows then up rows)
    out_ptr,  # "store"/"silu": [M, N] x.dtype; "partials": [S, M, N] float32
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    k_per_split,
    MODE: tl.constexpr,  # 0 store, 1 partials, 2 silu
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    PRECISION: tl.constexpr,  # the dot's input precision ("ieee" for float32 operands)
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = pid % num_m  # row tiles fastest: the programs sharing a weight tile run together
    pid_n = pid // num_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    k_begin = pid_k * k_per_split
    x_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm + (k_begin + offs_k)[None, :]
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + (k_begin + offs_k)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if MODE == 2:
        u_ptrs = w_ptrs + N.to(tl.int64) * stride_wn
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in tl.range(0, k_per_split, BLOCK_K, num_stages=NUM_STAGES):
        a = tl.load(x_ptrs, mask=mask_m[:, None], other=0.0)
        b = tl.load(w_ptrs, mask=mask_n[:, None], other=0.0)
        acc = tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)
        if MODE == 2:
            bu = tl.load(u_ptrs, mask=mask_n[:, None], other=0.0)
            acc_u = tl.dot(a, tl.trans(bu), acc_u, input_precision=PRECISION)
            u_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    mask = mask_m[:, None] & mask_n[None, :]
    offs = offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    if MODE == 0:
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    elif MODE == 1:
        tl.store(out_ptr + pid_k.to(tl.int64) * M * stride_om + offs, acc, mask=mask)
    else:
        # the projection's outputs as stored by a plain GEMM, then silu_and_mul's roundings
        gate = acc.to(out_ptr.dtype.element_ty).to(tl.float32)
        up = acc_u.to(out_ptr.dtype.element_ty).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate))).to(out_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + offs, (act * up).to(out_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True, slots=True)
class TiledConfig:
    """One launch: row and column tiles, K per loop step, the K split (``"partials"`` only), warps
    and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1):
                raise ValueError(f"{name}={v} must be a power of two >= 16")
        if self.split_k < 1 or self.num_warps < 1 or self.num_stages < 1:
            raise ValueError(f"split_k, num_warps and num_stages must be >= 1: {self}")

    def programs(self, m: int, n: int) -> int:
        """Programs of one launch over ``m`` rows and ``n`` output columns."""
        return cdiv(m, self.block_m) * cdiv(n, self.block_n) * self.split_k


def tiled_gemm(
    x: torch.Tensor, weight: torch.Tensor, config: TiledConfig, mode: str = "store"
) -> torch.Tensor:
    """``x [M, K]`` (K contiguous) times ``weight [N, K]^T`` in one ``config`` launch.

    ``mode``: ``"store"`` -> ``[M, N]`` in x's dtype; ``"partials"`` -> float32 ``[split_k, M, N]``
    whose sum over the first dim is the product; ``"silu"`` -> ``[M, N / 2]``, ``silu(gate) * up``
    of the gate/up product (``weight`` = [gate; up])."""
    check(mode in MODES, f"mode must be one of {MODES}; got {mode!r}")
    check_dtype("x", x, (torch.float16, torch.bfloat16, torch.float32))
    check(
        x.dim() == 2 and weight.dim() == 2,
        f"x [M, K] and weight [N, K]; got {tuple(x.shape)}, {tuple(weight.shape)}",
    )
    check(weight.dtype == x.dtype, f"weight dtype {weight.dtype} must equal x dtype {x.dtype}")
    check_last_contiguous("x", x)
    check_last_contiguous("weight", weight)
    check_same_device(x=x, weight=weight)
    m, k = x.shape
    n_rows, kw = weight.shape
    check(kw == k, f"x has K={k} input features; the weight has {kw}")
    split = config.split_k if mode == "partials" else 1
    check(split == config.split_k or config.split_k == 1, f"split_k={config.split_k} needs mode 'partials'")
    check(
        k % (split * config.block_k) == 0,
        f"K={k} is not a whole number of block_k={config.block_k} steps per split of {split}",
    )
    if mode == "silu":
        check(n_rows % 2 == 0, f"the gate/up weight needs an even row count; got {n_rows}")
        n = n_rows // 2
    else:
        n = n_rows
    if mode == "partials":
        out = torch.empty(split, m, n, dtype=torch.float32, device=x.device)
    else:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    grid = (cdiv(m, config.block_m) * cdiv(n, config.block_n), split)
    _tiled_gemm_kernel[grid](
        x,
        weight,
        out,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        n,
        k // split,
        MODE=MODES.index(mode),
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        NUM_STAGES=config.num_stages,
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    return out
