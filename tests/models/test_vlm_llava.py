"""LLaVA greedy parity with transformers through the whole engine, on real images.

Tiny random llava-hf checkpoints (CLIP tower + MLP projector + Llama) saved by transformers with a
``LlavaProcessor``. hotloop expands the ``<image>`` placeholders with its own processor and serves
the prompts in one continuous batch (with text-only requests mixed in); every request's greedy tokens
must equal transformers' ``generate`` on that prompt alone. Variants: one image, several images per
prompt, a chunked prefill that splits image tokens, and a multi-layer / CLS-keeping feature setup.
"""

# ruff: noqa: F811  (fixtures imported from tests/vl/vlm_fixtures.py are test parameters)
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from vl.vlm_fixtures import hf_llava_greedy, images, make_tiny_llava, pasta_image, run_vl_engine  # noqa: F401

from hotloop.config import EngineConfig

MAX_NEW = 8
PROMPTS = [
    ("<image>\nWhat is shown here?", [0]),
    ("Compare <image> with <image> please", [1, 2]),
    ("A plain text request without images", []),
    ("<image><image><image> three at once", [3, 4, 0]),
    ("Describe the colours of <image>", [2]),
]


def _with_images(images: list[Any]) -> list[tuple[str, list[Any]]]:
    return [(text, [images[j] for j in idx]) for text, idx in PROMPTS]


@pytest.mark.parametrize("variant,chunks", [("default", [8192, 7]), ("full_multilayer", [11])])
def test_llava_greedy_parity(
    variant: str, chunks: list[int], make_tiny_llava: Callable[[str], Path], images: list[Any]
) -> None:
    path = make_tiny_llava(variant)
    prompts = _with_images(images)
    expected = hf_llava_greedy(path, prompts, MAX_NEW)
    for chunk in chunks:  # a 7- or 11-token prefill budget splits every 25/26-token image
        cfg = EngineConfig(
            device="cpu",
            dtype="float32",
            cache_block_seq_len=4,
            cache_max_entry_count=256,
            max_prefill_token_num=chunk,
        )
        got = run_vl_engine(path, cfg, prompts, MAX_NEW)
        for i, ((g_ids, g_out), (e_ids, e_out)) in enumerate(zip(got, expected, strict=True)):
            assert g_ids == e_ids, f"prompt {i}: expanded prompt ids differ from LlavaProcessor's"
            assert g_out == e_out, f"chunk {chunk}, prompt {i}: hotloop {g_out} != transformers {e_out}"
