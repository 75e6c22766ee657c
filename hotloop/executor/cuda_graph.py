"""Full CUDA graphs of the decode step, captured at start for padded batch-size buckets.

Each graph runs embedding -> every layer -> final norm -> LM head -> greedy argmax for ``bucket``
sequences reading the persistent ``InputBuffers``; a step of ``B`` decodes replays the smallest
bucket >= B with the extra rows padded (seq_len 0, slot -1). All graphs share one memory pool and
are captured largest first, so the smaller ones reuse its blocks.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from hotloop.executor.gpu_inputs import InputBuffers
from hotloop.kernels import ops
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)


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
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.buffers = buffers
        self.buckets = batch_buckets(min(max_batch_size, buffers.max_seqs))
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}  # [bucket, vocab] float32
        self.greedy: dict[int, torch.Tensor] = {}  # [bucket] int64
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

    def _forward(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        buf = self.buffers
        hidden = self.model(
            buf.input_ids[:batch], buf.positions[:batch], self.kv_caches, buf.graph_meta(batch)
        )
        logits = self.model.compute_logits(hidden)
        return logits, ops.greedy_argmax(logits)

    @torch.inference_mode()
    def _capture(self, progress: bool) -> None:
        t0 = time.perf_counter()
        sizes = sorted(self.buckets, reverse=True)
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(sizes), desc="capturing CUDA graphs", unit="graph", leave=False)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for b in sizes:
                self.buffers.reset_for_capture(b)
                self._forward(b)  # warm-up: compiles kernels, settles the allocator
                stream.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool, stream=stream):
                    logits, greedy = self._forward(b)
                if self.pool is None:
                    self.pool = g.pool()
                self.graphs[b] = g
                self.logits[b] = logits
                self.greedy[b] = greedy
                if bar is not None:
                    bar.update(1)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        if bar is not None:
            bar.close()
        logger.info(
            "captured %d decode CUDA graphs (batch %s) in %.1f s",
            len(sizes),
            ",".join(map(str, self.buckets)),
            time.perf_counter() - t0,
        )

    def run(self, bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the graph of ``bucket`` rows; returns its static ``(logits, greedy ids)``."""
        self.graphs[bucket].replay()
        return self.logits[bucket], self.greedy[bucket]
