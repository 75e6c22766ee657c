"""Vision-language fixtures for tests/vl (defined in vlm_fixtures.py, shared with tests/models)."""

from __future__ import annotations

from vlm_fixtures import (
    hf_internvl_greedy,
    hf_llava_greedy,
    hf_llava_next_greedy,
    hf_qwen2_vl_greedy,
    images,
    make_tiny_internvl,
    make_tiny_llava,
    make_tiny_llava_next,
    make_tiny_qwen2_vl,
    pasta_image,
)

__all__ = [
    "hf_internvl_greedy",
    "hf_llava_greedy",
    "hf_llava_next_greedy",
    "hf_qwen2_vl_greedy",
    "images",
    "make_tiny_internvl",
    "make_tiny_llava",
    "make_tiny_llava_next",
    "make_tiny_qwen2_vl",
    "pasta_image",
]
