"""Gated activations: ``SiluAndMul`` for the fused gate/up projection's output."""

from __future__ import annotations

import torch
from torch import nn

from hotloop.kernels import ops


class SiluAndMul(nn.Module):
    """``[T, 2*I]`` laid out [gate | up] -> ``silu(gate) * up`` ``[T, I]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.silu_and_mul(x)
