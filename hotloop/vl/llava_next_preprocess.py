"""LLaVA-NeXT ("anyres") preprocessing and geometry, as transformers' ``LlavaNextImageProcessor`` and
``LlavaNextProcessor`` do it (PIL + numpy).

An image of (height, width) picks the best resolution among ``image_grid_pinpoints`` (most of the
image kept, least padding), is resized into it keeping its aspect ratio (bicubic), centred on a
black canvas of that resolution and cut into crop-size tiles (row-major). In front goes the whole
image squashed to the base size. Every tile then goes through the CLIP steps (shortest-edge resize,
centre crop, rescale, normalise): the result is ``[1 + rows * cols, 3, crop, crop]``.

The model turns each tile into ``side * side`` features (``side`` = crop / ViT patch), lays the
grid's features out as a ``rows * side`` by ``cols * side`` map, cuts off the rows (or columns) that
only saw padding ("unpad") and ends every row with a learned newline; the base tile's features come
first. ``num_image_tokens`` counts them; the model uses the same helpers, so both always agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hotloop.vl.clip_preprocess import ClipImageConfig, preprocess_clip, to_rgb

# transformers' default (llava-v1.6 at 336 pixels)
DEFAULT_PINPOINTS = ((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008))

Resolution = tuple[int, int]  # (height, width)
# ImageInput.extra key: the image's (height, width), which the encoder needs to unpad its features
IMAGE_SIZE_KEY = "image_size"


def select_best_resolution(height: int, width: int, resolutions: Sequence[Sequence[int]]) -> Resolution:
    """The (height, width) among ``resolutions`` that keeps the most of the image after an
    aspect-preserving downscale into it, then wastes the fewest pixels (the first such wins)."""
    best: Resolution | None = None
    max_effective, min_wasted = 0, math.inf
    for h, w in resolutions:
        scale = min(w / width, h / height)
        down_w, down_h = int(width * scale), int(height * scale)
        effective = min(down_w * down_h, width * height)
        wasted = w * h - effective
        if effective > max_effective or (effective == max_effective and wasted < min_wasted):
            max_effective, min_wasted, best = effective, wasted, (int(h), int(w))
    if best is None:
        raise ValueError(f"no usable resolution among image_grid_pinpoints={list(resolutions)}")
    return best


def fit_size(height: int, width: int, target: Resolution) -> Resolution:
    """(height, width) of the image resized into ``target`` keeping its aspect ratio."""
    target_h, target_w = target
    scale_w, scale_h = target_w / width, target_h / height
    if scale_w < scale_h:
        return min(math.ceil(height * scale_w), target_h), target_w
    return target_h, min(math.ceil(width * scale_h), target_w)


def anyres_grid(height: int, width: int, resolutions: Sequence[Sequence[int]], tile: int) -> Resolution:
    """(rows, cols) of crop-size tiles an image of (height, width) is cut into."""
    best_h, best_w = select_best_resolution(height, width, resolutions)
    return best_h // tile, best_w // tile


def unpad_bounds(height: int, width: int, grid_h: int, grid_w: int) -> tuple[int, int, int, int]:
    """(top, bottom, left, right): the part of a ``grid_h x grid_w`` feature map that covers an
    image of (height, width) (the rest saw only the padding around it)."""
    if width / height > grid_w / grid_h:
        new_h = int(round(height * (grid_w / width), 7))
        pad = (grid_h - new_h) // 2
        return pad, grid_h - pad, 0, grid_w
    new_w = int(round(width * (grid_h / height), 7))
    pad = (grid_w - new_w) // 2
    return 0, grid_h, pad, grid_w - pad


def num_image_tokens(
    height: int, width: int, resolutions: Sequence[Sequence[int]], tile: int, side: int, base_tokens: int
) -> int:
    """Tokens of one image: the base tile's ``base_tokens``, then each kept row of the unpadded grid
    plus its newline."""
    rows, cols = anyres_grid(height, width, resolutions, tile)
    top, bottom, left, right = unpad_bounds(height, width, rows * side, cols * side)
    return base_tokens + (bottom - top) * (right - left + 1)


@dataclass(frozen=True, slots=True)
class LlavaNextImageConfig:
    """A ``LlavaNextImageProcessor`` config: the CLIP steps every tile goes through, plus the grid."""

    clip: ClipImageConfig
    grid_pinpoints: tuple[Resolution, ...] = DEFAULT_PINPOINTS

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LlavaNextImageConfig:
        pinpoints = d.get("image_grid_pinpoints") or DEFAULT_PINPOINTS
        cfg = cls(ClipImageConfig.from_dict(d), tuple((int(h), int(w)) for h, w in pinpoints))
        tile = cfg.tile_size
        if any(h % tile or w % tile for h, w in cfg.grid_pinpoints):
            raise ValueError(
                f"image_grid_pinpoints {[list(p) for p in cfg.grid_pinpoints]} are not multiples of "
                f"the {tile}-pixel tile"
            )
        return cfg

    @property
    def tile_size(self) -> int:
        """The side of the tiles the grid is cut into (transformers' ``patch_size``)."""
        crop, size = self.clip.crop_size, self.clip.size
        if crop and crop.get("height"):
            return int(crop["height"])
        if size.get("height"):
            return int(size["height"])
        return int(size["shortest_edge"])

    @property
    def base_size(self) -> Resolution:
        """(height, width) the whole image is squashed to for the base tile."""
        size = self.clip.size
        if size.get("height") and size.get("width"):
            return int(size["height"]), int(size["width"])
        return int(size["shortest_edge"]), int(size["shortest_edge"])


def preprocess_llava_next(image: Any, cfg: LlavaNextImageConfig) -> tuple[torch.Tensor, Resolution]:
    """One ``PIL.Image`` -> (float32 ``[1 + rows * cols, 3, crop, crop]``, its (height, width))."""
    from PIL import Image

    if cfg.clip.do_convert_rgb:
        image = to_rgb(image)
    height, width = image.height, image.width
    best = select_best_resolution(height, width, cfg.grid_pinpoints)
    new_h, new_w = fit_size(height, width, best)
    resample = cfg.clip.resample
    fitted = np.asarray(image.resize((new_w, new_h), resample=resample, reducing_gap=None))
    squeeze = fitted.ndim == 2
    if squeeze:
        fitted = fitted[:, :, None]
    top, left = (best[0] - new_h) // 2, (best[1] - new_w) // 2
    canvas = np.zeros((best[0], best[1], fitted.shape[2]), dtype=fitted.dtype)
    canvas[top : top + new_h, left : left + new_w] = fitted

    base_h, base_w = cfg.base_size
    tiles = [image.resize((base_w, base_h), resample=resample, reducing_gap=None)]
    tile = cfg.tile_size
    for y in range(0, best[0], tile):
        for x in range(0, best[1], tile):
            piece = np.ascontiguousarray(canvas[y : y + tile, x : x + tile])
            tiles.append(Image.fromarray(piece[:, :, 0] if squeeze else piece))
    return torch.stack([preprocess_clip(t, cfg.clip) for t in tiles]), (height, width)
