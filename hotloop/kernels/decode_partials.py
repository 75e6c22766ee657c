"""``DecodePartials``: split-KV decode attention results that the next launch merges (no Triton here,
so the CPU path can name the type without importing the kernels)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DecodePartials:
    """Split-KV results not merged yet (``paged_decode_attention_deferred``): ``part [B, H, S, D]``
    float32, each split's normalised output, and ``lse [B, H, S]`` float32, its base-2 log-sum-exp
    of the scaled scores (``-inf`` for an empty split). ``reference.merge_splits`` merges them;
    ``dense_gemv.dense_gemv_merge`` merges them inside the next projection."""

    part: torch.Tensor
    lse: torch.Tensor
    dtype: torch.dtype  # the merged output's dtype (q's)

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(B, H, D)``: the merged output's shape."""
        b, h, _s, d = self.part.shape
        return b, h, d
