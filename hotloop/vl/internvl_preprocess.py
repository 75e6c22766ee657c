"""InternVL dynamic tiling (what transformers' ``GotOcr2ImageProcessor`` does with ``crop_to_patches``).

The tile grid (columns x rows, ``min_patches <= cols * rows <= max_patches``) is the one whose aspect
ratio is closest to the image's; on a tie the larger grid wins while the image's area exceeds half of
that grid's pixel area. The image is resized to the grid's canvas and cut into tiles row by row; with
more than one tile, a thumbnail (the whole image at tile size) follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from hotloop.vl.clip_preprocess import CLIP_MEAN, CLIP_STD, to_rgb


@dataclass(frozen=True, slots=True)
class TileConfig:
    tile_height: int
    tile_width: int
    min_patches: int = 1
    max_patches: int = 12
    crop_to_patches: bool = True
    use_thumbnail: bool = True
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = 3
    do_rescale: bool = True
    do_normalize: bool = True

    @classmethod
    def from_dict(cls, d: dict[str, Any], crop_to_patches: bool = True) -> TileConfig:
        size = d.get("size") or {"height": 384, "width": 384}
        return cls(
            tile_height=int(size["height"]),
            tile_width=int(size["width"]),
            min_patches=int(d.get("min_patches", 1)),
            max_patches=int(d.get("max_patches", 12)),
            crop_to_patches=crop_to_patches,
            image_mean=tuple(d.get("image_mean") or CLIP_MEAN),
            image_std=tuple(d.get("image_std") or CLIP_STD),
            rescale_factor=float(d.get("rescale_factor", 1 / 255)),
            resample=int(d.get("resample", 3)),
            do_rescale=bool(d.get("do_rescale", True)),
            do_normalize=bool(d.get("do_normalize", True)),
        )


@lru_cache(maxsize=32)
def tile_grids(min_tiles: int, max_tiles: int) -> tuple[tuple[int, int], ...]:
    """(columns, rows) with ``min_tiles <= columns * rows <= max_tiles``, fewest tiles first."""
    grids = [
        (c, r)
        for c in range(1, max_tiles + 1)
        for r in range(1, max_tiles + 1)
        if min_tiles <= c * r <= max_tiles
    ]
    return tuple(sorted(grids, key=lambda g: g[0] * g[1]))


def best_grid(width: int, height: int, cfg: TileConfig) -> tuple[int, int]:
    aspect = width / height
    best, best_diff = (1, 1), float("inf")
    for cols, rows in tile_grids(cfg.min_patches, cfg.max_patches):
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and width * height > 0.5 * cfg.tile_height * cfg.tile_width * cols * rows:
            best = (cols, rows)
    return best


def _normalise(arr: np.ndarray, cfg: TileConfig) -> np.ndarray:
    out = arr.astype(np.float32)
    if cfg.do_rescale:
        out = (arr.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    if cfg.do_normalize:
        mean = np.asarray(cfg.image_mean, dtype=np.float32)
        std = np.asarray(cfg.image_std, dtype=np.float32)
        out = ((out - mean) / std).astype(np.float32)
    return out.transpose(2, 0, 1)


def preprocess_tiles(image: Any, cfg: TileConfig) -> torch.Tensor:
    """One ``PIL.Image`` -> float32 ``[tiles, 3, tile_height, tile_width]``."""
    image = to_rgb(image)
    th, tw = cfg.tile_height, cfg.tile_width
    if not cfg.crop_to_patches or cfg.max_patches <= 1:
        tiles = [np.asarray(image.resize((tw, th), resample=cfg.resample, reducing_gap=None))]
    else:
        cols, rows = best_grid(image.width, image.height, cfg)
        canvas = np.asarray(image.resize((tw * cols, th * rows), resample=cfg.resample, reducing_gap=None))
        tiles = [
            canvas[r * th : (r + 1) * th, c * tw : (c + 1) * tw] for r in range(rows) for c in range(cols)
        ]
        if cfg.use_thumbnail and len(tiles) > 1:
            tiles.append(np.asarray(image.resize((tw, th), resample=cfg.resample, reducing_gap=None)))
    return torch.from_numpy(np.ascontiguousarray(np.stack([_normalise(t, cfg) for t in tiles])))
