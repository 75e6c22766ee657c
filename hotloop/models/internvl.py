"""InternVL (transformers' ``InternVLForConditionalGeneration`` layout): InternViT tiles -> pixel
shuffle (2x2 neighbouring patches into one token at ``downsample_ratio=0.5``) -> LayerNorm + MLP
projector -> a Qwen2 / Llama decoder. An image is several tiles (dynamic tiling in
``hotloop.vl.internvl_preprocess``); its tokens are the tiles' tokens in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from hotloop.models.clip import activation
from hotloop.models.intern_vit import InternVisionModel
from hotloop.models.vision_language import VisionLanguageModel


def pixel_shuffle(x: torch.Tensor, ratio: float) -> torch.Tensor:
    """``[B, S, S, C]`` -> ``[B, S*ratio, S*ratio, C/ratio^2]``: each output token stacks the channels
    of a ``1/ratio x 1/ratio`` block, in transformers' InternVL order."""
    B, d1, d2, C = x.shape
    k = round(1 / ratio)
    if d1 % k or d2 % k:
        raise ValueError(f"a {d1}x{d2} feature map cannot be downsampled by {ratio}")
    x = x.reshape(B, d1, d2 // k, C * k).transpose(1, 2)  # fold pairs along dim 2, then swap
    x = x.reshape(B, d2 // k, d1 // k, C * k * k).transpose(1, 2)  # fold pairs along dim 1, swap back
    return x.contiguous()


class InternVLProjector(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, act: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(in_dim, dtype=dtype)
        self.linear_1 = nn.Linear(in_dim, out_dim, dtype=dtype)
        self.act = activation(act)
        self.linear_2 = nn.Linear(out_dim, out_dim, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(self.layer_norm(x))))


class InternVLForConditionalGeneration(VisionLanguageModel):
    def __init__(self, hf_config: Any, dtype: torch.dtype) -> None:
        super().__init__(hf_config, dtype)
        vc = hf_config.vision_config
        layer = hf_config.vision_feature_layer
        if layer != -1:
            raise ValueError(f"InternVL vision_feature_layer={layer!r} is not supported (only -1)")
        self.select_strategy = str(getattr(hf_config, "vision_feature_select_strategy", "default"))
        if self.select_strategy not in ("default", "full"):
            raise ValueError(f"vision_feature_select_strategy={self.select_strategy!r} is not supported")
        self.downsample_ratio = float(hf_config.downsample_ratio)
        self.vision_tower = InternVisionModel(vc, dtype)
        k = round(1 / self.downsample_ratio)
        self.multi_modal_projector = InternVLProjector(
            int(vc.hidden_size) * k * k,
            int(hf_config.text_config.hidden_size),
            str(getattr(hf_config, "projector_hidden_act", "gelu")),
            dtype,
        )

    def encode_tiles(self, tiles: torch.Tensor) -> torch.Tensor:
        """``[N, 3, H, W]`` tiles -> ``[N, tokens_per_tile, hidden]``."""
        feats = self.vision_tower(tiles)
        if self.select_strategy == "default":
            feats = feats[:, 1:]
        side = int(feats.shape[1] ** 0.5)
        feats = pixel_shuffle(feats.reshape(feats.shape[0], side, side, -1), self.downsample_ratio)
        return self.multi_modal_projector(feats.reshape(feats.shape[0], -1, feats.shape[-1]))

    def encode_images(self, pixel_values: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each image's ``[tiles, 3, H, W]`` -> ``[tiles * tokens_per_tile, hidden]``; the tiles of all
        images run through the tower as one batch."""
        device = self.multi_modal_projector.linear_1.weight.device
        tiles = torch.cat([p if p.dim() == 4 else p[None] for p in pixel_values]).to(device)
        feats = self.encode_tiles(tiles)
        counts = [p.shape[0] if p.dim() == 4 else 1 for p in pixel_values]
        return [f.reshape(-1, f.shape[-1]) for f in torch.split(feats, counts)]
