"""CLIP-style image preprocessing (what transformers' ``CLIPImageProcessor`` does, with PIL + numpy).

RGB (alpha composited over white) -> resize so the shortest edge is ``shortest_edge`` (bicubic)
-> center crop (zero-padded if the image is smaller) -> ``* rescale_factor`` -> normalise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True, slots=True)
class ClipImageConfig:
    """The fields of a CLIP image processor config that change the pixels."""

    size: dict[str, int]
    crop_size: dict[str, int] | None
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD
    rescale_factor: float = 1 / 255
    resample: int = 3  # PIL bicubic
    do_resize: bool = True
    do_center_crop: bool = True
    do_rescale: bool = True
    do_normalize: bool = True
    do_convert_rgb: bool = True

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClipImageConfig:
        size = d.get("size", {"shortest_edge": 224})
        if isinstance(size, int):
            size = {"shortest_edge": size}
        crop = d.get("crop_size", {"height": 224, "width": 224})
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        return cls(
            size=dict(size),
            crop_size=dict(crop) if crop else None,
            image_mean=tuple(d.get("image_mean") or CLIP_MEAN),
            image_std=tuple(d.get("image_std") or CLIP_STD),
            rescale_factor=float(d.get("rescale_factor", 1 / 255)),
            resample=int(d.get("resample", 3)),
            do_resize=bool(d.get("do_resize", True)),
            do_center_crop=bool(d.get("do_center_crop", True)),
            do_rescale=bool(d.get("do_rescale", True)),
            do_normalize=bool(d.get("do_normalize", True)),
            do_convert_rgb=bool(d.get("do_convert_rgb", True)),
        )

    @property
    def output_size(self) -> tuple[int, int]:
        """(height, width) of the processed image when it does not depend on the input."""
        if self.do_center_crop and self.crop_size:
            return self.crop_size["height"], self.crop_size["width"]
        if "height" in self.size:
            return self.size["height"], self.size["width"]
        raise ValueError("the output size depends on the image (no crop and a shortest_edge resize)")


def to_rgb(image: Any) -> Any:
    """RGB ``PIL.Image``; transparent pixels become white, as transformers does."""
    from PIL import Image

    if image.mode == "RGB":
        return image
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def shortest_edge_size(width: int, height: int, shortest: int) -> tuple[int, int]:
    """(width, height) with the short side ``shortest`` and the long side scaled (truncated)."""
    if width <= height:
        return shortest, int(shortest * height / width)
    return int(shortest * width / height), shortest


def center_crop(arr: np.ndarray, height: int, width: int) -> np.ndarray:
    """``[H, W, C]`` -> ``[height, width, C]``; pads with zeros (centred) where the image is smaller."""
    h, w = arr.shape[:2]
    if h < height or w < width:
        ph, pw = max(height, h), max(width, w)
        padded = np.zeros((ph, pw, arr.shape[2]), dtype=arr.dtype)
        top, left = (ph - h) // 2, (pw - w) // 2
        padded[top : top + h, left : left + w] = arr
        arr, h, w = padded, ph, pw
    top, left = (h - height) // 2, (w - width) // 2
    return arr[top : top + height, left : left + width]


def preprocess_clip(image: Any, cfg: ClipImageConfig) -> torch.Tensor:
    """One ``PIL.Image`` -> float32 ``[3, H, W]``."""
    if cfg.do_convert_rgb:
        image = to_rgb(image)
    if cfg.do_resize:
        if "shortest_edge" in cfg.size:
            size = shortest_edge_size(image.width, image.height, cfg.size["shortest_edge"])
        else:
            size = (cfg.size["width"], cfg.size["height"])
        image = image.resize(size, resample=cfg.resample, reducing_gap=None)
    arr = np.asarray(image)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if cfg.do_center_crop and cfg.crop_size:
        arr = center_crop(arr, cfg.crop_size["height"], cfg.crop_size["width"])
    out = arr.astype(np.float32)
    if cfg.do_rescale:
        out = (arr.astype(np.float64) * cfg.rescale_factor).astype(np.float32)
    if cfg.do_normalize:
        mean = np.asarray(cfg.image_mean, dtype=np.float32)
        std = np.asarray(cfg.image_std, dtype=np.float32)
        out = ((out - mean) / std).astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(out.transpose(2, 0, 1)))
