"""LLaVA-NeXT / LLaVA-1.6 (llava-hf layout): LLaVA's CLIP tower and projector on "anyres" tiles.

The processor (``hotloop/vl/llava_next_preprocess.py``) gives each image a base tile (the whole
image squashed) and a ``rows x cols`` grid of tiles that cover it at a higher resolution. Every tile
goes through the CLIP tower and the projector (all tiles of all images in one batch). The grid's
features are laid out as one map, cut to the image's aspect ratio ("unpad"), and each of its rows
ends with the learned ``image_newline``; the base tile's features come first. The token count is the
processor's (``num_image_tokens``), which transformers' ``LlavaNextProcessor`` gives too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from hotloop.models.llava import LlavaForConditionalGeneration
from hotloop.vl.llava_next_preprocess import DEFAULT_PINPOINTS, IMAGE_SIZE_KEY, anyres_grid, unpad_bounds


class LlavaNextForConditionalGeneration(LlavaForConditionalGeneration):
    # merge.encode passes each image's ``extra`` (its original size) to ``encode_images``
    encode_images_takes_extra = True

    def __init__(self, hf_config: Any, dtype: torch.dtype) -> None:
        super().__init__(hf_config, dtype)
        if self.select_strategy != "default":
            raise ValueError("LLaVA-NeXT supports only vision_feature_select_strategy='default'")
        vc = hf_config.vision_config
        self.tile = int(vc.image_size)
        self.side = self.tile // int(vc.patch_size)
        pinpoints = getattr(hf_config, "image_grid_pinpoints", None) or DEFAULT_PINPOINTS
        self.grid_pinpoints = [(int(h), int(w)) for h, w in pinpoints]
        hidden = int(hf_config.text_config.hidden_size)
        self.image_newline = nn.Parameter(torch.empty(hidden, dtype=dtype), requires_grad=False)

    def encode_images(
        self, pixel_values: Sequence[torch.Tensor], extras: Sequence[dict[str, Any]] | None = None
    ) -> list[torch.Tensor]:
        """Each image's ``[1 + rows * cols, 3, tile, tile]`` tiles and its ``extra`` (with the
        original ``image_size``) -> its ``[num_image_tokens, hidden]`` embeddings."""
        if extras is None or len(extras) != len(pixel_values):
            raise ValueError("LLaVA-NeXT needs each image's extra['image_size'] to place its features")
        if not pixel_values:
            return []
        device = self.image_newline.device
        tiles = torch.cat([p.to(device) for p in pixel_values])
        feats = self.project_patches(tiles)  # [all tiles, side * side, hidden]
        counts = [int(p.shape[0]) for p in pixel_values]
        return [
            self.pack(f, extra[IMAGE_SIZE_KEY])
            for f, extra in zip(torch.split(feats, counts), extras, strict=True)
        ]

    def pack(self, feats: torch.Tensor, image_size: Sequence[int]) -> torch.Tensor:
        """One image's ``[1 + rows * cols, side * side, hidden]`` tile features -> the base tile's
        features, then the unpadded grid's rows, each followed by ``image_newline``."""
        height, width = int(image_size[0]), int(image_size[1])
        rows, cols = anyres_grid(height, width, self.grid_pinpoints, self.tile)
        side, hidden = self.side, feats.shape[-1]
        if feats.shape[0] != 1 + rows * cols:
            raise ValueError(f"a {height}x{width} image needs 1 + {rows}x{cols} tiles, got {feats.shape[0]}")
        grid = feats[1:].view(rows, cols, side, side, hidden).permute(0, 2, 1, 3, 4)
        grid = grid.reshape(rows * side, cols * side, hidden)
        top, bottom, left, right = unpad_bounds(height, width, rows * side, cols * side)
        grid = grid[top:bottom, left:right]
        newline = self.image_newline.to(grid.dtype).expand(grid.shape[0], 1, hidden)
        grid = torch.cat([grid, newline], dim=1).reshape(-1, hidden)
        return torch.cat([feats[0], grid])
