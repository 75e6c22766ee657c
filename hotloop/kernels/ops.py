"""The one place that picks an op's implementation: Triton on CUDA tensors, the torch reference elsewhere.

The choice follows the tensor's device (fixed when the model is built on it), so the CPU path never
imports Triton and the GPU path never falls back silently. ``set_triton_enabled(False)`` forces the
reference everywhere (parity debugging); nothing reads the environment here.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType

import torch

from hotloop.kernels import reference

_state = {"enabled": importlib.util.find_spec("triton") is not None}


def set_triton_enabled(enabled: bool) -> None:
    """Turn the Triton kernels on or off for CUDA tensors (on by default when Triton is installed)."""
    _state["enabled"] = enabled


def use_triton(x: torch.Tensor) -> bool:
    return x.is_cuda and _state["enabled"]


def _kernel(name: str) -> ModuleType:
    return importlib.import_module(f"hotloop.kernels.{name}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if use_triton(x):
        return _kernel("rms_norm").rms_norm(x, weight, eps)[0]
    return reference.rms_norm(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)``."""
    if use_triton(x) and x.is_contiguous() and residual.is_contiguous():
        out, res = _kernel("rms_norm").rms_norm(x, weight, eps, residual)
        assert res is not None
        return out, res
    return reference.add_rms_norm(x, residual, weight, eps)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if use_triton(x):
        return _kernel("silu_and_mul").silu_and_mul(x)
    return reference.silu_and_mul(x)
