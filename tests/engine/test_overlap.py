"""Overlapped scheduling gives the same outputs as collecting every step, and leaks nothing.

A mix of requests (greedy, seeded sampling, logprobs, stop strings and stop ids, min_new_tokens,
penalties, different lengths) joins at different steps; every output field must be identical with
``disable_overlap_schedule`` on and off, the overlapped run must really have overlapped, and the
pool must be full at the end. Aborts, preemption and prefix caching are covered as well.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tiny_archs import TINY_VOCAB

from hotloop.api.build import build_engine
from hotloop.config import EngineConfig
from hotloop.engine.engine import Engine
from hotloop.messages import GenerationConfig

ARCH = "llama_gqa_llama3rope"


def _params(i: int) -> GenerationConfig:
    kinds: list[dict[str, Any]] = [
        dict(max_new_tokens=12, ignore_eos=True),
        dict(max_new_tokens=9, do_sample=True, temperature=0.9, top_k=20, random_seed=7 + i, ignore_eos=True),
        dict(max_new_tokens=8, logprobs=3, ignore_eos=True),
        dict(max_new_tokens=16, stop_token_ids=[5, 9, 11, 13]),
        dict(max_new_tokens=14, min_new_tokens=6, stop_token_ids=[5, 9, 11, 13]),
        dict(max_new_tokens=10, repetition_penalty=1.3, ignore_eos=True),
        dict(max_new_tokens=10, do_sample=True, top_p=0.8, random_seed=3, logprobs=1, ignore_eos=True),
        dict(max_new_tokens=15, stop_words=["e", "a"], ignore_eos=True),
    ]
    return GenerationConfig(**kinds[i % len(kinds)])


def _prompts(n: int, seed: int = 11) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, TINY_VOCAB) for _ in range(rng.randrange(3, 30))] for _ in range(n)]


def _run(
    engine: Engine, prompts: list[list[int]], abort: dict[int, int] | None = None
) -> dict[str, list[tuple[Any, ...]]]:
    """Drive the engine; request i joins at step i // 2; ``abort`` maps request -> step to abort it."""
    abort = abort or {}
    got: dict[str, list[tuple[Any, ...]]] = {}
    step = 0
    done: set[str] = set()
    while len(done) < len(prompts):
        for i, p in enumerate(prompts):
            if i // 2 == step:
                engine.add_request(str(i), p, _params(i))
            if abort.get(i) == step:
                engine.abort_request(str(i))
        for o in engine.step():
            lps = [(lp.token_id, round(lp.logprob, 4), sorted(lp.top)) for lp in o.logprobs]
            got.setdefault(o.request_id, []).append(
                (tuple(o.new_token_ids), o.new_text, o.finish_reason, o.num_generated_tokens, tuple(lps))
            )
            if o.finished:
                done.add(o.request_id)
        step += 1
        assert step < 500
    assert not engine.has_unfinished()
    assert engine.num_free_blocks == engine.num_total_blocks
    engine.block_manager.check_consistency()
    return got


def _engine(path: Path, overlap: bool, **kw: Any) -> Engine:
    cfg = dict(
        device="cpu", dtype="float32", max_batch_size=8, cache_block_seq_len=4, cache_max_entry_count=512
    )
    cfg.update(kw)
    return build_engine(str(path), EngineConfig(disable_overlap_schedule=not overlap, **cfg)).engine


def _tokens(got: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[int]]:
    return {rid: [t for o in outs for t in o[0]] for rid, outs in got.items()}


@pytest.mark.parametrize(
    "variant",
    [
        {},
        {"max_prefill_token_num": 7},  # chunked prefill mixed with decodes
        # preemption (without the admission reserve, which would avoid it)
        {"cache_max_entry_count": 14, "max_prefill_token_num": 64, "schedule_conservativeness": 0.0},
    ],
    ids=["plain", "chunked", "preempt"],
)
def test_overlap_outputs_equal_collecting_every_step(
    variant: dict[str, Any], make_tiny_model: Callable[[str], Path]
) -> None:
    path = make_tiny_model(ARCH)
    prompts = _prompts(12)
    sync = _engine(path, overlap=False, **variant)
    expected = _run(sync, prompts)
    assert sync.num_overlapped_steps == 0
    over = _engine(path, overlap=True, **variant)
    got = _run(over, prompts)
    assert over.num_overlapped_steps > over.num_steps // 3, (over.num_overlapped_steps, over.num_steps)
    if "cache_max_entry_count" in variant:
        assert sync.scheduler.num_preemptions > 0 and over.scheduler.num_preemptions > 0
    assert got == expected
    finish = {outs[-1][2] for outs in got.values()}
    assert {"stop", "length"} <= finish, "the mix should end some requests on a stop and some on length"


def test_abort_in_flight_keeps_other_outputs_and_frees_blocks(make_tiny_model: Callable[[str], Path]) -> None:
    path = make_tiny_model(ARCH)
    prompts = _prompts(8, seed=5)
    baseline = _tokens(_run(_engine(path, overlap=True), prompts))
    got = _run(_engine(path, overlap=True), prompts, abort={0: 3, 3: 4, 6: 5})
    for rid in ("0", "3", "6"):
        assert got[rid][-1][2] == "abort"
    for rid, toks in _tokens(got).items():
        if rid not in ("0", "3", "6"):
            assert toks == baseline[rid], rid


def test_overlap_with_prefix_caching_hits_and_matches(make_tiny_model: Callable[[str], Path]) -> None:
    path = make_tiny_model(ARCH)
    shared = _prompts(1, seed=2)[0] * 2
    prompts = [shared + p for p in _prompts(6, seed=9)]
    cold = _tokens(_run(_engine(path, overlap=False), prompts))
    engine = _engine(path, overlap=True, enable_prefix_caching=True)
    first = _tokens(_run(engine, prompts))
    hits = engine.block_manager.prefix_hits
    assert hits > 0, "later requests share the first one's prefix"
    again = _tokens(_run(engine, prompts))
    assert engine.block_manager.prefix_hits > hits
    assert first == cold and again == cold
