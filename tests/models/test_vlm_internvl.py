"""InternVL greedy parity with transformers through the engine, and its tiling equal to GotOcr2's.

Tiny random checkpoints (InternViT + pixel shuffle + projector + Qwen2) saved by transformers; real
and drawn images of several aspect ratios give 1 to 7 tiles each. Prompts mix one and several
images with text-only requests, and a small prefill budget splits the images' tokens.
"""

# ruff: noqa: F811  (fixtures imported from tests/vl/vlm_fixtures.py are test parameters)
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from vl.vlm_fixtures import (  # noqa: F401
    hf_internvl_greedy,
    images,
    make_tiny_internvl,
    pasta_image,
    run_vl_engine,
)

from hotloop.config import EngineConfig

MAX_NEW = 8
PROMPTS = [
    ("<IMG_CONTEXT>\nWhat is shown here?", [0]),
    ("Compare <IMG_CONTEXT> with <IMG_CONTEXT> please", [1, 2]),
    ("A plain text request without images", []),
    ("<IMG_CONTEXT><IMG_CONTEXT> two more", [3, 4]),
]


@pytest.mark.parametrize("variant,chunks", [("layernorm", [8192, 5]), ("rmsnorm_qknorm", [9])])
def test_internvl_greedy_parity(
    variant: str, chunks: list[int], make_tiny_internvl: Callable[[str], Path], images: list[Any]
) -> None:
    path = make_tiny_internvl(variant)
    prompts = [(text, [images[j] for j in idx]) for text, idx in PROMPTS]
    expected = hf_internvl_greedy(path, prompts, MAX_NEW)
    for chunk in chunks:
        cfg = EngineConfig(
            device="cpu",
            dtype="float32",
            cache_block_seq_len=4,
            cache_max_entry_count=256,
            max_prefill_token_num=chunk,
        )
        got = run_vl_engine(path, cfg, prompts, MAX_NEW)
        for i, ((g_ids, g_out), (e_ids, _px, e_out)) in enumerate(zip(got, expected, strict=True)):
            assert g_ids == e_ids, f"prompt {i}: expanded prompt ids differ from InternVL's expansion"
            assert g_out == e_out, f"chunk {chunk}, prompt {i}: hotloop {g_out} != transformers {e_out}"
    if variant == "layernorm":  # the Python API places the image where InternVL's placeholder goes
        from hotloop import pipeline
        from hotloop.messages import GenerationConfig

        gen = GenerationConfig(max_new_tokens=MAX_NEW, ignore_eos=True)
        with pipeline(
            str(path), EngineConfig(device="cpu", dtype="float32", cache_max_entry_count=64)
        ) as pipe:
            r = pipe(("What is shown here?", images[0]), gen, do_preprocess=False)
        assert r.token_ids == expected[0][2]


def test_internvl_tiles_equal_transformers(
    make_tiny_internvl: Callable[[str], Path], images: list[Any]
) -> None:
    from transformers import AutoTokenizer, GotOcr2ImageProcessor

    from hotloop.models.loader import load_hf_config
    from hotloop.vl import build_vl_processor

    path = make_tiny_internvl("layernorm")
    hf = GotOcr2ImageProcessor.from_pretrained(str(path))
    vl = build_vl_processor(path, load_hf_config(path), AutoTokenizer.from_pretrained(str(path)))
    assert vl is not None
    counts = []
    for img in images:
        expected = hf(images=[img], crop_to_patches=True, return_tensors="pt")
        tiles, extra = vl.preprocess(img.convert("RGB") if img.mode == "P" else img)
        assert extra["num_tiles"] == int(expected["num_patches"][0])
        torch.testing.assert_close(tiles, expected["pixel_values"], atol=1e-6, rtol=0)
        counts.append(extra["num_tiles"])
    assert len(set(counts)) > 1, f"the images should tile differently, got {counts}"
