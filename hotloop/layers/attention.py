"""Attention over the paged KV cache, and the metadata that describes one mixed batch.

The executor builds one ``AttentionMetadata`` per step and passes it into ``model.forward``
explicitly (no globals). The batch is the new tokens of every scheduled sequence laid back to
back: a prefill chunk contributes many tokens, a decode one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from hotloop.kernels import ops, reference
from hotloop.layers.rotary import apply_rotary

if TYPE_CHECKING:  # (the modules import Triton: the CPU path must not)
    from hotloop.kernels.kv_int8_decode_cuda import FusedWrite
    from hotloop.kernels.paged_decode_attention import DecodeResult

# A quantized cache's prefill reads the prompt's own keys unquantized (paged_prefill_attention's
# k_new / v_new). HOTLOOP_KV_FRESH_PREFILL=0 reads them back from the cache instead, as before, for
# comparisons (GPU path only; the CPU reference always takes this step's own keys).
FRESH_PREFILL = os.environ.get("HOTLOOP_KV_FRESH_PREFILL", "1") != "0"


@dataclass
class AttentionMetadata:
    """Per-step description of the batch (built by the executor's input preparation).

    slot_mapping: ``[T]`` int64, flat KV slot where each new token's K/V is written.
    block_tables: ``[B, max_blocks]`` int32, each sequence's block ids (padded with 0).
    query_lens / seq_lens: host lists, per sequence: new tokens this step / tokens in the cache
    after this step (cached prefix + new).

    The GPU kernels read the same facts from device tensors, so a captured CUDA graph needs no host
    values: ``seq_lens_t`` ``[B]`` int32, ``query_start_t`` ``[B + 1]`` int32 (cumulative query
    lengths), ``max_query_len`` (sizes the prefill grid) and ``decode_only`` (every query_len is 1).
    Padding rows of a graph have ``seq_len`` 0 and slot -1. Without the tensors the torch
    reference runs.

    A mixed step (the scheduler puts single-token rows first) has ``num_decodes`` leading rows that
    the decode kernel serves (one KV read per GQA group, split-KV), and the rest go to the prefill
    kernel with ``prefill_query_start_t`` (``query_start_t[num_decodes:] - num_decodes``).
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    query_lens: list[int]
    seq_lens: list[int]
    seq_lens_t: torch.Tensor | None = None
    query_start_t: torch.Tensor | None = None
    max_query_len: int = 0
    decode_only: bool = False
    num_decodes: int = 0
    prefill_query_start_t: torch.Tensor | None = None
    # a decode CUDA graph's metadata (captured at start): its decode kernel takes ``decode_plan``'s
    # split count and merge; eager and piecewise steps keep ``num_decode_splits`` and a merge launch
    # (the variants the warm-up compiled, and the launches the piecewise graphs replay)
    graph: bool = False
    # a decode graph captured for short contexts caps ``decode_plan``'s splits (``DecodeGraphs``)
    graph_max_splits: int | None = None

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


def _any_cached_prefix(query_lens: list[int], seq_lens: list[int]) -> bool:
    """Whether a prefill launch's rows read anything from the cache: a row with a cached prefix, or a
    single-token row (``paged_prefill_attention``'s ``cached_prefix``). Padding rows (no queries) read
    nothing."""
    return any(q == 1 or (q > 1 and s > q) for q, s in zip(query_lens, seq_lens, strict=True))


class PagedAttention(nn.Module):
    """Writes this step's K/V into the layer's cache, then attends over each sequence's context."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        sliding_window: int | None = None,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.sliding_window = sliding_window

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """q ``[T, H*D]``, k/v ``[T, KV*D]`` -> ``[T, H*D]`` (written into ``out`` when given).

        With ``cos_sin`` (``[T, rot / 2]`` float32 each) q and k are rotated here first (fused with
        the cache write on the GPU); without it they arrive rotated.
        """
        T = q.shape[0]
        # CUDA with device metadata: the Triton kernels, for a float or a quantized (uint8) cache alike.
        if ops.use_triton(q) and meta.seq_lens_t is not None:
            return self._forward_triton(q, k, v, kv_cache, meta, cos_sin, out)
        if out is not None:
            out.copy_(self.forward(q, k, v, kv_cache, meta, cos_sin))
            return out
        if cos_sin is not None:
            q = apply_rotary(q, cos_sin[0], cos_sin[1], self.head_dim)
            k = apply_rotary(k, cos_sin[0], cos_sin[1], self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        reference.write_kv_cache(k, v, kv_cache[0], kv_cache[1], meta.slot_mapping)
        # (no device metadata here: the reference, with this step's own keys unquantized as on the GPU)
        return self.attend(q, kv_cache, meta, (k, v) if kv_cache[0].dtype == torch.uint8 else None)

    def attend(
        self,
        q: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        fresh_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Attention of ``q [T, H*D]``, already rotated, over caches that already hold this step's
        K/V (written by ``QKVLinear.forward_rope``). On CUDA a decode-only batch (the decode
        kernel); elsewhere the reference. ``fresh_kv``: this step's k / v ``[T, KV, D]`` (rotated),
        which a sequence of more than one new token reads for its own keys instead of the cache
        (``paged_prefill_attention``'s ``k_new`` / ``v_new``)."""
        T = q.shape[0]
        qv = q.view(T, self.num_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        if ops.use_triton(q) and meta.seq_lens_t is not None:
            if not meta.decode_only:
                raise ValueError("PagedAttention.attend on CUDA serves decode-only batches")
            o = self._decode(qv, kv_cache, meta, torch.empty_like(qv))
        else:
            o = reference.paged_attention(
                qv,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.query_lens,
                meta.seq_lens,
                self.scale,
                self.sliding_window,
                *(fresh_kv or (None, None)),
            )
        return o.reshape(T, self.num_heads * self.head_dim)

    def attend_unmerged(
        self, q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata
    ) -> DecodeResult | None:
        """``attend`` for a consumer that merges the decode splits as it reads them
        (``Linear.forward_merged``): on CUDA, a decode-only batch whose partials are at most
        ``ops.ONE_ROW_MERGE_MAX_BYTES`` a row and an attention row of at most
        ``ops.ONE_ROW_MERGE_MAX_K`` elements, the decode launch's result with the splits unmerged
        (``part`` None: one split, the output is in ``out``; larger partials are merged here). None
        where ``attend`` must run instead (not on CUDA with device metadata, or a wider row)."""
        if not (
            ops.use_triton(q)
            and meta.seq_lens_t is not None
            and meta.decode_only
            and self.num_heads * self.head_dim <= ops.ONE_ROW_MERGE_MAX_K
        ):
            return None
        from hotloop.kernels.paged_decode_attention import (
            DecodeResult,
            decode_attention_partials,
            merge_partials,
        )

        T = q.shape[0]
        qv = q.view(T, self.num_heads, self.head_dim)
        res = decode_attention_partials(
            qv, kv_cache[0], kv_cache[1], meta.block_tables, meta.seq_lens_t, self.scale,
            self.sliding_window, out=torch.empty_like(qv), graph_plan=meta.graph,
            max_splits=meta.graph_max_splits,
        )  # fmt: skip
        if res.part is not None and res.part[0].numel() * 4 > ops.ONE_ROW_MERGE_MAX_BYTES:
            return DecodeResult(merge_partials(res))
        return res

    def writes_in_decode(
        self, kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata, dtype: torch.dtype
    ) -> bool:
        """Whether this step's decode launches should write the step's K/V themselves
        (``attend_staged``): a decode-only batch on the GPU path over a quantized cache at head dim
        128 (``dtype``: the model's), where ``HOTLOOP_KV_CUDA_FUSED_WRITE=1`` (the decode kernel
        writes) or, by default, the split merge writes (``decode_merge_write.py``, an int8 cache
        without a sliding window; ``HOTLOOP_KV_MERGE_WRITE=0`` turns it off). Where the CUDA kernel
        then cannot take the launch, the write runs as its own launch first."""
        if kv_cache[0].dtype != torch.uint8 or not meta.decode_only or meta.seq_lens_t is None:
            return False
        if not kv_cache[0].is_cuda or self.head_dim != 128:
            return False
        from hotloop.kernels import decode_merge_write, kv_int8_decode_cuda

        if kv_int8_decode_cuda.fused_write_enabled():
            return True
        return decode_merge_write.applies(kv_cache[0], self.head_dim, dtype, self.sliding_window)

    def attend_staged(
        self,
        q: torch.Tensor,
        kv: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """Decode attention of ``q [T, H*D]`` (rotated) where this step's ``kv [T, 2 KV, D]`` (k
        rotated, then v; ``QKVLinear.forward_rope_staged``) is not yet in the int8 cache: the
        decode kernel, or the split merge after it, quantizes and writes it (``writes_in_decode``
        said so)."""
        from hotloop.kernels import kv_int8_decode_cuda
        from hotloop.kernels.kv_int8_decode_cuda import FusedWrite

        T = q.shape[0]
        qv = q.view(T, self.num_heads, self.head_dim)
        kv_h = self.num_kv_heads
        if not kv_int8_decode_cuda.fused_write_enabled():  # the merge writes (decode_merge_write)
            from hotloop.kernels.decode_merge_write import decode_with_merge_write

            assert meta.seq_lens_t is not None
            o = decode_with_merge_write(
                qv, kv, kv_cache[0], kv_cache[1], meta.block_tables, meta.seq_lens_t, meta.slot_mapping,
                self.scale, torch.empty_like(qv), graph_plan=meta.graph, max_splits=meta.graph_max_splits,
                sliding_window=self.sliding_window,
            )  # fmt: skip
            return o.reshape(T, self.num_heads * self.head_dim)
        write = FusedWrite(
            kv[:, :kv_h], kv[:, kv_h:], cos_sin[0], cos_sin[1], meta.slot_mapping, rotated=True
        )
        o = self._decode(qv, kv_cache, meta, torch.empty_like(qv), write)
        return o.reshape(T, self.num_heads * self.head_dim)

    def _decode(
        self,
        q: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        out: torch.Tensor,
        write: FusedWrite | None = None,
    ) -> torch.Tensor:
        """The decode kernel over a decode-only batch, into ``out``; a decode graph's metadata
        (``meta.graph``) takes ``decode_plan``'s split count and merge. ``write``: q unrotated and
        this step's k / v not yet in the cache (``paged_decode_attention``'s ``write_kv``)."""
        from hotloop.kernels.paged_decode_attention import paged_decode_attention

        assert meta.seq_lens_t is not None
        return paged_decode_attention(
            q,
            kv_cache[0],
            kv_cache[1],
            meta.block_tables,
            meta.seq_lens_t,
            self.scale,
            self.sliding_window,
            out=out,
            graph_plan=meta.graph,
            write_kv=write,
            max_splits=meta.graph_max_splits,
        )

    def _forward_triton(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        cos_sin: tuple[torch.Tensor, torch.Tensor] | None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        from hotloop.kernels import kv_int8_decode_cuda
        from hotloop.kernels.paged_decode_attention import paged_decode_attention
        from hotloop.kernels.paged_prefill_attention import paged_prefill_attention
        from hotloop.kernels.rotary_kv_write import rotary_kv_write

        T = q.shape[0]
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        if cos_sin is None:  # already rotated: a zero-angle rotation is a plain cache write
            half = self.head_dim // 2
            cos_sin = (q.new_ones(T, half, dtype=torch.float32), q.new_zeros(T, half, dtype=torch.float32))
        # q is rotated in place: it is a view of this layer's projection output, read by nobody else.
        # A uint8 cache is quantized in the same pass; the attention kernels dequantize as they read.
        # Its prefill rows read their own keys unquantized (k rotated in place for that), their
        # cached prefix from the cache (paged_prefill_attention).
        fresh = FRESH_PREFILL and k_cache.dtype == torch.uint8 and not meta.decode_only
        # HOTLOOP_KV_CUDA_FUSED_WRITE=1: a decode-only batch over an int8 cache hands the rotation
        # and the write to the CUDA decode kernel (paged_decode_attention's write_kv), one launch less
        write = None
        if (
            meta.decode_only
            and k_cache.dtype == torch.uint8
            and kv_int8_decode_cuda.fused_write_enabled()
            and 2 * cos_sin[0].shape[-1] == self.head_dim
        ):
            write = kv_int8_decode_cuda.FusedWrite(k, v, cos_sin[0], cos_sin[1], meta.slot_mapping)
        else:
            rotary_kv_write(
                q, k, v, cos_sin[0], cos_sin[1], k_cache, v_cache, meta.slot_mapping, rotate_k=fresh
            )
        assert meta.seq_lens_t is not None
        o = torch.empty_like(q) if out is None else out.view(T, self.num_heads, self.head_dim)
        if meta.decode_only:
            self._decode(q, kv_cache, meta, o, write)
        elif meta.num_decodes and meta.prefill_query_start_t is not None:
            nd = meta.num_decodes
            paged_decode_attention(
                q[:nd],
                k_cache,
                v_cache,
                meta.block_tables[:nd],
                meta.seq_lens_t[:nd],
                self.scale,
                self.sliding_window,
                out=o[:nd],
            )
            paged_prefill_attention(
                q[nd:],
                k_cache,
                v_cache,
                meta.block_tables[nd:],
                meta.seq_lens_t[nd:],
                meta.prefill_query_start_t,
                meta.max_query_len,
                self.scale,
                self.sliding_window,
                out=o[nd:],
                k_new=k[nd:] if fresh else None,
                v_new=v[nd:] if fresh else None,
                cached_prefix=not fresh or _any_cached_prefix(meta.query_lens[nd:], meta.seq_lens[nd:]),
            )
        else:
            assert meta.query_start_t is not None
            paged_prefill_attention(
                q,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens_t,
                meta.query_start_t,
                meta.max_query_len,
                self.scale,
                self.sliding_window,
                out=o,
                k_new=k if fresh else None,
                v_new=v if fresh else None,
                cached_prefix=not fresh or _any_cached_prefix(meta.query_lens, meta.seq_lens),
            )
        return o.reshape(T, self.num_heads * self.head_dim)
