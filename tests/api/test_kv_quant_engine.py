"""KV int8/int4 through the real engine on the CPU: it runs end to end, sizes the pool by bytes,
and its greedy tokens stay close to the float cache's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from test_engine_parity import make_prompts, run_engine

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig
from hotloop.executor.kv_cache import block_bytes

MAX_NEW = 8


@pytest.mark.parametrize("arch", ["llama_gqa_llama3rope"])
def test_engine_runs_with_quantized_kv(arch: str, make_tiny_model: Callable[[str], Path]) -> None:
    path = make_tiny_model(arch)
    prompts = make_prompts(seed=11, n=6)
    base: dict[str, Any] = dict(device="cpu", dtype="float32", max_batch_size=6, cache_block_seq_len=4)
    ref, _ = run_engine(path, EngineConfig(cache_max_entry_count=256, **base), prompts, MAX_NEW)
    first_agree = {}
    for policy in (8, 4):
        # a small pool also forces preemption and recompute through the quantized cache
        cfg = EngineConfig(cache_max_entry_count=24, quant_policy=policy, **base)
        got, stats = run_engine(path, cfg, prompts, MAX_NEW)
        assert all(len(g) == MAX_NEW for g in got)
        first_agree[policy] = sum(g[0] == r[0] for g, r in zip(got, ref, strict=True)) / len(ref)
        built = build_engine(str(path), cfg)
        k_cache, _ = built.engine.executor.kv_caches[0]
        assert k_cache.dtype == torch.uint8 and k_cache.shape[0] == 24
    assert first_agree[8] == 1.0, first_agree
    assert first_agree[4] >= 0.5, first_agree


def test_block_bytes_follow_the_policy(make_tiny_model: Callable[[str], Path]) -> None:
    from hotloop.models.loader import model_config_from_path

    mc = model_config_from_path(make_tiny_model("qwen3_qknorm"), "float16")  # head_dim 32
    b16 = block_bytes(mc, 64, torch.float16)
    assert b16 / block_bytes(mc, 64, torch.float16, 8) == pytest.approx(64 / 36)
    assert b16 / block_bytes(mc, 64, torch.float16, 4) == pytest.approx(64 / 20)
