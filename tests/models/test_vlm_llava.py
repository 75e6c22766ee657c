"""LLaVA greedy parity with transformers through the whole engine, on real images.

Tiny random llava-hf checkpoints (CLIP tower + MLP projector + Llama) saved by transformers with a
``LlavaProcessor``. hotloop expands the ``<image>`` placeholders with its own processor and serves
the prompts in one continuous batch (with text-only requests mixed in); every request's greedy tokens
must equal transformers' ``generate`` on that prompt alone. Variants: one image, several images per
prompt, a chunked prefill that splits image tokens, and a multi-layer / CLS-keeping feature setup.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig
from hotloop.messages import GenerationConfig
from hotloop.vl import build_vl_processor
from vl.vlm_fixtures import images, make_tiny_llava, pasta_image  # noqa: F401 (fixtures)

MAX_NEW = 8
PROMPTS = [
    ("<image>\nWhat is shown here?", [0]),
    ("Compare <image> with <image> please", [1, 2]),
    ("A plain text request without images", []),
    ("<image><image><image> three at once", [3, 4, 0]),
    ("Describe the colours of <image>", [2]),
]


def hf_greedy(path: Path, prompts: list[tuple[str, list[Any]]]) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy tokens) from transformers for each (text, images), one at a time."""
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    processor = AutoProcessor.from_pretrained(str(path))
    model = LlavaForConditionalGeneration.from_pretrained(str(path), torch_dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    outs = []
    with torch.no_grad():
        for text, imgs in prompts:
            inputs = processor(text=text, images=imgs or None, return_tensors="pt")
            g = model.generate(**inputs, max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)
            ids = inputs["input_ids"][0].tolist()
            outs.append((ids, g[0, len(ids) :].tolist()))
    return outs


def run_engine(path: Path, cfg: EngineConfig, prompts: list[tuple[str, list[Any]]]) -> list[tuple[list[int], list[int]]]:
    built = build_engine(str(path), cfg)
    vl = build_vl_processor(path, built.model_config.hf_config, built.tokenizer)
    assert vl is not None
    engine = built.engine
    params = GenerationConfig(max_new_tokens=MAX_NEW, ignore_eos=True)
    prompt_ids: dict[str, list[int]] = {}
    outputs = []
    for i, (text, imgs) in enumerate(prompts):  # arrive one step apart: mixed prefill/decode batches
        ids, mm = vl.expand(built.tokenizer.encode(text), imgs)
        prompt_ids[str(i)] = ids
        engine.add_request(str(i), ids, params, mm_inputs=mm)
        outputs += engine.step()
    results: dict[str, list[int]] = {}
    while engine.has_unfinished():
        outputs += engine.step()
    assert engine.num_free_blocks == engine.num_total_blocks
    for o in outputs:
        results.setdefault(o.request_id, []).extend(o.new_token_ids)
    return [(prompt_ids[str(i)], results.get(str(i), [])) for i in range(len(prompts))]


def _with_images(images: list[Any]) -> list[tuple[str, list[Any]]]:
    return [(text, [images[j] for j in idx]) for text, idx in PROMPTS]


@pytest.mark.parametrize(
    "variant,chunk",
    [("default", 8192), ("default", 7), ("full_multilayer", 11)],
    ids=["default", "default-chunked", "full_multilayer-chunked"],
)
def test_llava_greedy_parity(
    variant: str, chunk: int, make_tiny_llava: Callable[[str], Path], images: list[Any]
) -> None:
    path = make_tiny_llava(variant)
    prompts = _with_images(images)
    expected = hf_greedy(path, prompts)
    cfg = EngineConfig(
        device="cpu", dtype="float32", cache_block_seq_len=4, cache_max_entry_count=256, max_prefill_token_num=chunk
    )
    got = run_engine(path, cfg, prompts)
    first_step_tokens = [len(e[0]) for e in expected]
    assert max(first_step_tokens) > 40, "prompts should be long enough for chunking to split images"
    for i, ((g_ids, g_out), (e_ids, e_out)) in enumerate(zip(got, expected, strict=True)):
        assert g_ids == e_ids, f"prompt {i}: expanded prompt ids differ from LlavaProcessor's"
        assert g_out == e_out, f"prompt {i}: hotloop {g_out} != transformers {e_out}"
