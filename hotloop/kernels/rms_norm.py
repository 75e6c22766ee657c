"""RMSNorm, optionally fused with the residual add, Triton: one program per row.

Matches ``reference.rms_norm`` rounding: the sum ``x + residual`` is rounded to the input dtype
(it is the residual stream), normalised in float32, rounded, then scaled by the weight.
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
):
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < C
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(res_out_ptr + row * stride_ro + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, 0) / C + eps)
    normed = (xf * rstd).to(x_ptr.dtype.element_ty).to(tl.float32)
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
