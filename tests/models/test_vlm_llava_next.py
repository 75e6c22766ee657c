"""LLaVA-NeXT greedy parity with transformers through the whole engine, on real images.

Tiny random llava-hf LLaVA-NeXT checkpoints (CLIP tower on 16-pixel "anyres" tiles, MLP projector,
learned image newline, Llama decoder) saved by transformers with a ``LlavaNextProcessor``. Images of
several sizes and aspect ratios pick different tile grids and give different token counts. hotloop
expands ``<image>`` with its own processor and serves the prompts in one continuous batch with a
text-only request mixed in; every request's greedy tokens must equal transformers' ``generate`` on
that prompt alone, also when a small prefill budget splits images' tokens over steps.
"""

# ruff: noqa: F811  (fixtures imported from tests/vl/vlm_fixtures.py are test parameters)
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from vl.vlm_fixtures import (  # noqa: F401
    hf_llava_next_greedy,
    images,
    make_tiny_llava_next,
    pasta_image,
    run_vl_engine,
)

from hotloop.config import EngineConfig

MAX_NEW = 8
PROMPTS = [
    ("<image>\nWhat is shown here?", [0]),
    ("Compare <image> with <image> please", [1, 2]),
    ("A plain text request without images", []),
    ("<image> and <image> two more", [3, 4]),
]


@pytest.mark.parametrize("variant,chunks", [("default", [8192, 13]), ("multilayer", [29])])
def test_llava_next_greedy_parity(
    variant: str, chunks: list[int], make_tiny_llava_next: Callable[[str], Path], images: list[Any]
) -> None:
    path = make_tiny_llava_next(variant)
    prompts = [(text, [images[j] for j in idx]) for text, idx in PROMPTS]
    expected = hf_llava_next_greedy(path, prompts, MAX_NEW)
    for chunk in chunks:  # 13 or 29 tokens a step split every image (33 to 150 tokens)
        cfg = EngineConfig(
            device="cpu",
            dtype="float32",
            cache_block_seq_len=4,
            cache_max_entry_count=512,
            max_prefill_token_num=chunk,
        )
        got = run_vl_engine(path, cfg, prompts, MAX_NEW)
        for i, ((g_ids, g_out), (e_ids, e_out)) in enumerate(zip(got, expected, strict=True)):
            assert g_ids == e_ids, f"prompt {i}: expanded prompt ids differ from LlavaNextProcessor's"
            assert g_out == e_out, f"chunk {chunk}, prompt {i}: hotloop {g_out} != transformers {e_out}"


def test_llava_next_image_embeddings_equal_transformers(
    make_tiny_llava_next: Callable[[str], Path], images: list[Any]
) -> None:
    """All images' tiles in one tower pass, packed, against transformers' ``get_image_features``."""
    from transformers import AutoTokenizer, LlavaNextForConditionalGeneration

    from hotloop.models.loader import load_hf_config, load_model
    from hotloop.vl import build_vl_processor

    path = make_tiny_llava_next("default")
    hf = LlavaNextForConditionalGeneration.from_pretrained(str(path), dtype=torch.float32).eval()
    ours = load_model(path, torch.float32, "cpu")
    vl = build_vl_processor(path, load_hf_config(path), AutoTokenizer.from_pretrained(str(path)))
    assert vl is not None
    pre = [vl.preprocess(img) for img in images]
    with torch.no_grad():
        got = ours.encode_images([p for p, _ in pre], [extra for _, extra in pre])
        for (pixels, extra), g in zip(pre, got, strict=True):
            sizes = torch.tensor([extra["image_size"]])
            expected = hf.model.get_image_features(pixels[None], sizes).pooler_output[0]
            assert g.shape == expected.shape
            assert g.shape[0] == len(vl.image_token_ids(pixels, extra)[0])
            torch.testing.assert_close(g, expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="image_size"):
        ours.encode_images([pre[0][0]])


def test_llava_next_pipeline(make_tiny_llava_next: Callable[[str], Path], images: list[Any]) -> None:
    """``pipeline()`` builds the LLaVA-NeXT model and processor from the folder; a (text, images)
    prompt and an OpenAI message list give transformers' tokens."""
    from transformers import AutoTokenizer

    from hotloop import pipeline
    from hotloop.messages import GenerationConfig

    path = make_tiny_llava_next("default")
    tok = AutoTokenizer.from_pretrained(str(path))
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "<image>\nWhat is this?\n<image>\nand this"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    refs = [("Describe <image> now", [images[1]]), (chat, [images[4], images[2]])]
    expected = [out for _ids, out in hf_llava_next_greedy(path, refs, MAX_NEW)]
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": images[4]},
                {"type": "text", "text": "What is this?"},
                {"type": "image", "image": images[2]},
                {"type": "text", "text": "and this"},
            ],
        }
    ]
    gen = GenerationConfig(max_new_tokens=MAX_NEW, ignore_eos=True)
    cfg = EngineConfig(device="cpu", dtype="float32", cache_max_entry_count=128, max_prefill_token_num=64)
    with pipeline(str(path), cfg) as pipe:
        assert pipe(("Describe <image> now", images[1]), gen, do_preprocess=False).token_ids == expected[0]
        assert pipe(messages, gen).token_ids == expected[1]
