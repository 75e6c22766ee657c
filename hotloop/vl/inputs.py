"""What a request carries for each image: pixels, the prompt tokens it fills, and a content hash."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True, eq=False)
class ImageInput:
    """One preprocessed image of a request.

    ``pixel_values``: the model processor's output for this image (e.g. ``[3, H, W]`` float32 for
    CLIP). Its embeddings replace prompt tokens ``offset .. offset + length``. ``content_hash``
    names the image's content and preprocessing; it joins the request's prefix-cache keys.
    ``extra``: model-specific facts (grid sizes, tile counts) the encoder needs.
    """

    pixel_values: torch.Tensor
    offset: int
    length: int
    content_hash: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.offset + self.length


def pixel_hash(pixel_values: torch.Tensor, salt: str = "") -> str:
    """A stable hash of preprocessed pixels (equal images, equal preprocessing -> equal hash)."""
    h = hashlib.sha256(salt.encode())
    t = pixel_values.detach().to("cpu").contiguous()
    h.update(str((tuple(t.shape), str(t.dtype))).encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:32]
