"""Two micro-batches of a large decode step, overlapped on two CUDA streams (nano-batching, as in
NanoFlow, Zhu et al. 2024).

At batch 256 and 1k context a Llama-3-8B decode step is two halves that run one after the other:
attention reads the KV cache at the memory bandwidth (about 53% of the step) and the projections
run at the tensor cores' rate (about 39%). Their floors overlap; their kernels do not. Split the
batch in two by rows, A and B, and run each layer as

    compute stream:  ... [o/MLP of A(l-1), q/k/v of A(l)] [o/MLP of B(l-1), q/k/v of B(l)] ...
    attention stream:    ... [attention of B(l-1)]         [attention of A(l)]           ...

so that one half's attention (bandwidth) runs beside the other half's projections (tensor cores).
Each half's chain is the plain layer's (``pre_attention``, attention, ``post_attention``) over its
own rows, so a row's result is that of a batch of its half's size. All attention launches stay on
one stream and all projections on the other, in order: kernels that share arrival counters
(``kernels/counters.py``: the decode split merge, W4A16 split-K) never run at once.

``HOTLOOP_DECODE_OVERLAP`` turns it on (off by default until measured; ``decode_split``). It
applies to decode-only batches inside the decode CUDA graphs (captured, so the extra launches and
events cost no host time per step); on the CPU, where there are no streams, the same schedule runs
in order (tests).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch

from hotloop.layers.attention import AttentionMetadata

ENV = "HOTLOOP_DECODE_OVERLAP"
# with "1": the smallest batch that is split (each half then still fills the GPU's attention grid)
DEFAULT_MIN_BATCH = 128

CosSin = tuple[torch.Tensor, torch.Tensor]
KVCache = tuple[torch.Tensor, torch.Tensor]


def min_batch_from_env() -> int | None:
    """``HOTLOOP_DECODE_OVERLAP``: unset, empty or ``0``: off (None); ``1``: batches of at least
    ``DEFAULT_MIN_BATCH`` rows; an integer ``N >= 2``: batches of at least ``N`` rows."""
    raw = os.environ.get(ENV, "").strip()
    if raw in ("", "0"):
        return None
    if raw == "1":
        return DEFAULT_MIN_BATCH
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 2:
        raise ValueError(
            f"{ENV}={raw!r} must be 0 (off), 1 (batches of {DEFAULT_MIN_BATCH}+) or a batch size >= 2"
        )
    return n


def decode_split(meta: AttentionMetadata, h: torch.Tensor) -> int | None:
    """Where to split this step's rows (the first half's size, a multiple of 8 where the batch
    allows), or None to run it whole: the switch is off, the batch is not decode-only, has fewer
    rows than the switch's minimum, or runs on CUDA outside a decode graph's capture
    (``meta.graph``)."""
    min_batch = min_batch_from_env()
    T = h.shape[0]
    if min_batch is None or not meta.decode_only or T < min_batch or T < 2:
        return None
    if h.is_cuda and not meta.graph:
        return None
    half = T // 2
    if T >= 16:
        half = max(8, half - half % 8)
    return half


class _Streams:
    """The compute stream (the caller's) and the attention stream, one per device, made once."""

    _side: dict[int, torch.cuda.Stream] = {}

    def __init__(self, device: torch.device) -> None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.compute = torch.cuda.current_stream(index)
        side = self._side.get(index)
        if side is None:
            side = self._side[index] = torch.cuda.Stream(device=index)
        self.side = side

    def attention(self, inputs: Sequence[torch.Tensor]) -> Any:
        """Context for one attention launch group: the side stream waits for the compute stream's
        work so far; ``inputs`` (made on the compute stream) are marked as used on the side one."""
        self.side.wait_stream(self.compute)
        for t in inputs:
            t.record_stream(self.side)
        return torch.cuda.stream(self.side)

    def done(self) -> torch.cuda.Event:
        ev = torch.cuda.Event()
        ev.record(self.side)
        return ev

    def join(self, event: torch.cuda.Event, output: torch.Tensor) -> None:
        """The compute stream waits for ``event``; ``output`` (made on the side) is used there."""
        self.compute.wait_event(event)
        output.record_stream(self.compute)


def decode_overlapped(
    layers: Sequence[Any],
    h: torch.Tensor,
    cos_sin: CosSin,
    kv_caches: Sequence[KVCache],
    meta: AttentionMetadata,
    split: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``layers`` (Llama-family decoder layers: ``pre_attention``, ``self_attn.attn``,
    ``post_attention``) over a decode-only batch ``h [T, hidden]`` as two micro-batches, rows
    ``:split`` and ``split:``, overlapped as the module describes. Returns ``(h, residual)`` after
    the last layer, ``[T, hidden]`` each (the final norm adds them)."""
    T = h.shape[0]
    if not 0 < split < T:
        raise ValueError(f"split {split} must leave rows on both sides of a batch of {T}")
    if len(kv_caches) != len(layers) or not layers:
        raise ValueError(f"got {len(kv_caches)} KV caches for {len(layers)} layers")
    bounds = ((0, split), (split, T))
    metas = [meta.rows(lo, hi) for lo, hi in bounds]
    rot = [(cos_sin[0][lo:hi], cos_sin[1][lo:hi]) for lo, hi in bounds]
    hs: list[torch.Tensor] = [h[lo:hi] for lo, hi in bounds]
    res: list[torch.Tensor | None] = [None, None]
    outs: list[torch.Tensor | None] = [None, None]
    events: list[torch.cuda.Event | None] = [None, None]
    streams = _Streams(h.device) if h.is_cuda else None
    for i, (layer, kv_cache) in enumerate(zip(layers, kv_caches, strict=True)):
        for m in (0, 1):
            if i:
                hs[m], res[m] = _post(layers[i - 1], streams, outs[m], res[m], events[m])
            q, k, v, res[m] = layer.pre_attention(hs[m], res[m])
            ctx = nullcontext() if streams is None else streams.attention((q, k, v, *rot[m]))
            with ctx:
                outs[m] = layer.self_attn.attn(q, k, v, kv_cache, metas[m], rot[m])
                events[m] = None if streams is None else streams.done()
    for m in (0, 1):
        hs[m], res[m] = _post(layers[-1], streams, outs[m], res[m], events[m])
    residuals = [r for r in res if r is not None]
    assert len(residuals) == 2
    return torch.cat(hs), torch.cat(residuals)


def _post(
    layer: Any,
    streams: _Streams | None,
    o: torch.Tensor | None,
    residual: torch.Tensor | None,
    event: torch.cuda.Event | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``layer.post_attention`` of one micro-batch, on the compute stream once its attention is done."""
    assert o is not None and residual is not None
    if streams is not None and event is not None:
        streams.join(event, o)
    out: tuple[torch.Tensor, torch.Tensor] = layer.post_attention(o, residual)
    return out
