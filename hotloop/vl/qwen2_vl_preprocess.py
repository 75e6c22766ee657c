"""Qwen2-VL / Qwen2.5-VL image preprocessing (what transformers' ``Qwen2VLImageProcessor`` does).

RGB -> ``smart_resize`` (both sides multiples of ``patch_size * merge_size``, the area within
``[min_pixels, max_pixels]``, the aspect ratio kept as well as that allows; bicubic) -> ``* rescale_factor``
-> normalise -> cut into ``patch x patch`` patches, each repeated ``temporal_patch_size`` times (a still
image is a one-step video) and flattened as ``(channel, temporal, row, column)``. The patches are
ordered merge block by merge block (``merge x merge`` patches each), which is the order the vision
tower's patch merger reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from hotloop.vl.clip_preprocess import CLIP_MEAN, CLIP_STD, to_rgb

MAX_ASPECT_RATIO = 200
DEFAULT_MIN_PIXELS = 56 * 56  # transformers' defaults
DEFAULT_MAX_PIXELS = 28 * 28 * 1280


class ImageShapeError(ValueError):
    """The image cannot be resized for the vision tower (e.g. too extreme an aspect ratio)."""


@dataclass(frozen=True, slots=True)
class Qwen2VLImageConfig:
    """The fields of a Qwen2-VL image processor config that change the patches."""

    min_pixels: int = DEFAULT_MIN_PIXELS
    max_pixels: int = DEFAULT_MAX_PIXELS
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = 3  # PIL bicubic
    do_resize: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Qwen2VLImageConfig:
        """From ``preprocessor_config.json``: ``min_pixels`` / ``max_pixels`` (older saves) win over
        ``size.shortest_edge`` / ``size.longest_edge``, as in transformers."""
        size = d.get("size") or {}
        min_pixels = d.get("min_pixels") or size.get("shortest_edge") or size.get("min_pixels")
        max_pixels = d.get("max_pixels") or size.get("longest_edge") or size.get("max_pixels")
        return cls(
            min_pixels=int(min_pixels or DEFAULT_MIN_PIXELS),
            max_pixels=int(max_pixels or DEFAULT_MAX_PIXELS),
            patch_size=int(d.get("patch_size", 14)),
            temporal_patch_size=int(d.get("temporal_patch_size", 2)),
            merge_size=int(d.get("merge_size", 2)),
            image_mean=tuple(d.get("image_mean") or CLIP_MEAN),
            image_std=tuple(d.get("image_std") or CLIP_STD),
            rescale_factor=float(d.get("rescale_factor", 1 / 255)),
            resample=int(d.get("resample", 3)),
            do_resize=bool(d.get("do_resize", True)),
            do_rescale=bool(d.get("do_rescale", True)),
            do_normalize=bool(d.get("do_normalize", True)),
            do_convert_rgb=bool(d.get("do_convert_rgb", True)),
        )

    @property
    def factor(self) -> int:
        """Both sides of a resized image are multiples of this (one merge block)."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) rounded to multiples of ``factor``, then scaled (keeping the aspect ratio)
    into ``[min_pixels, max_pixels]`` where rounding left the area outside it."""
    if min(height, width) <= 0 or max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ImageShapeError(
            f"an image of {width}x{height} pixels has an aspect ratio above {MAX_ASPECT_RATIO}"
        )
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / scale / factor) * factor)
        w = max(factor, math.floor(width / scale / factor) * factor)
    elif h * w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * scale / factor) * factor
        w = math.ceil(width * scale / factor) * factor
    return h, w


def _normalise(arr: np.ndarray, cfg: Qwen2VLImageConfig) -> np.ndarray:
    """``[H, W, C]`` uint8 -> float32, rescaled (in float64, as transformers) and normalised."""
    out = arr.astype(np.float32)
    if cfg.do_rescale:
        out = (arr.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    if cfg.do_normalize:
        mean = np.asarray(cfg.image_mean, dtype=np.float32)
        std = np.asarray(cfg.image_std, dtype=np.float32)
        out = ((out - mean) / std).astype(np.float32)
    return out


def patchify(arr: np.ndarray, cfg: Qwen2VLImageConfig) -> np.ndarray:
    """``[H, W, C]`` float32 -> ``[1, H/f, W/f, merge^2, C * temporal * patch^2]`` (``f`` = factor):
    merge blocks row by row, the patches of a block row by row, each patch flattened as
    ``(channel, temporal, row, column)``."""
    H, W, C = arr.shape
    p, m, tp = cfg.patch_size, cfg.merge_size, cfg.temporal_patch_size
    if H % cfg.factor or W % cfg.factor:
        raise ImageShapeError(f"a {W}x{H} image is not a whole number of {cfg.factor}-pixel merge blocks")
    x = arr.reshape(H // (m * p), m, p, W // (m * p), m, p, C)
    x = x.transpose(0, 3, 1, 4, 6, 2, 5)  # [H', W', mh, mw, C, ph, pw]
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], tp, p, p))  # the same frame tp times
    return x.reshape(1, H // (m * p), W // (m * p), m * m, C * tp * p * p)


def preprocess_qwen2_vl(image: Any, cfg: Qwen2VLImageConfig) -> torch.Tensor:
    """One ``PIL.Image`` -> float32 patches ``[1, h', w', merge^2, patch_dim]``; the grid of merged
    tokens is ``1 x h' x w'``, and transformers' ``image_grid_thw`` is ``(1, h' * merge, w' * merge)``."""
    if cfg.do_convert_rgb:
        image = to_rgb(image)
    if cfg.do_resize:
        h, w = smart_resize(image.height, image.width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
        image = image.resize((w, h), resample=cfg.resample, reducing_gap=None)
    arr = np.asarray(image)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.shape[2] != 3:
        raise ImageShapeError(f"an image with {arr.shape[2]} channels; the vision tower takes 3")
    return torch.from_numpy(np.ascontiguousarray(patchify(_normalise(arr, cfg), cfg)))
