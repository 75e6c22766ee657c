"""Programmatic dependent launch (PDL, Hopper and later) for the Triton kernels of the decode step.

A kernel launched as a programmatic dependent may start while the kernel before it in the stream
drains. Before its ``gdc_wait()`` it may only read memory that the kernel just before it does not
write (weights; the decode attention's early cache reads, ``paged_decode_attention``); after it,
everything the kernel before wrote is visible. ``gdc_launch_dependents()`` lets the next such launch
start early; every kernel here calls it only after its own ``gdc_wait()``, so when a kernel starts,
all kernels but the one just before it have finished. Both are no-ops for a kernel launched without PDL, so a kernel compiled
with ``PDL=True`` is correct after any predecessor. CUDA graphs keep the programmatic edges.

Launchers pass ``PDL=pdl(device)`` to their kernel and ``**launch_kwargs(device)`` to the launch.
Off under the Triton interpreter, with a Triton that lacks it, before sm_90, or with
``HOTLOOP_PDL=0``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
import triton

try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    HAS_GDC = True
except ImportError:  # an older Triton: never launched with PDL, so these are never reached
    HAS_GDC = False

    @triton.jit
    def gdc_wait():  # type: ignore[no-redef]
        pass

    @triton.jit
    def gdc_launch_dependents():  # type: ignore[no-redef]
        pass


__all__ = ["HAS_GDC", "gdc_launch_dependents", "gdc_wait", "launch_kwargs", "pdl", "pdl_enabled"]


def _launch_takes_pdl() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return "launch_pdl" in {f.name for f in dataclasses.fields(CUDAOptions)}


def pdl_enabled(device: torch.device) -> bool:
    """Whether launches on ``device`` use PDL (read now; ``pdl`` caches it per device)."""
    if os.environ.get("HOTLOOP_PDL", "1") == "0" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if not (HAS_GDC and device.type == "cuda" and _launch_takes_pdl()):
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


_cache: dict[int, bool] = {}


def pdl(device: torch.device) -> bool:
    """``pdl_enabled``, decided once per device."""
    index = device.index if device.index is not None else -1
    if index not in _cache:
        _cache[index] = pdl_enabled(device)
    return _cache[index]


def reset() -> None:
    """Forget the per-device decisions (after changing ``HOTLOOP_PDL``; benchmarks)."""
    _cache.clear()


def launch_kwargs(device: torch.device) -> dict[str, Any]:
    """The extra launch arguments: ``launch_pdl=True`` where PDL is on, nothing otherwise."""
    return {"launch_pdl": True} if pdl(device) else {}
