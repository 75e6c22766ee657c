"""hotloop's Qwen2-VL preprocessing equals transformers' Qwen2VLImageProcessor (PIL backend) and the
Qwen2VLProcessor's image-token expansion, on real and drawn images."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from vlm_fixtures import QWEN2_VL_IMAGE, drawn_image, qwen2_vl_expand

from hotloop.messages import RequestError
from hotloop.models.loader import load_hf_config
from hotloop.vl import build_vl_processor
from hotloop.vl.mrope import GRID_KEY
from hotloop.vl.qwen2_vl_preprocess import Qwen2VLImageConfig, preprocess_qwen2_vl, smart_resize


def test_smart_resize_equals_transformers() -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf_smart_resize

    rng = random.Random(7)
    for _ in range(2000):
        h, w = rng.randint(1, 3000), rng.randint(1, 3000)
        if max(h, w) / min(h, w) > 200:
            continue
        factor = rng.choice([8, 28, 32])
        lo = factor * factor * rng.randint(1, 8)
        hi = lo * rng.randint(1, 400)
        assert smart_resize(h, w, factor, lo, hi) == tuple(hf_smart_resize(h, w, factor, lo, hi)), (
            h,
            w,
            factor,
        )


@pytest.mark.parametrize(
    "cfg",
    [
        dict(min_pixels=8 * 8 * 4, max_pixels=8 * 8 * 30, patch_size=4, merge_size=2),
        dict(min_pixels=56 * 56, max_pixels=28 * 28 * 40),  # the real patch size (14), merge 2
        dict(
            size={"shortest_edge": 12 * 12 * 2, "longest_edge": 12 * 12 * 90},
            patch_size=6,
            temporal_patch_size=1,
        ),
    ],
)
def test_qwen2_vl_patches_equal_transformers(cfg: dict[str, Any], images: list[Any]) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    hf = Qwen2VLImageProcessorPil(**cfg)
    ours = Qwen2VLImageConfig.from_dict(hf.to_dict())
    grids = set()
    for img in [*images, drawn_image(300, 7, 5)]:
        expected = hf(images=[img], return_tensors="pt")
        got = preprocess_qwen2_vl(img, ours)
        t, h, w = expected["image_grid_thw"][0].tolist()
        m = ours.merge_size
        assert tuple(got.shape) == (t, h // m, w // m, m * m, ours.patch_dim), (img.size, img.mode)
        torch.testing.assert_close(
            got.reshape(-1, ours.patch_dim), expected["pixel_values"], atol=1e-6, rtol=0
        )
        grids.add((h, w))
    assert len(grids) > 3, f"the images should resize to several grids, got {grids}"


def test_config_reads_min_max_pixels() -> None:
    old = Qwen2VLImageConfig.from_dict({"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14})
    new = Qwen2VLImageConfig.from_dict({"size": {"shortest_edge": 3136, "longest_edge": 12845056}})
    assert old == new and (old.min_pixels, old.max_pixels) == (3136, 12845056)
    assert Qwen2VLImageConfig.from_dict({}) == Qwen2VLImageConfig()  # transformers' class defaults
    assert Qwen2VLImageConfig.from_dict({"size": {"shortest_edge": 1}, "min_pixels": 64}).min_pixels == 64


@pytest.mark.parametrize("variant", ["qwen2_vl", "qwen2_5_vl"])
def test_qwen2_vl_expansion_equals_processor(
    variant: str, make_tiny_qwen2_vl: Callable[[str], Path], images: list[Any]
) -> None:
    from transformers import AutoTokenizer

    path = make_tiny_qwen2_vl(variant)
    tok = AutoTokenizer.from_pretrained(str(path))
    vl = build_vl_processor(path, load_hf_config(path), tok)
    assert vl is not None and vl.placeholder == QWEN2_VL_IMAGE
    text = f"two {QWEN2_VL_IMAGE} and {QWEN2_VL_IMAGE}\n{QWEN2_VL_IMAGE} end"
    imgs = images[:3]
    ids, mm = vl.expand(tok.encode(text), imgs)
    expected_ids, inputs = qwen2_vl_expand(path, text, imgs)
    assert ids == expected_ids
    grid = inputs["image_grid_thw"]
    pad = vl.image_token_id
    start = 0
    for m, (t, h, w), px in zip(
        mm, grid.tolist(), torch.split(inputs["pixel_values"], (grid.prod(-1)).tolist()), strict=True
    ):
        assert m.extra[GRID_KEY] == (t, h // 2, w // 2)
        assert m.length == t * h * w // 4
        m_offset = ids.index(pad, start)
        assert (m.offset, set(ids[m.offset : m.end])) == (m_offset, {pad})
        assert ids[m.offset - 1] == tok.convert_tokens_to_ids("<|vision_start|>")
        assert ids[m.end] == tok.convert_tokens_to_ids("<|vision_end|>")
        torch.testing.assert_close(m.pixel_values.reshape(px.shape), px, atol=1e-6, rtol=0)
        start = m.end
    assert len({m.content_hash for m in mm}) == 3


def test_extreme_aspect_ratio_is_a_request_error(make_tiny_qwen2_vl: Callable[[str], Path]) -> None:
    from transformers import AutoTokenizer

    path = make_tiny_qwen2_vl("qwen2_vl")
    tok = AutoTokenizer.from_pretrained(str(path))
    vl = build_vl_processor(path, load_hf_config(path), tok)
    assert vl is not None
    with pytest.raises(RequestError, match="aspect ratio above 200"):
        vl.expand(tok.encode(QWEN2_VL_IMAGE), [drawn_image(402, 2, 1)])
