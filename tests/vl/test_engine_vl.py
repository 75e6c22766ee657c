"""Images through the engine's caching and memory paths: the prefix cache keys blocks by image
content (same image -> cache hit and equal tokens, other image -> no hit), preemption re-encodes
images on recompute, and a request whose image tokens do not match its images is refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from vlm_fixtures import hf_llava_greedy

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig
from hotloop.messages import GenerationConfig, RequestError
from hotloop.vl import build_vl_processor
from hotloop.vl.inputs import ImageInput

MAX_NEW = 6
PARAMS = GenerationConfig(max_new_tokens=MAX_NEW, ignore_eos=True)


def _serve(
    engine: Any, requests: list[tuple[str, list[int], list[ImageInput]]]
) -> dict[str, tuple[list[int], int]]:
    """Submit all, step to the end; -> request id: (tokens, cached prompt tokens)."""
    for rid, ids, mm in requests:
        engine.add_request(rid, ids, PARAMS, mm_inputs=mm)
    out: dict[str, tuple[list[int], int]] = {}
    while engine.has_unfinished():
        for o in engine.step():
            toks, cached = out.get(o.request_id, ([], 0))
            out[o.request_id] = (toks + o.new_token_ids, max(cached, o.cached_tokens))
    assert engine.num_free_blocks == engine.num_total_blocks
    return out


def test_prefix_cache_keys_include_images(make_tiny_llava: Callable[[str], Path], images: list[Any]) -> None:
    path = make_tiny_llava("default")
    text = "Please look at <image> and describe it in detail"
    expected = [
        out for _ids, out in hf_llava_greedy(path, [(text, [images[0]]), (text, [images[1]])], MAX_NEW)
    ]
    cfg = EngineConfig(
        device="cpu",
        dtype="float32",
        cache_block_seq_len=4,
        cache_max_entry_count=128,
        enable_prefix_caching=True,
    )
    built = build_engine(str(path), cfg)
    vl = build_vl_processor(path, built.model_config.hf_config, built.tokenizer)
    assert vl is not None
    ids_a, mm_a = vl.expand(built.tokenizer.encode(text), [images[0]])
    ids_b, mm_b = vl.expand(built.tokenizer.encode(text), [images[1]])
    assert ids_a == ids_b  # equal tokens: only the image keys tell the requests apart
    first = _serve(built.engine, [("a1", ids_a, mm_a)])
    again = _serve(built.engine, [("a2", ids_a, mm_a)])
    other = _serve(built.engine, [("b", ids_b, mm_b)])
    assert first["a1"] == (expected[0], 0)
    assert again["a2"][0] == expected[0] and again["a2"][1] >= 28, "the same image should hit the cache"
    assert other["b"] == (expected[1], 0), "another image must not reuse the first image's blocks"


def test_preemption_reencodes_images(make_tiny_llava: Callable[[str], Path], images: list[Any]) -> None:
    path = make_tiny_llava("default")
    prompts = [(f"Image {i}: <image> what now?", [images[i]]) for i in range(4)]
    expected = [out for _ids, out in hf_llava_greedy(path, prompts, MAX_NEW)]
    cfg = EngineConfig(
        device="cpu",
        dtype="float32",
        cache_block_seq_len=4,
        cache_max_entry_count=20,
        max_prefill_token_num=128,
        schedule_conservativeness=0.0,  # no admission reserve: the small pool then preempts
    )
    built = build_engine(str(path), cfg)
    vl = build_vl_processor(path, built.model_config.hf_config, built.tokenizer)
    assert vl is not None
    reqs = []
    for i, (text, imgs) in enumerate(prompts):
        ids, mm = vl.expand(built.tokenizer.encode(text), imgs)
        reqs.append((str(i), ids, mm))
    got = _serve(built.engine, reqs)
    assert built.engine.scheduler.num_preemptions > 0, "the small pool was meant to force preemption"
    assert [got[str(i)][0] for i in range(4)] == expected
    assert all(not r.mm_embeds for r in built.engine.requests.values())


def test_bad_image_spans_are_refused(make_tiny_llava: Callable[[str], Path], images: list[Any]) -> None:
    path = make_tiny_llava("default")
    built = build_engine(str(path), EngineConfig(device="cpu", dtype="float32", cache_max_entry_count=16))
    vl = build_vl_processor(path, built.model_config.hf_config, built.tokenizer)
    assert vl is not None
    ids, mm = vl.expand(built.tokenizer.encode("<image> hi"), [images[1]])
    with pytest.raises(RequestError, match="image 0 fills tokens"):
        built.engine.add_request("x", ids[:10], PARAMS, mm_inputs=mm)
    assert built.engine.num_free_blocks == built.engine.num_total_blocks


def test_vision_max_batch_size_caps_encoder_batches(
    make_tiny_llava: Callable[[str], Path], images: list[Any]
) -> None:
    path = make_tiny_llava("default")
    prompts = [(f"Image {i}: <image> what now?", [images[i]]) for i in range(3)]
    expected = [out for _ids, out in hf_llava_greedy(path, prompts, MAX_NEW)]
    cfg = EngineConfig(device="cpu", dtype="float32", cache_block_seq_len=4, cache_max_entry_count=128)
    batches: dict[int, list[int]] = {}
    for cap in (1, 2):
        built = build_engine(str(path), cfg.replace(vision_max_batch_size=cap))
        model = built.engine.executor.model  # type: ignore[attr-defined]
        encode = model.encode_images
        seen: list[int] = []

        def counting(pixels: Any, encode: Any = encode, seen: list[int] = seen) -> Any:
            seen.append(len(pixels))
            return encode(pixels)

        model.encode_images = counting
        vl = build_vl_processor(path, built.model_config.hf_config, built.tokenizer)
        assert vl is not None
        reqs = []
        for i, (text, imgs) in enumerate(prompts):
            ids, mm = vl.expand(built.tokenizer.encode(text), imgs)
            reqs.append((str(i), ids, mm))
        got = _serve(built.engine, reqs)
        assert [got[str(i)][0] for i in range(3)] == expected
        batches[cap] = seen
    assert batches == {1: [1, 1, 1], 2: [2, 1]}  # all three prefills land in one step


def test_multi_step_rounds_after_the_images(
    make_tiny_llava: Callable[[str], Path], images: list[Any]
) -> None:
    """Requests with images take multi-step rounds once their prompts (images included) are
    computed, with the tokens of transformers' greedy decode."""
    path = make_tiny_llava("default")
    prompts = [(f"Image {i}: <image> tell me more", [images[i % 2]]) for i in range(3)]
    max_new = 14
    expected = [out for _ids, out in hf_llava_greedy(path, prompts, max_new)]
    cfg = EngineConfig(
        device="cpu", dtype="float32", cache_block_seq_len=4, cache_max_entry_count=256, num_scheduler_steps=4
    )
    built = build_engine(str(path), cfg)
    vl = build_vl_processor(path, built.model_config.hf_config, built.tokenizer)
    assert vl is not None
    params = GenerationConfig(max_new_tokens=max_new, ignore_eos=True)
    for i, (text, imgs) in enumerate(prompts):
        ids, mm = vl.expand(built.tokenizer.encode(text), imgs)
        built.engine.add_request(str(i), ids, params, mm_inputs=mm)
    got: dict[str, list[int]] = {}
    while built.engine.has_unfinished():
        for o in built.engine.step():
            got.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert [got[str(i)] for i in range(3)] == expected
    assert built.engine.num_multi_step_launches >= 3
    assert built.engine.num_free_blocks == built.engine.num_total_blocks
