"""hotloop's LLaVA preprocessing equals transformers' CLIPImageProcessor / LlavaProcessor on real images."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hotloop.models.loader import load_hf_config
from hotloop.vl import build_vl_processor
from hotloop.vl.clip_preprocess import ClipImageConfig, center_crop, preprocess_clip


@pytest.mark.parametrize(
    "cfg",
    [
        dict(size={"shortest_edge": 34}, crop_size={"height": 30, "width": 30}),
        dict(size={"shortest_edge": 24}, crop_size={"height": 30, "width": 20}),  # crop pads
        dict(size={"height": 28, "width": 40}, do_center_crop=False),
    ],
)
def test_clip_pixels_equal_transformers(cfg: dict[str, Any], images: list[Any]) -> None:
    from transformers import CLIPImageProcessor

    hf = CLIPImageProcessor(**cfg)
    ours = ClipImageConfig.from_dict(hf.to_dict())
    for img in images:
        expected = hf(images=img, return_tensors="pt")["pixel_values"][0]
        got = preprocess_clip(img, ours)
        assert got.shape == expected.shape, (img.size, img.mode)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_center_crop_pads_small_images() -> None:
    arr = np.arange(2 * 3 * 1, dtype=np.uint8).reshape(2, 3, 1) + 1
    out = center_crop(arr, 4, 3)
    assert out.shape == (4, 3, 1)
    assert out[:, :, 0].tolist() == [[0, 0, 0], [1, 2, 3], [4, 5, 6], [0, 0, 0]]


def test_llava_expansion_equals_processor(make_tiny_llava: Callable[[str], Path], images: list[Any]) -> None:
    from transformers import AutoProcessor

    path = make_tiny_llava("default")
    hf = AutoProcessor.from_pretrained(str(path))
    vl = build_vl_processor(path, load_hf_config(path), hf.tokenizer)
    assert vl is not None and vl.placeholder == "<image>"
    text = "two <image> and <image> end"
    ids, mm = vl.expand(hf.tokenizer.encode(text), images[:2])
    expected = hf(text=text, images=images[:2], return_tensors="pt")
    assert ids == expected["input_ids"][0].tolist()
    first = ids.index(vl.image_token_id)
    assert [(m.offset, m.length) for m in mm] == [(first, 25), (ids.index(vl.image_token_id, first + 25), 25)]
    assert all(set(ids[m.offset : m.end]) == {vl.image_token_id} for m in mm)
    for m, px in zip(mm, expected["pixel_values"], strict=True):
        torch.testing.assert_close(m.pixel_values, px, atol=1e-6, rtol=0)
    assert mm[0].content_hash != mm[1].content_hash
    again, _ = vl.expand(hf.tokenizer.encode("<image>"), [images[0]])
    assert vl.expand(hf.tokenizer.encode("<image>"), [images[0]])[1][0].content_hash == mm[0].content_hash
    assert len(again) == 25


def test_placeholder_count_must_match(make_tiny_llava: Callable[[str], Path], images: list[Any]) -> None:
    from transformers import AutoTokenizer

    from hotloop.messages import RequestError

    path = make_tiny_llava("default")
    tok = AutoTokenizer.from_pretrained(str(path))
    vl = build_vl_processor(path, load_hf_config(path), tok)
    assert vl is not None
    with pytest.raises(RequestError, match="1 image placeholder.*2 image"):
        vl.expand(tok.encode("<image> only one"), images[:2])
