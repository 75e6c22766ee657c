"""Image embeddings into a step's flat batch: encode what this step needs, merge at image tokens.

A request's images are encoded when a step first covers any of their tokens (images of all the
step's requests go through the encoder together) and kept on the request until every token of the
image has been computed, so a chunked prefill that splits an image's tokens encodes it once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from hotloop.vl.inputs import ImageInput


class VisionLanguageModel(Protocol):
    """What the runner needs of a model that takes images (see ``hotloop/models/llava.py``)."""

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor: ...

    def encode_images(self, pixel_values: Sequence[torch.Tensor]) -> list[torch.Tensor]: ...


def encode(model: Any, images: Sequence[ImageInput]) -> list[torch.Tensor]:
    """``model.encode_images`` on the images' pixels; a model whose ``encode_images_takes_extra`` is
    true (LLaVA-NeXT: it needs the original image sizes) also gets each image's ``extra``."""
    pixels = [img.pixel_values for img in images]
    out: list[torch.Tensor]
    if getattr(model, "encode_images_takes_extra", False):
        out = model.encode_images(pixels, [img.extra for img in images])
    else:
        out = model.encode_images(pixels)
    return out


class Scheduled(Protocol):
    """``engine.scheduler.ScheduledRequest`` as far as merging goes."""

    request: Any
    num_tokens: int
    start: int


def has_images(scheduled: Sequence[Scheduled]) -> bool:
    """Whether this step computes any image token (decode steps never do, so they stay on the text
    path, CUDA graphs included)."""
    for s in scheduled:
        mm = s.request.mm_inputs
        if mm and s.start < mm[-1].end:
            end = s.start + s.num_tokens
            if any(_overlap(img, s.start, end) for img in mm):
                return True
    return False


def _overlap(img: ImageInput, start: int, end: int) -> tuple[int, int] | None:
    lo, hi = max(img.offset, start), min(img.end, end)
    return (lo, hi) if lo < hi else None


def encoder_units(img: ImageInput) -> int:
    """What an image costs the vision encoder, in encoder inputs: its tiles for a tiled model
    (pixels ``[tiles, 3, H, W]``: LLaVA-NeXT, InternVL), else 1 (one ``[3, H, W]`` image, or
    Qwen2-VL's patch sequence)."""
    pv = img.pixel_values
    return int(pv.shape[0]) if pv.dim() == 4 else 1


def _batches(
    todo: list[tuple[Any, int, ImageInput]], max_units: int
) -> list[list[tuple[Any, int, ImageInput]]]:
    """Consecutive runs of ``todo`` whose encoder units add up to at most ``max_units`` (an image
    larger than that on its own goes alone)."""
    out: list[list[tuple[Any, int, ImageInput]]] = []
    run: list[tuple[Any, int, ImageInput]] = []
    used = 0
    for item in todo:
        units = encoder_units(item[2])
        if run and used + units > max_units:
            out.append(run)
            run, used = [], 0
        run.append(item)
        used += units
    if run:
        out.append(run)
    return out


def encode_missing(model: VisionLanguageModel, scheduled: Sequence[Scheduled], max_batch: int = 16) -> None:
    """Encode every image this step touches that the request has no embeddings for yet, in encoder
    batches of at most ``max_batch`` encoder inputs (tiles, for tiled models: see ``encoder_units``)."""
    todo: list[tuple[Any, int, ImageInput]] = []
    for s in scheduled:
        req = s.request
        for i, img in enumerate(req.mm_inputs):
            if i not in req.mm_embeds and _overlap(img, s.start, s.start + s.num_tokens):
                todo.append((req, i, img))
    for chunk in _batches(todo, max_batch):
        embeds = encode(model, [img for _r, _i, img in chunk])
        for (req, i, img), emb in zip(chunk, embeds, strict=True):
            if emb.shape[0] != img.length:
                raise ValueError(
                    f"request {req.request_id}: image {i} gives {emb.shape[0]} embeddings for {img.length} tokens"
                )
            req.mm_embeds[i] = emb


def merged_embeddings(
    model: VisionLanguageModel,
    scheduled: Sequence[Scheduled],
    input_ids: torch.Tensor,
    max_batch: int = 16,
) -> torch.Tensor:
    """``input_ids`` ``[T]`` (the step's tokens back to back) -> ``[T, hidden]`` with each image's
    embeddings at its tokens. Frees the embeddings of images this step completes."""
    encode_missing(model, scheduled, max_batch)
    embeds = model.embed_input_ids(input_ids)
    row = 0
    for s in scheduled:
        req, end = s.request, s.start + s.num_tokens
        for i, img in enumerate(req.mm_inputs):
            span = _overlap(img, s.start, end)
            if span is None:
                continue
            lo, hi = span
            src = req.mm_embeds[i][lo - img.offset : hi - img.offset]
            embeds[row + lo - s.start : row + hi - s.start] = src.to(embeds.dtype)
            if img.end <= end:
                del req.mm_embeds[i]  # a preempted request re-encodes it on recompute
        row += s.num_tokens
    return embeds
