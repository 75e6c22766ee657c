"""Full CUDA graphs of the decode step, captured at start for padded batch-size buckets.

Each graph runs embedding -> every layer -> final norm -> LM head -> greedy argmax for ``bucket``
sequences reading the persistent ``InputBuffers``; a step of ``B`` decodes replays the smallest
bucket >= B with the extra rows padded (seq_len 0, slot -1). All graphs share one memory pool and
are captured largest first, so the smaller ones reuse its blocks.

A decode graph's split count (flash-decoding's context splits) is fixed at capture, whatever the
context, and a split covers whole tiles of ``BLOCK_N`` keys: at a context of ``n`` tiles, the splits
past the ``n``-th hold no keys, yet their programs run and their empty partials are merged. So
the small buckets (``SHORT_BUCKETS``) also have a graph per smaller power-of-two split cap ``c``
(``SHORT_CAPS``), replayed while the batch's longest context is at most ``c`` tiles and more than
the next smaller cap's limit: as many splits hold keys as in the full graph, one tile each. Over a
16-bit cache, where every cap down to 1 is captured, fewer than half of a replayed graph's splits are
empty. An int8 cache (whose CUDA kernel cuts its splits the same way) takes caps 8 and 4 only
(``SHORT_CAPS_INT8``): cap 4 then also serves contexts of one to two tiles. A cap only changes how
the work is split, never the result beyond float rounding. ``HOTLOOP_DECODE_SHORT_GRAPHS=0``
captures none.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from hotloop.executor.gpu_inputs import InputBuffers
from hotloop.kernels import dense_tune, ops
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

# The split caps of the short-context graphs, and the buckets that get them: the small batches,
# where the plan takes the most splits. H200, bf16, decode tokens/s of the rule's graph over the full
# one (benchmarks/short_context_sweep.py, benchmarks/results/gpu_2026-12-01i): SmolLM2-135M batch 1
# 1.082x at contexts 17-64 (1 split), 1.053x at 65-128 (2), 1.035x at 129-256 (4), 1.031x at 257-512
# (8), and the full graph 5% ahead of 8 splits at 641-768; Llama-3-8B batch 1 1.011x / 1.004x /
# 1.003x / 1.003x; batches 2 and 4 1.001-1.025x where the rule picks a short graph.
SHORT_CAPS = (8, 4, 2, 1)
SHORT_BUCKETS = (1, 2, 4)
# Over an int8 cache (Llama-3-8B batch 1, benchmarks/results/gpu_2026-12-02 call 2): caps 8 and 4
# 1.007-1.011x the full graph up to 512 tokens, but 2 and 1 splits lose (1 split 0.987x at contexts
# 17-64, where cap 4 gives 1.010x): an int8 tile takes longer, so one or two programs per KV head are
# too few. Their contexts take cap 4.
SHORT_CAPS_INT8 = (8, 4)


def short_graphs_from_env() -> bool:
    """``HOTLOOP_DECODE_SHORT_GRAPHS``: 1 (the default) captures the short-context graphs, 0 none."""
    raw = os.environ.get("HOTLOOP_DECODE_SHORT_GRAPHS", "").strip() or "1"
    if raw not in ("0", "1"):
        raise ValueError(
            f"HOTLOOP_DECODE_SHORT_GRAPHS={raw!r} must be 1 (capture the short-context graphs) or 0"
        )
    return raw == "1"


def short_limits(
    model: Any, kv_caches: list[tuple[torch.Tensor, torch.Tensor]], bucket: int
) -> dict[int, int]:
    """``{cap: longest context}`` of ``bucket``'s short-context graphs: every cap in ``SHORT_CAPS``
    below the split count the bucket's graph plans, each for contexts up to ``cap`` decode tiles of
    the kernel that runs there (the Triton kernel's ``BLOCK_N``, or the CUDA int8 kernel's 64 keys).
    A cap whose limit is no longer than a smaller cap's is left out (it would never replay); an int8
    cache takes only ``SHORT_CAPS_INT8`` (timed at batch 1 only). None (``{}``) outside
    ``SHORT_BUCKETS``, over an int4 or float32 cache (whose kernels' split counts were not timed at
    short contexts) or for a model without paged attention."""
    from hotloop.kernels import kv_quant
    from hotloop.kernels.paged_decode_attention import decode_plan, decode_tile
    from hotloop.layers.attention import PagedAttention

    if bucket not in SHORT_BUCKETS or not kv_caches:
        return {}
    k_cache, v_cache = kv_caches[0]
    if k_cache.dtype not in (torch.float16, torch.bfloat16, torch.uint8):
        return {}
    layers = [m for m in model.modules() if isinstance(m, PagedAttention)]
    if not layers:
        return {}
    quant = 0
    if k_cache.dtype == torch.uint8:
        # a 16-bit model's int8 cache (scales in 16 bits); int4 and float32 models' caches: not timed
        if any(k_cache.shape[-1] != kv_quant.row_bytes(m.head_dim, 8, 2) for m in layers):
            return {}
        quant = 8
    itemsize = 2 if quant else k_cache.element_size()
    planned = max(decode_plan(bucket, m.num_kv_heads, quant, m.head_dim, itemsize)[0] for m in layers)
    limits: dict[int, int] = {}
    caps = SHORT_CAPS_INT8 if quant else SHORT_CAPS
    for cap in sorted(caps):  # ascending: ``DecodeGraphs.key_for`` takes the first that fits
        if cap >= planned:
            continue
        tile = min(
            decode_tile(
                quant,
                m.head_dim,
                m.num_heads // m.num_kv_heads,
                m.sliding_window,
                cap,
                k_cache,
                v_cache,
                fuse_merge=decode_plan(bucket, m.num_kv_heads, quant, m.head_dim, itemsize, cap)[1],
            )
            for m in layers
        )
        if cap * tile > max(limits.values(), default=0):
            limits[cap] = cap * tile
    return limits


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
        short_graphs: bool | None = None,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.buffers = buffers
        self.buckets = batch_buckets(min(max_batch_size, buffers.max_seqs))
        # (bucket, split cap or None) -> graph and its static outputs
        self.graphs: dict[tuple[int, int | None], torch.cuda.CUDAGraph] = {}
        # [bucket, vocab]: float32 where the greedy argmax wants it (ops.greedy_logits_float32), else
        # the model dtype (the sampler widens them; the greedy ids skip the cast)
        self.logits: dict[tuple[int, int | None], torch.Tensor] = {}
        self.greedy: dict[tuple[int, int | None], torch.Tensor] = {}  # [bucket] int64
        if short_graphs is None:
            short_graphs = short_graphs_from_env()
        # bucket -> {split cap: longest context} of its short-context graphs
        self.short_limits: dict[int, dict[int, int]] = {}
        for b in self.buckets if short_graphs else ():
            limits = short_limits(model, kv_caches, b)
            if limits:
                self.short_limits[b] = limits
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
        logits = self.model.compute_logits(hidden, float32=ops.greedy_logits_float32(batch))
        return logits, ops.greedy_argmax(logits)

    @torch.inference_mode()
    def _capture(self, progress: bool) -> None:
        t0 = time.perf_counter()
        keys: list[tuple[int, int | None]] = []
        for b in sorted(self.buckets, reverse=True):
            keys.append((b, None))
            keys += [(b, cap) for cap in sorted(self.short_limits.get(b, ()), reverse=True)]
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=len(keys), desc="capturing CUDA graphs", unit="graph", leave=False)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), dense_tune.decode_capture():
            for key in keys:
                b, cap = key
                self.buffers.reset_for_capture(b)
                with dense_tune.tuning():  # the dense projections' cuBLASLt algorithms are timed here
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
        short = "".join(
            f"; batch {b} also with "
            + ", ".join(f"{c} splits up to {n} tokens" for c, n in sorted(lim.items()))
            for b, lim in self.short_limits.items()
        )
        logger.info(
            "captured %d decode CUDA graphs (batch %s%s) in %.1f s",
            len(keys),
            ",".join(map(str, self.buckets)),
            short,
            time.perf_counter() - t0,
        )
        tuned = dense_tune.summary() if dense_tune.enabled() else None
        if tuned:
            logger.info("%s", tuned)

    def key_for(self, bucket: int, context: int | None = None) -> tuple[int, int | None]:
        """The graph that runs ``bucket`` rows whose longest context (tokens in the cache, this
        step's included) is ``context``: the short-context graph of the fewest splits whose limit
        the context fits, else the bucket's graph for any context."""
        limits = self.short_limits.get(bucket)
        if context is not None and limits:
            for cap, longest in sorted(limits.items()):  # fewest splits first
                if context <= longest:
                    return (bucket, cap)
        return (bucket, None)

    def run(self, bucket: int, context: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Replay the graph of ``bucket`` rows at longest context ``context`` (None: the graph for
        any context); returns its static ``(logits, greedy ids)``."""
        key = self.key_for(bucket, context)
        self.graphs[key].replay()
        return self.logits[key], self.greedy[key]
