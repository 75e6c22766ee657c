"""Asymmetric group-wise int4 quantization of a ``[out, in]`` weight (the math, no search).

Each row is cut into groups of ``group_size`` input channels; a group's range ``[min, max]``
(widened to include 0, so every group can represent zero) maps onto ``0 .. 2^bits - 1`` with a
scale (rounded to fp16, as stored) and an integer zero point.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SCALE_DTYPE = torch.float16


@dataclass(frozen=True, slots=True)
class QuantizedWeight:
    """One linear's int4 weight in row-major form (packing happens at export).

    q ``[out, in]`` and zeros ``[out, in // g]`` uint8 in ``[0, 15]``; scales ``[out, in // g]`` fp16.
    """

    q: torch.Tensor
    zeros: torch.Tensor
    scales: torch.Tensor
    group_size: int

    def dequantize(self) -> torch.Tensor:
        """``[out, in]`` float32."""
        g = self.group_size
        s = self.scales.float().repeat_interleave(g, dim=1)
        z = self.zeros.float().repeat_interleave(g, dim=1)
        return (self.q.float() - z) * s


def _grouped(w: torch.Tensor, group_size: int) -> torch.Tensor:
    out, k = w.shape
    if k % group_size:
        raise ValueError(f"group_size={group_size} does not divide in_features={k}")
    return w.float().reshape(out, k // group_size, group_size)


def _range_params(wmin: torch.Tensor, wmax: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point for group ranges (``[..]`` each) -> (scales fp16-rounded, zeros)."""
    maxq = 2**bits - 1
    wmin = wmin.clamp(max=0.0)
    wmax = wmax.clamp(min=0.0)
    scales = ((wmax - wmin).clamp(min=1e-5) / maxq).to(SCALE_DTYPE).float()
    zeros = (-wmin / scales).round().clamp(0, maxq)
    return scales, zeros


def quantize_weight(w: torch.Tensor, group_size: int, bits: int = 4) -> QuantizedWeight:
    """Round-to-nearest int4 of ``w`` ``[out, in]`` with a per-group scale and zero point."""
    wg = _grouped(w, group_size)
    scales, zeros = _range_params(wg.amin(-1), wg.amax(-1), bits)
    q = ((wg / scales[..., None]).round() + zeros[..., None]).clamp(0, 2**bits - 1)
    return QuantizedWeight(
        q=q.reshape(w.shape).to(torch.uint8),
        zeros=zeros.to(torch.uint8),
        scales=scales.to(SCALE_DTYPE),
        group_size=group_size,
    )


def pseudo_quantize(w: torch.Tensor, group_size: int, bits: int = 4) -> torch.Tensor:
    """``dequantize(quantize(w))`` in w's dtype and shape, without materialising the integers."""
    wg = _grouped(w, group_size)
    scales, zeros = _range_params(wg.amin(-1), wg.amax(-1), bits)
    q = ((wg / scales[..., None]).round() + zeros[..., None]).clamp(0, 2**bits - 1)
    return ((q - zeros[..., None]) * scales[..., None]).reshape(w.shape).to(w.dtype)
