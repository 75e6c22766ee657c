"""RMSNorm, plain and with the residual add fused in (``x + residual`` then norm, one call)."""

from __future__ import annotations

from typing import overload

import torch
from torch import nn

from hotloop.kernels import ops


class RMSNorm(nn.Module):
    """RMSNorm over the last dim (computed in float32, returned in x's dtype).

    ``forward(x)`` -> normed; ``forward(x, residual)`` -> ``(norm(x + residual), x + residual)``, the
    pre-norm decoder's "add the sublayer output to the stream, then norm it" step.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)

    @overload
    def forward(self, x: torch.Tensor, residual: None = None) -> torch.Tensor: ...

    @overload
    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps)
        return ops.add_rms_norm(x, residual, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
