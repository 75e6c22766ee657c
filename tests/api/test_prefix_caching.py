"""Prefix caching through the real engine on the CPU: hits give the cold run's greedy tokens.

Tiny random checkpoints: requests that share a long prefix run with caching on (some arriving
after the prefix was computed, some at once, some after it was evicted) and must produce exactly
the tokens of a run with caching off. Multi-turn ``pipe.chat`` hits the cache.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tiny_archs import TINY_VOCAB

from hotloop import EngineConfig, GenerationConfig, pipeline
from hotloop.api.build import build_engine
from hotloop.engine.engine import Engine

MAX_NEW = 6


def shared_prefix_prompts(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, TINY_VOCAB) for _ in range(21)]
    prompts = [prefix + [rng.randrange(3, TINY_VOCAB) for _ in range(rng.randrange(1, 9))] for _ in range(5)]
    prompts.append(list(prefix[:12]))  # a whole cached prefix: the last token is recomputed
    prompts.append(list(prefix))
    return prompts


def drive(engine: Engine, prompts: list[list[int]], arrivals: list[int]) -> tuple[list[list[int]], list[int]]:
    params = GenerationConfig(max_new_tokens=MAX_NEW, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    cached: dict[str, int] = {}
    step = 0
    while len(cached) < len(prompts):
        for i, at in enumerate(arrivals):
            if at == step:
                engine.add_request(str(i), prompts[i], params)
        for o in engine.step():
            tokens[o.request_id] = tokens.get(o.request_id, []) + o.new_token_ids
            if o.finished:
                cached[o.request_id] = o.cached_tokens
        step += 1
        assert step < 500
    assert engine.num_free_blocks == engine.num_total_blocks
    engine.block_manager.check_consistency()
    n = len(prompts)
    return [tokens[str(i)] for i in range(n)], [cached[str(i)] for i in range(n)]


@pytest.mark.parametrize(
    ("arch", "pool"),
    [("mistral_window", 512), ("qwen3_qknorm", 14)],
)
def test_hits_match_cold_run(arch: str, pool: int, make_tiny_model: Callable[[str], Path]) -> None:
    path = make_tiny_model(arch)
    prompts = shared_prefix_prompts(seed=len(arch))
    arrivals = [0, 0, 3, 3, 12, 12, 30]  # together, after the prefix is cached, and much later
    base: dict[str, Any] = dict(device="cpu", dtype="float32", cache_block_seq_len=4, max_batch_size=4)
    cold, cold_cached = drive(
        build_engine(str(path), EngineConfig(cache_max_entry_count=pool, **base)).engine, prompts, arrivals
    )
    engine = build_engine(
        str(path), EngineConfig(cache_max_entry_count=pool, enable_prefix_caching=True, **base)
    ).engine
    warm, warm_cached = drive(engine, prompts, arrivals)
    assert warm == cold
    assert cold_cached == [0] * len(prompts)
    assert warm_cached[0] == 0 and warm_cached[2] >= 20, warm_cached
    assert warm_cached[5] == 8  # 12 tokens, all cached: the last block is recomputed
    bm = engine.block_manager
    assert bm.prefix_hits == sum(warm_cached) or pool < 64  # preemption re-queries
    assert 0 < bm.prefix_hits < bm.prefix_queries
    # a second pass of the same prompts hits again and still matches
    again, _ = drive(engine, prompts, arrivals)
    assert again == cold


def test_prefix_caching_with_kv_int8(make_tiny_model: Callable[[str], Path]) -> None:
    path = make_tiny_model("qwen2_bias")
    prompts = shared_prefix_prompts(seed=7)
    arrivals = [0, 0, 3, 3, 12, 12, 30]
    base: dict[str, Any] = dict(
        device="cpu", dtype="float32", cache_block_seq_len=4, quant_policy=8, cache_max_entry_count=256
    )
    cold, _ = drive(build_engine(str(path), EngineConfig(**base)).engine, prompts, arrivals)
    warm, cached = drive(
        build_engine(str(path), EngineConfig(enable_prefix_caching=True, **base)).engine, prompts, arrivals
    )
    assert warm == cold and sum(cached) > 0


def test_multi_turn_chat_hits_the_cache(make_tiny_model: Callable[[str], Path]) -> None:
    path = str(make_tiny_model("llama_gqa_llama3rope"))
    cfg = EngineConfig(
        device="cpu", cache_max_entry_count=64, cache_block_seq_len=8, enable_prefix_caching=True
    )
    gen = GenerationConfig(max_new_tokens=8, ignore_eos=True)
    with pipeline(path, backend_config=cfg) as pipe:
        s = pipe.chat("Name a fruit.", gen_config=gen)
        assert s.response is not None and s.response.cached_tokens == 0
        s = pipe.chat("And a vegetable?", session=s, gen_config=gen)
        second = s.response
        assert second is not None and second.cached_tokens >= 8
        bm = pipe.engine.block_manager
        assert bm.prefix_hits == second.cached_tokens
    # the same conversation without the cache gives the same tokens
    with pipeline(path, backend_config=cfg.replace(enable_prefix_caching=False)) as cold:
        c = cold.chat("Name a fruit.", gen_config=gen)
        c = cold.chat("And a vegetable?", session=c, gen_config=gen)
        assert c.response is not None and c.response.token_ids == second.token_ids
