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
``HOTLOOP_PDL=0``; off, too, for launches issued inside ``off()``.

Where it pays: decode graphs of at most ``max_decode_batch()`` rows (``HOTLOOP_PDL_MAX_DECODE_BATCH``,
default 8). Larger decode graphs are captured without it (``executor/cuda_graph.py``): there our
kernels sit between cuBLAS GEMMs, and on an H200 the Llama-3-8B batch-256 step took 17.49 ms with
PDL against 16.37 without (16 rows: 5.62 against 5.54; the kernels' own times equal, the gaps between
them not; BENCHMARKS.md, twenty-seventh session). Eager and piecewise steps keep it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
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


__all__ = [
    "HAS_GDC",
    "gdc_launch_dependents",
    "gdc_wait",
    "launch_kwargs",
    "max_decode_batch",
    "off",
    "pdl",
    "pdl_enabled",
]

MAX_DECODE_BATCH_ENV = "HOTLOOP_PDL_MAX_DECODE_BATCH"
DEFAULT_MAX_DECODE_BATCH = 8


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
_off_depth = 0  # > 0 inside ``off()``


def max_decode_batch() -> int:
    """The most rows a decode graph captured with PDL has (``HOTLOOP_PDL_MAX_DECODE_BATCH``)."""
    raw = os.environ.get(MAX_DECODE_BATCH_ENV, "")
    if not raw:
        return DEFAULT_MAX_DECODE_BATCH
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{MAX_DECODE_BATCH_ENV}={raw!r} must be an integer (rows)") from None
    if value < 0:
        raise ValueError(f"{MAX_DECODE_BATCH_ENV}={value} must be >= 0")
    return value


@contextmanager
def off() -> Iterator[None]:
    """Launches issued inside (and CUDA graphs captured inside) run without PDL: kernels compiled
    with ``PDL=False`` and launched without the attribute, i.e. fully ordered after the kernel
    before. Nests; the engine's loop is one thread."""
    global _off_depth
    _off_depth += 1
    try:
        yield
    finally:
        _off_depth -= 1


def pdl(device: torch.device) -> bool:
    """``pdl_enabled``, decided once per device; False inside ``off()``."""
    if _off_depth:
        return False
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
