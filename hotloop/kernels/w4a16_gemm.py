"""W4A16 GEMM in Triton: ``y = x @ W`` with ``W`` in the AutoAWQ int4 layout, dequantized in registers.

One kernel, two launch shapes:

- ``splitk`` (decode, small M): 16-row tiles, the K loop split across programs so that even M = 1
  fills the GPU; partial sums in float32 are added by the launcher.
- ``tiled`` (prefill, large M): classic M x N output tiles, each walking all of K.

Each K step loads a ``[BLOCK_K, BLOCK_N]`` tile of packed words (the eight columns of a word share
one load), takes column ``n``'s nibble, subtracts the group's zero point, multiplies by its scale
and feeds ``tl.dot``. ``BLOCK_K`` divides the group size, so a K step lies in one group. The torch
reference is ``kernels.reference.w4a16_matmul``; the layout is in ``kernels.w4a16_layout``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import triton
import triton.language as tl

from hotloop.kernels.w4a16_layout import PACK_FACTOR, check_awq_shapes

PATHS = ("auto", "splitk", "tiled")
SPLITK_MAX_M = 32  # at or below this many rows the split-K launch is used


@triton.jit
def _w4a16_gemm_kernel(
    x_ptr,
    qw_ptr,
    qz_ptr,
    s_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_om,
    stride_on,
    GROUP_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    EXPAND_WORDS: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    words_per_row = N // 8
    word_n = offs_n // 8
    # Column j of a word sits in nibble (j % 2) * 4 + j // 2 (AWQ's interleaved order).
    shift = ((offs_n % 2) * 4 + (offs_n % 8) // 2) * 4

    k_per_split = K // SPLIT_K
    k_begin = pid_k * k_per_split
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kk in range(0, k_per_split, BLOCK_K):
        k0 = k_begin + kk
        rows = k0 + offs_k
        a = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + rows[None, :] * stride_xk,
            mask=mask_m[:, None],
            other=0.0,
        )
        if EXPAND_WORDS:  # load each word once, then repeat it for its eight columns in registers
            words = pid_n * (BLOCK_N // 8) + tl.arange(0, BLOCK_N // 8)
            qw8 = tl.load(
                qw_ptr + rows[:, None] * words_per_row + words[None, :],
                mask=words[None, :] < words_per_row,
                other=0,
            )
            qw = tl.reshape(tl.broadcast_to(qw8[:, :, None], (BLOCK_K, BLOCK_N // 8, 8)), (BLOCK_K, BLOCK_N))
        else:  # the eight columns of a word load the same address (served by L1)
            qw = tl.load(
                qw_ptr + rows[:, None] * words_per_row + word_n[None, :], mask=mask_n[None, :], other=0
            )
        group = k0 // GROUP_SIZE
        qz = tl.load(qz_ptr + group * words_per_row + word_n, mask=mask_n, other=0)
        sc = tl.load(s_ptr + group * N + offs_n, mask=mask_n, other=0.0)
        q = (qw >> shift[None, :]) & 0xF  # [BLOCK_K, BLOCK_N]
        z = (qz >> shift) & 0xF  # [BLOCK_N]
        b = (q - z[None, :]).to(sc.dtype) * sc[None, :]
        acc += tl.dot(a, b.to(a.dtype))

    out_offs = offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    out_mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        tl.store(out_ptr + pid_k * M * N + out_offs, acc, mask=out_mask)


@dataclass(frozen=True, slots=True)
class GemmConfig:
    """One launch shape of the kernel."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int
    num_warps: int
    num_stages: int
    expand_words: bool = False


@lru_cache(maxsize=8)
def _num_sms(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def choose_config(
    m: int, n: int, k: int, group_size: int, device: torch.device, path: str = "auto"
) -> GemmConfig:
    """The launch shape for an ``[m, k] @ [k, n]`` product (``path``: auto, splitk or tiled)."""
    if path not in PATHS:
        raise ValueError(f"path={path!r} must be one of {PATHS}")
    if path == "auto":
        path = "splitk" if m <= SPLITK_MAX_M else "tiled"
    if path == "tiled":
        block_m = 64 if m <= 64 else 128
        block_k = _block_k(group_size, 64)
        return GemmConfig(block_m, 128, block_k, 1, 4 if block_m == 64 else 8, 3)
    block_m = 16 if m <= 16 else 32
    block_n = 128 if n >= 2048 else 64
    block_k = _block_k(group_size, 128)
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 4
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    split = 1
    while tiles * split < 2 * sms and k % (split * 2 * block_k) == 0 and k // (split * 2) >= 2 * block_k:
        split *= 2
    return GemmConfig(block_m, block_n, block_k, split, 4, 3)


def _block_k(group_size: int, preferred: int) -> int:
    if group_size % 16:
        raise ValueError(f"group_size={group_size} must be a multiple of 16 for the W4A16 kernel")
    block = min(preferred, group_size)
    while group_size % block:
        block //= 2
    return block


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
    ``scales`` ``[in // group_size, out]`` (AutoAWQ GEMM layout).
    """
    check_awq_shapes(qweight, qzeros, scales, group_size)
    k, n = qweight.shape[0], qweight.shape[1] * PACK_FACTOR
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} input features; the weight has {k}")
    if scales.dtype != x.dtype:
        raise ValueError(f"scales dtype {scales.dtype} must equal x dtype {x.dtype}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if m == 0:
        return x.new_empty(*lead, n)
    cfg = config or choose_config(m, n, k, group_size, x.device, path)
    if k % (cfg.split_k * cfg.block_k) or group_size % cfg.block_k:
        raise ValueError(f"{cfg} does not tile K={k} with group_size={group_size}")
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), cfg.split_k)
    if cfg.split_k == 1:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    else:
        out = torch.empty(cfg.split_k, m, n, dtype=torch.float32, device=x.device)
    _w4a16_gemm_kernel[grid](
        x2,
        qweight,
        qzeros,
        scales,
        out,
        m,
        n,
        k,
        x2.stride(0),
        x2.stride(1),
        n,
        1,
        GROUP_SIZE=group_size,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        SPLIT_K=cfg.split_k,
        EXPAND_WORDS=cfg.expand_words,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if cfg.split_k > 1:
        out = out.sum(dim=0).to(x.dtype)
    return out.view(*lead, n)
