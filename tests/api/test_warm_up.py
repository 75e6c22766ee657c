"""The start-up warm-up request (run on the GPU before serving) leaves the engine as it found it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hotloop.api.build import build_engine, warm_up
from hotloop.config import EngineConfig
from hotloop.executor.executor import LocalExecutor


def test_warm_up_runs_to_the_end_and_frees_its_blocks(make_tiny_model: Callable[[str], Path]) -> None:
    built = build_engine(
        str(make_tiny_model("llama_mha_odd")),
        EngineConfig(device="cpu", cache_block_seq_len=4, cache_max_entry_count=32),
    )
    engine = built.engine
    assert engine.num_steps == 0
    warm_up(engine)
    assert engine.num_steps >= 2  # a prefill and a decode ran
    assert engine.num_free_blocks == engine.num_total_blocks and engine.requests == {}
    assert not engine.has_unfinished()


def test_warm_up_runs_each_length_whole_even_with_prefix_caching(
    make_tiny_model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """One prompt per length the executor names, capped at what a request may hold, each prefilled
    in full (with prefix caching on, the prompts must not share blocks: a shorter query would not
    compile the longer configuration); then the executor is told the warm-up is over."""
    monkeypatch.setattr(LocalExecutor, "warm_up_prompt_lens", (64, 8, 10_000, 64))
    built = build_engine(
        str(make_tiny_model("llama_mha_odd")),
        EngineConfig(
            device="cpu", cache_block_seq_len=4, cache_max_entry_count=64, enable_prefix_caching=True
        ),
    )
    engine = built.engine
    executor = engine.executor
    longest: list[int] = []
    for name in ("execute", "launch"):
        inner = getattr(executor, name)

        def spy(out: Any, *args: Any, _inner: Any = inner) -> Any:
            longest.append(max(s.num_tokens for s in out.scheduled))
            return _inner(out, *args)

        monkeypatch.setattr(executor, name, spy)
    told: list[bool] = []
    monkeypatch.setattr(executor, "warmed_up", lambda: told.append(True))
    warm_up(engine)
    limit = engine.max_tokens_per_request - 2
    prefills = [n for n in longest if n > 1]
    assert prefills == [8, 64, limit], longest
    assert told == [True]
    assert engine.num_free_blocks == engine.num_total_blocks and engine.requests == {}
