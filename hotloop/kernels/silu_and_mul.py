"""SiLU-and-mul for the fused gate/up projection, Triton: ``[T, 2I]`` -> ``silu(gate) * up`` ``[T, I]``."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hotloop.kernels.checks import FLOAT_DTYPES, check, check_dtype, check_last_contiguous
from hotloop.kernels.launch_math import cdiv, next_power_of_2
from hotloop.kernels.pdl import gdc_launch_dependents, gdc_wait, launch_kwargs, pdl


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, inter, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # programmatic dependent launch (kernels/pdl.py)
        gdc_wait()
        gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + offs, mask=mask, other=0.0)
    # as torch: silu rounded to the input dtype, then the product rounded
    act = (gate / (1.0 + tl.exp(-gate))).to(x_ptr.dtype.element_ty)
    y = act.to(tl.float32) * up.to(tl.float32)
    tl.store(out_ptr + row * stride_o + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``x [..., 2I]`` laid out [gate | up] -> ``[..., I]``."""
    check(x.shape[-1] % 2 == 0, f"last dim {x.shape[-1]} must be even ([gate | up])")
    check_dtype("x", x, FLOAT_DTYPES)
    inter = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * inter)
    check_last_contiguous("x", x2)
    out = torch.empty(x2.shape[0], inter, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = min(2048, next_power_of_2(inter))
        _silu_and_mul_kernel[(x2.shape[0], cdiv(inter, block))](
            x2,
            out,
            x2.stride(0),
            out.stride(0),
            inter,
            BLOCK=block,
            PDL=pdl(x.device),
            num_warps=4,
            **launch_kwargs(x.device),
        )
    return out.view(*x.shape[:-1], inter)
