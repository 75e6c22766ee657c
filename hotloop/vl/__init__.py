"""Vision-language inputs: image loading, per-model preprocessing, and merging image embeddings.

``load_image`` reads a path, URL, ``data:`` URL or ``PIL.Image``; ``build_vl_processor`` gives the
model's processor, which turns images into pixel tensors and expands image placeholders into the
tokens their embeddings fill (``ImageInput``); ``merge`` is what the model runner calls each step.
"""

from __future__ import annotations

from hotloop.vl.image import ImageFetchPolicy, ImageLoadError, load_image
from hotloop.vl.inputs import ImageInput
from hotloop.vl.processor import VLProcessor, build_vl_processor

__all__ = [
    "ImageFetchPolicy",
    "ImageInput",
    "ImageLoadError",
    "VLProcessor",
    "build_vl_processor",
    "load_image",
]
