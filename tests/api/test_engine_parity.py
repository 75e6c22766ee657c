"""Greedy parity with transformers through the whole engine (scheduler, paged cache, sampler).

For tiny random checkpoints of every turbo architecture, 8 prompts of different lengths arrive at
different steps; hotloop's greedy tokens must equal transformers' ``generate`` run on each prompt
alone. Variants force many blocks per sequence (block size 4), chunked prefill (a small
``max_prefill_token_num``) and preemption (a small block pool). After every run the pool is full.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_archs import TINY_ARCHS, TINY_VOCAB

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig
from hotloop.messages import GenerationConfig

MAX_NEW = 10


def hf_greedy(path: Path, prompts: list[list[int]], max_new: int) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), torch_dtype=torch.float32)
    model.generation_config.eos_token_id = None
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            g = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new,
                do_sample=False,
                pad_token_id=0,
            )
            outs.append(g[0, len(p) :].tolist())
    return outs


def make_prompts(seed: int, n: int = 8) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, TINY_VOCAB) for _ in range(rng.randrange(3, 40))] for _ in range(n)]


def run_engine(
    path: Path, cfg: EngineConfig, prompts: list[list[int]], max_new: int
) -> tuple[list[list[int]], dict]:
    return run_engine_built(build_engine(str(path), cfg), prompts, max_new)


def run_engine_built(built: Any, prompts: list[list[int]], max_new: int) -> tuple[list[list[int]], dict]:
    engine = built.engine
    params = GenerationConfig(max_new_tokens=max_new, ignore_eos=True)
    results: dict[str, list[int]] = {}
    finished: set[str] = set()
    arrivals = {i: 2 * i // 3 for i in range(len(prompts))}  # a few requests join at each step
    step = 0
    while len(finished) < len(prompts):
        for i, at in arrivals.items():
            if at == step:
                engine.add_request(str(i), prompts[i], params)
        for o in engine.step():
            results.setdefault(o.request_id, [])
            results[o.request_id] = results[o.request_id] + o.new_token_ids
            assert o.finish_reason in (None, "length")
            if o.finished:
                assert o.num_generated_tokens == max_new
                finished.add(o.request_id)
        step += 1
        assert step < 1000
    assert engine.num_free_blocks == engine.num_total_blocks
    engine.block_manager.check_consistency()
    stats = {"preemptions": engine.scheduler.num_preemptions, "steps": step}
    return [results[str(i)] for i in range(len(prompts))], stats


VARIANTS = {
    "plain": dict(cache_block_seq_len=4, cache_max_entry_count=512),
    "chunked": dict(cache_block_seq_len=4, cache_max_entry_count=512, max_prefill_token_num=7),
    # (no admission reserve, which would avoid the preemption)
    "preempt": dict(
        cache_block_seq_len=4,
        cache_max_entry_count=16,
        max_prefill_token_num=64,
        schedule_conservativeness=0.0,
    ),
}


@pytest.mark.parametrize("arch", sorted(TINY_ARCHS))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_greedy_parity(arch: str, variant: str, make_tiny_model: Callable[[str], Path]) -> None:
    path = make_tiny_model(arch)
    prompts = make_prompts(seed=sum(map(ord, arch)))
    expected = hf_greedy(path, prompts, MAX_NEW)
    cfg = EngineConfig(device="cpu", dtype="float32", max_batch_size=8, **VARIANTS[variant])
    got, stats = run_engine(path, cfg, prompts, MAX_NEW)
    if variant == "preempt":
        assert stats["preemptions"] > 0, "the small pool was meant to force preemption"
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g == e, f"prompt {i} (len {len(prompts[i])}): hotloop {g} != transformers {e}"
