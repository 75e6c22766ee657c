"""Running a turbo model's decoder one block at a time over calibration samples.

The model lives on the CPU; each decoder layer visits the device only while it is processed, so
device memory holds one block plus the calibration activations. Every batch of samples is a
prefill of whole sequences over a scratch KV cache (one block per sequence).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn

from hotloop.layers.attention import AttentionMetadata

# (cos_sin, kv_cache, meta): what a decoder layer needs besides its input
LayerCtx = tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor], AttentionMetadata]


class BlockRunner:
    """Holds the hidden states ``[N * L, hidden]`` entering the current layer, batch by batch."""

    def __init__(
        self, model: nn.Module, samples: torch.Tensor, batch_size: int, device: torch.device
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        self.model: Any = model
        self.device = device
        self.num_samples, self.seqlen = samples.shape
        self.batch_size = batch_size
        decoder: Any = self.model.model
        self.layers: nn.ModuleList = decoder.layers
        decoder.rotary_emb.to(device)
        first: Any = self.layers[0].self_attn
        self._kv_shape: tuple[int, int] = (int(first.num_kv_heads), int(first.head_dim))
        self._ctx: dict[int, LayerCtx] = {}
        embed = decoder.embed_tokens.to(device)
        with torch.no_grad():
            self.hidden = [embed(ids.to(device).flatten()) for ids in samples.split(batch_size)]
        embed.to("cpu")
        self.dtype = self.hidden[0].dtype

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def ctx(self, batch: int) -> LayerCtx:
        """Rotary angles, a scratch KV cache and attention metadata for batch ``batch``."""
        n = self.hidden[batch].shape[0] // self.seqlen
        if n not in self._ctx:
            L, dev = self.seqlen, self.device
            positions = torch.arange(L, device=dev).repeat(n)
            cos_sin = self.model.model.rotary_emb.cos_sin(positions)
            kv = tuple(torch.zeros(n, L, *self._kv_shape, dtype=self.dtype, device=dev) for _ in range(2))
            meta = AttentionMetadata(
                slot_mapping=torch.arange(n * L, device=dev),
                block_tables=torch.arange(n, dtype=torch.int32, device=dev)[:, None],
                query_lens=[L] * n,
                seq_lens=[L] * n,
            )
            self._ctx[n] = (cos_sin, (kv[0], kv[1]), meta)
        return self._ctx[n]

    def batches(self, x: torch.Tensor) -> Iterator[tuple[torch.Tensor, LayerCtx]]:
        """Split a per-token tensor ``[N * L, ...]`` into the runner's batches, with their contexts."""
        for b, chunk in enumerate(x.split(self.batch_size * self.seqlen)):
            yield chunk, self.ctx(b)

    @torch.no_grad()
    def map(self, fn: Callable[[torch.Tensor, LayerCtx], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``fn`` over every batch of ``x`` ``[N * L, in]``, outputs concatenated."""
        return torch.cat([fn(chunk, ctx) for chunk, ctx in self.batches(x)])

    @torch.no_grad()
    def run_layer(self, i: int, capture: Iterable[str] = ()) -> dict[str, torch.Tensor]:
        """Run layer ``i`` (already on the device) over every batch; the hidden states advance.

        Returns the inputs of the submodules named in ``capture`` (paths inside the layer),
        ``[N * L, in]`` each, concatenated over batches.
        """
        layer = self.layers[i]
        seen: dict[str, list[torch.Tensor]] = {name: [] for name in capture}
        hooks = [
            layer.get_submodule(name).register_forward_pre_hook(
                lambda _m, args, name=name: seen[name].append(args[0].detach())
            )
            for name in seen
        ]
        try:
            outs = []
            for b, h in enumerate(self.hidden):
                cos_sin, kv, meta = self.ctx(b)
                mlp_out, residual = layer(h, None, cos_sin, kv, meta)
                outs.append(mlp_out + residual)
        finally:
            for hook in hooks:
                hook.remove()
        self.hidden = outs
        return {name: torch.cat(xs) for name, xs in seen.items()}


def channel_stats(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-input-channel statistics of ``x`` ``[T, in]`` (float32, on the CPU)."""
    a = x.float().abs()
    return {"absmean": a.mean(0).cpu(), "absmax": a.amax(0).cpu()}
