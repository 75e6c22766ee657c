"""RMSNorm, optionally fused with the residual add, Triton: one program per row.

Matches ``reference.rms_norm`` rounding: the sum ``x + residual`` is rounded to the input dtype
(it is the residual stream), normalised in float32, rounded, then scaled by the weight.

``rms_norm_partials`` takes ``x`` as the float32 split-K partials of the projection before it
(``tiled_gemm``'s ``"partials"``): it adds them, rounds once as the projection's own output would be
rounded, and goes on as ``rms_norm`` with a residual, so the split costs no reduce launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels.checks import FLOAT_DTYPES, check, check_dtype, check_last_contiguous
from hotloop.kernels.launch_math import next_power_of_2
from hotloop.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_kwargs, pdl


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [N, C]
    res_ptr,  # [N, C] (read when HAS_RES)
    w_ptr,  # [C]
    out_ptr,  # [N, C]
    res_out_ptr,  # [N, C] (written when HAS_RES)
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    eps,
    C: tl.constexpr,
    HAS_RES: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,  # launched as a programmatic dependent (kernels/pdl.py)
    SPLITS: tl.constexpr = 0,  # > 0: x is float32 partials [SPLITS, N, C] (stride_split apart)
    stride_split=0,
    OUT_DTYPE: tl.constexpr = None,  # the activations' dtype (with SPLITS: x's is float32)
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < C
    if SPLITS > 0:
        acc = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
        for s in tl.static_range(1, SPLITS):
            acc += tl.load(x_ptr + s * stride_split + row * stride_x + offs, mask=mask, other=0.0)
        x = acc.to(OUT_DTYPE)  # the projection's output, rounded once
    else:
        x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / C + eps)
    normed = (xf * rstd).to(out_ptr.dtype.element_ty).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, (normed * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x [..., C]`` -> ``(norm(x (+ residual)) * weight, x + residual or None)``, new tensors."""
    C = x.shape[-1]
    check(weight.shape == (C,), f"weight must be [{C}], got {tuple(weight.shape)}")
    check_dtype("x", x, FLOAT_DTYPES)
    x2 = x.reshape(-1, C)
    check_last_contiguous("x", x2)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    res_out = None
    r2 = x2
    if residual is not None:
        check(residual.shape == x.shape, f"residual {tuple(residual.shape)} != x {tuple(x.shape)}")
        check(residual.dtype == x.dtype, f"residual dtype {residual.dtype} != x dtype {x.dtype}")
        r2 = residual.reshape(-1, C)
        check_last_contiguous("residual", r2)
        res_out = torch.empty_like(out)
    n = x2.shape[0]
    if n:
        block = next_power_of_2(C)
        _rms_norm_kernel[(n,)](
            x2,
            r2,
            weight,
            out,
            res_out if res_out is not None else out,
            x2.stride(0),
            r2.stride(0),
            out.stride(0),
            out.stride(0),
            eps,
            C=C,
            HAS_RES=residual is not None,
            BLOCK=block,
            PDL=pdl(x.device),
            num_warps=min(16, max(1, block // 256)),
            **launch_kwargs(x.device),
        )
    return out.view(x.shape), None if res_out is None else res_out.view(x.shape)


_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def rms_norm_partials(
    partials: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``partials [S, N, C]`` float32 (a projection's split-K partials), ``residual [N, C]`` ->
    ``(norm(h) * weight, h)`` with ``h = round(sum(partials)) + residual`` rounded to the residual's
    dtype: ``rms_norm(sum, weight, eps, residual)`` for the projection's output ``sum``."""
    check(partials.dim() == 3, f"partials must be [S, N, C]; got {tuple(partials.shape)}")
    check(partials.dtype == torch.float32, f"partials must be float32; got {partials.dtype}")
    s, n, c = partials.shape
    check(residual.shape == (n, c), f"residual {tuple(residual.shape)} != partials' rows {(n, c)}")
    check_dtype("residual", residual, FLOAT_DTYPES)
    check(weight.shape == (c,), f"weight must be [{c}], got {tuple(weight.shape)}")
    check_last_contiguous("partials", partials)
    check_last_contiguous("residual", residual)
    check(partials.stride(1) == c and partials.stride(0) == n * c, "partials must be contiguous")
    out = torch.empty(n, c, dtype=residual.dtype, device=residual.device)
    res_out = torch.empty_like(out)
    if n:
        block = next_power_of_2(c)
        _rms_norm_kernel[(n,)](
            partials,
            residual,
            weight,
            out,
            res_out,
            partials.stride(1),
            residual.stride(0),
            out.stride(0),
            res_out.stride(0),
            eps,
            C=c,
            HAS_RES=True,
            BLOCK=block,
            PDL=pdl(residual.device),
            SPLITS=s,
            stride_split=partials.stride(0),
            OUT_DTYPE=_TL_DTYPES[residual.dtype],
            num_warps=min(16, max(1, block // 256)),
            **launch_kwargs(residual.device),
        )
    return out, res_out
