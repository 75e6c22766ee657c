"""Rotary + KV write, fused add + RMSNorm, and SiLU-and-mul kernels against ``kernels/reference.py``."""

from __future__ import annotations

import pytest
import torch
from kernel_checks import TOL, interpret, rel_err

from hotloop.kernels import reference


def _rotary_case(t: int, h: int, kv: int, d: int, half: int, dtype: torch.dtype, device: str) -> None:
    from hotloop.kernels.rotary_kv_write import rotary_kv_write

    qkv = torch.randn(t, (h + 2 * kv) * d).to(dtype).to(device)
    q, k, v = (x.view(t, -1, d) for x in qkv.split([h * d, kv * d, kv * d], dim=-1))  # strided views
    ang = torch.rand(t, half, device=device) * 100
    cos, sin = ang.cos(), ang.sin()
    nb, bs = t // 4 + 3, 4
    kc = torch.randn(nb, bs, kv, d).to(dtype).to(device)
    vc = kc.clone() + 1
    slots = torch.randperm(nb * bs)[:t].to(device)
    slots[0] = -1  # a padding row writes nothing
    q_ref, kc_ref, vc_ref = q.clone(), kc.clone(), vc.clone()
    reference.rotary_kv_write(q_ref, k.clone(), v.clone(), cos, sin, kc_ref, vc_ref, slots)
    k_src = k.clone()
    rotary_kv_write(q, k, v, cos, sin, kc, vc, slots)
    tol = 0.0 if dtype == torch.float32 else TOL[dtype] / 4
    assert rel_err(q, q_ref) <= tol + 1e-6
    assert rel_err(kc, kc_ref) <= tol + 1e-6
    assert torch.equal(vc, vc_ref)
    assert torch.equal(k, k_src)  # k is only read
    # rotate_k: k rotated in place, each row what was stored for its token (padding rows untouched)
    k2, kc2, vc2 = k_src.clone(), kc.clone(), vc.clone()
    rotary_kv_write(q.clone(), k2, v, cos, sin, kc2, vc2, slots, rotate_k=True)
    live = slots >= 0
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)
    assert torch.equal(k2[live], kc.view(-1, kv, d)[slots[live]]) and torch.equal(k2[~live], k_src[~live])


def _tol(dtype: torch.dtype, device: str) -> float:
    """One rounding of the output: a quarter of the attention tolerance. The interpreter rounds bf16
    by truncation, not to nearest, so it gets the full one."""
    return TOL[dtype] / (4 if device == "cuda" else 1)


def _norm_case(n: int, c: int, dtype: torch.dtype, device: str) -> None:
    from hotloop.kernels.rms_norm import rms_norm

    x = torch.randn(n, c).to(dtype).to(device)
    r = torch.randn(n, c).to(dtype).to(device)
    w = (torch.rand(c) + 0.5).to(dtype).to(device)
    out, none = rms_norm(x, w, 1e-6)
    assert none is None and rel_err(out, reference.rms_norm(x, w, 1e-6)) < _tol(dtype, device)
    out, res = rms_norm(x, w, 1e-5, r)
    ref_out, ref_res = reference.add_rms_norm(x, r, w, 1e-5)
    assert res is not None
    assert rel_err(res, ref_res) < 1e-6 + (0 if dtype == torch.float32 else _tol(dtype, device))
    assert rel_err(out, ref_out) < _tol(dtype, device)


def _silu_case(n: int, inter: int, dtype: torch.dtype, device: str) -> None:
    from hotloop.kernels.silu_and_mul import silu_and_mul

    x = (torch.randn(n, 2 * inter) * 3).to(dtype).to(device)
    assert rel_err(silu_and_mul(x), reference.silu_and_mul(x)) < _tol(dtype, device)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    "h,kv,d,half", [(32, 8, 128, 64), (28, 4, 128, 64), (16, 16, 64, 32), (8, 2, 256, 32)]
)
def test_rotary_kv_write_gpu(h: int, kv: int, d: int, half: int, dtype: torch.dtype) -> None:
    _rotary_case(300, h, kv, d, half, dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n,c", [(1, 576), (300, 4096), (7, 3584)])
def test_norm_and_silu_gpu(n: int, c: int, dtype: torch.dtype) -> None:
    _norm_case(n, c, dtype, "cuda")
    _silu_case(n, c, dtype, "cuda")


@interpret
@pytest.mark.parametrize("h,kv,d,half", [(4, 2, 16, 8), (3, 1, 16, 4)])
def test_rotary_kv_write_interpreted(h: int, kv: int, d: int, half: int) -> None:
    _rotary_case(9, h, kv, d, half, torch.float32, "cpu")


@interpret
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_and_silu_interpreted(dtype: torch.dtype) -> None:
    _norm_case(5, 48, dtype, "cpu")
    _silu_case(5, 40, dtype, "cpu")
