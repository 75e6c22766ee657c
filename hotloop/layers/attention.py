"""Attention over the paged KV cache, and the metadata that describes one mixed batch.

The executor builds one ``AttentionMetadata`` per step and passes it into ``model.forward``
explicitly (no globals). The batch is the new tokens of every scheduled sequence laid back to
back: a prefill chunk contributes many tokens, a decode one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hotloop.kernels import reference


@dataclass
class AttentionMetadata:
    """Per-step description of the batch (built by the executor's input preparation).

    slot_mapping: ``[T]`` int64, flat KV slot where each new token's K/V is written.
    block_tables: ``[B, max_blocks]`` int32, each sequence's block ids (padded with 0).
    query_lens / seq_lens: host lists, per sequence: new tokens this step / tokens in the cache
    after this step (cached prefix + new).
    """

    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    query_lens: list[int]
    seq_lens: list[int]

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)


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
    ) -> torch.Tensor:
        """q ``[T, H*D]``, k/v ``[T, KV*D]`` -> ``[T, H*D]``."""
        T = q.shape[0]
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        k_cache, v_cache = kv_cache
        reference.write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        o = reference.paged_attention(
            q,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.query_lens,
            meta.seq_lens,
            self.scale,
            self.sliding_window,
        )
        return o.reshape(T, self.num_heads * self.head_dim)
