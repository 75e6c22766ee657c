"""hotloop's LLaVA-NeXT preprocessing equals transformers' ``LlavaNextImageProcessorPil`` (best
resolution, aspect-preserving resize and pad, tiles plus the base image), and its image-token counts
equal ``LlavaNextProcessor``'s expansion, on real and drawn images of many sizes."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vlm_fixtures import drawn_image

from hotloop.models.loader import load_hf_config
from hotloop.vl import build_vl_processor
from hotloop.vl.llava_next_preprocess import (
    DEFAULT_PINPOINTS,
    IMAGE_SIZE_KEY,
    LlavaNextImageConfig,
    num_image_tokens,
    preprocess_llava_next,
    select_best_resolution,
)

TINY_PINPOINTS = [[32, 32], [32, 64], [64, 32]]


@pytest.mark.parametrize(
    "cfg",
    [
        dict(
            size={"shortest_edge": 16},
            crop_size={"height": 16, "width": 16},
            image_grid_pinpoints=TINY_PINPOINTS,
        ),
        dict(  # tiles resized up, then centre-cropped; a tall 3x1 grid
            size={"shortest_edge": 18},
            crop_size={"height": 16, "width": 16},
            image_grid_pinpoints=[*TINY_PINPOINTS, [48, 16]],
        ),
        dict(size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}),  # llava-v1.6
    ],
)
def test_llava_next_pixels_equal_transformers(cfg: dict[str, Any], images: list[Any]) -> None:
    from transformers.models.llava_next.image_processing_pil_llava_next import LlavaNextImageProcessorPil

    hf = LlavaNextImageProcessorPil(**cfg)
    ours = LlavaNextImageConfig.from_dict(hf.to_dict())
    for img in [*images, drawn_image(200, 7, 5), drawn_image(33, 33, 6)]:
        expected = hf(images=img, return_tensors="pt")
        got, size = preprocess_llava_next(img, ours)
        assert size == tuple(expected["image_sizes"][0].tolist())
        assert got.shape == expected["pixel_values"][0].shape, (img.size, img.mode)
        torch.testing.assert_close(got, expected["pixel_values"][0], atol=1e-6, rtol=0)


def _hf_token_count(height: int, width: int, pinpoints: list[list[int]], tile: int, patch: int) -> int:
    """``LlavaNextProcessor.replace_image_token``'s count, on a stand-in (no tokenizer needed)."""
    from transformers import LlavaNextProcessor

    stand_in = SimpleNamespace(
        image_processor=SimpleNamespace(image_grid_pinpoints=pinpoints),
        patch_size=patch,
        num_additional_image_tokens=1,
    )
    stand_in._get_unpadded_features = functools.partial(LlavaNextProcessor._get_unpadded_features, stand_in)
    return int(LlavaNextProcessor._get_number_of_features(stand_in, height, width, tile, tile)) - 1  # type: ignore[arg-type]


def test_token_counts_equal_transformers() -> None:
    from transformers.image_processing_utils import select_best_resolution as hf_best

    rng = random.Random(11)
    cases = [(TINY_PINPOINTS, 16, 4), ([list(p) for p in DEFAULT_PINPOINTS], 336, 14)]
    for pinpoints, tile, patch in cases:
        side = tile // patch
        for _ in range(1500):
            h, w = rng.randint(1, 2500), rng.randint(1, 2500)
            assert select_best_resolution(h, w, pinpoints) == tuple(hf_best((h, w), pinpoints))
            got = num_image_tokens(h, w, pinpoints, tile, side, side * side)
            assert got == _hf_token_count(h, w, pinpoints, tile, patch), (h, w, tile)


def test_llava_next_expansion_equals_processor(
    make_tiny_llava_next: Callable[[str], Path], images: list[Any]
) -> None:
    from transformers import AutoProcessor

    path = make_tiny_llava_next("default")
    hf = AutoProcessor.from_pretrained(str(path))
    vl = build_vl_processor(path, load_hf_config(path), hf.tokenizer)
    assert vl is not None and vl.placeholder == "<image>"
    text = "one <image> two <image> three <image> end"
    imgs = [images[0], images[2], images[3]]
    ids, mm = vl.expand(hf.tokenizer.encode(text), imgs)
    expected = hf(text=text, images=imgs, return_tensors="pt")
    assert ids == expected["input_ids"][0].tolist()
    spans = [(m.offset, m.length) for m in mm]
    assert len({length for _o, length in spans}) == 3, "the images were meant to give different counts"
    for m, px, size in zip(mm, expected["pixel_values"], expected["image_sizes"], strict=True):
        assert set(ids[m.offset : m.end]) == {vl.image_token_id}
        assert m.extra[IMAGE_SIZE_KEY] == tuple(size.tolist())
        n = m.pixel_values.shape[0]  # transformers pads every image to the most tiles
        torch.testing.assert_close(m.pixel_values, px[:n], atol=1e-6, rtol=0)
        assert not px[n:].any()
    assert sum(m.length for m in mm) == ids.count(vl.image_token_id)
    assert len({m.content_hash for m in mm}) == 3
    assert vl.hash_salt({IMAGE_SIZE_KEY: (20, 30)}) != vl.hash_salt({IMAGE_SIZE_KEY: (30, 20)})
