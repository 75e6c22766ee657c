"""Full CUDA graphs of the decode step, captured at start for padded batch-size buckets.

Each graph runs embedding -> every layer -> final norm -> LM head -> greedy argmax for ``bucket``
sequences reading the persistent ``InputBuffers``; a step of ``B`` decodes replays the smallest
bucket >= B with the extra rows padded (seq_len 0, slot -1). All graphs share one memory pool and
are captured largest first, so the smaller ones reuse its blocks.

A decode graph's split count (flash-decoding's context splits) is fixed at capture, whatever the
context. At batch 1 the heuristic's 16 splits lose to 8 at short contexts and win at long ones, so
bucket 1 has a second graph with at most ``SHORT_SPLITS`` splits, replayed while every row's context
is at most ``short_context`` tokens (``HOTLOOP_DECODE_SHORT_CONTEXT``; 0: no second graph).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from hotloop.executor.gpu_inputs import InputBuffers
from hotloop.kernels import ops
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

SHORT_SPLITS = 8  # the split cap of a short-context graph
SHORT_BUCKETS = (1,)  # the buckets that get one (measured at batch 1 only)
DEFAULT_SHORT_CONTEXT = 1024


def short_context_from_env() -> int:
    """``HOTLOOP_DECODE_SHORT_CONTEXT``: the longest context (tokens, the new one included) that
    replays the short-context graph; 0 captures none."""
    raw = os.environ.get("HOTLOOP_DECODE_SHORT_CONTEXT", "").strip() or str(DEFAULT_SHORT_CONTEXT)
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(
            f"HOTLOOP_DECODE_SHORT_CONTEXT={raw!r} must be a token count >= 0 (0: one split count at every context)"
        )
    return value


def wants_short_graph(model: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], bucket: int) -> bool:
    """Whether ``bucket``'s decode graph would take more than ``SHORT_SPLITS`` splits, over a 16-bit
    cache (the split counts of the quantized caches' kernels were not timed at short contexts)."""
    from hotloop.kernels.paged_decode_attention import decode_plan
    from hotloop.layers.attention import PagedAttention

    if bucket not in SHORT_BUCKETS or not kv_caches or kv_caches[0][0].dtype == torch.uint8:
        return False
    layers = [m for m in model.modules() if isinstance(m, PagedAttention)]
    if not layers:
        return False
    itemsize = kv_caches[0][0].element_size()
    return any(decode_plan(bucket, m.num_kv_heads, 0, m.head_dim, itemsize)[0] > SHORT_SPLITS for m in layers)


def batch_buckets(max_batch_size: int) -> list[int]:
    """1, 2, 4, 8, then every multiple of 8 (of 16 past 128) up to ``max_batch_size``, which is included."""
    sizes = [b for b in (1, 2, 4) if b < max_batch_size]
    b = 8
    while b < max_batch_size:
        sizes.append(b)
        b += 8 if b < 128 else 16
    sizes.append(max_batch_size)
    return sizes


class DecodeGraphs:
    """Captured decode graphs, one per batch bucket; ``run(batch)`` replays one."""

    def __init__(
        self,
        model: Any,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        buffers: InputBuffers,
        max_batch_size: int,
        progress: bool = True,
        short_context: int | None = None,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.buffers = buffers
        self.buckets = batch_buckets(min(max_batch_size, buffers.max_seqs))
        self.short_context = short_context_from_env() if short_context is None else short_context
        # (bucket, split cap or None) -> graph and its static outputs
        self.graphs: dict[tuple[int, int | None], torch.cuda.CUDAGraph] = {}
        self.logits: dict[tuple[int, int | None], torch.Tensor] = {}  # [bucket, vocab] float32
        self.greedy: dict[tuple[int, int | None], torch.Tensor] = {}  # [bucket] int64
        self.short_buckets = (
            frozenset(b for b in self.buckets if wants_short_graph(model, kv_caches, b))
            if self.short_context > 0
            else frozenset()
        )
        self.pool: Any = None
        self._capture(progress)

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    def bucket_for(self, batch: int) -> int:
        for b in self.buckets:
            if b >= batch:
                return b
        raise ValueError(f"batch {batch} exceeds the largest captured graph ({self.max_batch})")

    def _forward(self, batch: int, max_splits: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        buf = self.buffers
        meta = buf.graph_meta(batch, max_splits)
        hidden = self.model(buf.input_ids[:batch], buf.positions[:batch], self.kv_caches, meta)
        logits = self.model.compute_logits(hidden)
        return logits, ops.greedy_argmax(logits)

    @torch.inference_mode()
    def _capture(self, progress: bool) -> None:
        t0 = time.perf_counter()
        keys: list[tuple[int, int | None]] = []
        for b in sorted(self.buckets, reverse=True):
            keys.append((b, None))
            if b in self.short_buckets:
                keys.append((b, SHORT_SPLITS))
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(keys), desc="capturing CUDA graphs", unit="graph", leave=False)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for key in keys:
                b, cap = key
                self.buffers.reset_for_capture(b)
                self._forward(b, cap)  # warm-up: compiles kernels, settles the allocator
                stream.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool, stream=stream):
                    logits, greedy = self._forward(b, cap)
                if self.pool is None:
                    self.pool = g.pool()
                self.graphs[key] = g
                self.logits[key] = logits
                self.greedy[key] = greedy
                if bar is not None:
                    bar.update(1)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        if bar is not None:
            bar.close()
        short = ""
        if self.short_buckets:
            batches = ",".join(map(str, sorted(self.short_buckets)))
            short = (
                f" (batch {batches} also with at most {SHORT_SPLITS} decode splits, "
                f"for contexts up to {self.short_context} tokens)"
            )
        logger.info(
            "captured %d decode CUDA graphs (batch %s)%s in %.1f s",
            len(keys),
            ",".join(map(str, self.buckets)),
            short,
            time.perf_counter() - t0,
        )

    def key_for(self, bucket: int, context: int | None = None) -> tuple[int, int | None]:
        """The graph that runs ``bucket`` rows whose longest context (tokens in the cache, this
        step's included) is ``context``: the short-context one where it exists and the context fits."""
        if context is not None and context <= self.short_context and bucket in self.short_buckets:
            return (bucket, SHORT_SPLITS)
        return (bucket, None)

    def run(self, bucket: int, context: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the graph of ``bucket`` rows at longest context ``context`` (None: the graph for
        any context); returns its static ``(logits, greedy ids)``."""
        key = self.key_for(bucket, context)
        self.graphs[key].replay()
        return self.logits[key], self.greedy[key]
