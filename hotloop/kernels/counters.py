"""Arrival counters for "the last program to arrive finishes the job" epilogues (split-K fixup of
the W4A16 GEMM, the split merge of decode attention).

One zeroed int32 buffer per (device, family); every launch leaves its counters at zero again (the
last arrival resets its own). Launches that share a family's buffer on one device must therefore
not overlap in time: two streams running them at once would mix their counts.
"""

from __future__ import annotations

import torch

SLOTS = 16384  # counters kept per device and family

_buffers: dict[tuple[str, int], torch.Tensor] = {}


def _key(device: torch.device, family: str) -> tuple[str, int]:
    if device.type != "cuda":
        return family, -1
    return family, device.index if device.index is not None else torch.cuda.current_device()


def buffer(device: torch.device, family: str) -> torch.Tensor:
    """``family``'s counter buffer on ``device`` (tests: it is all zeros between launches)."""
    return _buffers[_key(device, family)]


def counters(device: torch.device, family: str, needed: int) -> torch.Tensor | None:
    """``needed`` zeroed counters for ``family`` on ``device``, or ``None`` (use the unfused path)
    where there are more than ``SLOTS``, or where the buffer would first be made inside a CUDA-graph
    capture (its zeroing would only run at replay)."""
    if needed > SLOTS:
        return None
    key = _key(device, family)
    buf = _buffers.get(key)
    if buf is None:
        # (the CPU keeps one too: kernels run there under the Triton interpreter, and a launch that
        # forgot to reset its counters then shows in the next one, as it would on a GPU)
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        buf = _buffers[key] = torch.zeros(SLOTS, dtype=torch.int32, device=device)
    return buf
