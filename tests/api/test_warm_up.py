"""The start-up warm-up request (run on the GPU before serving) leaves the engine as it found it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hotloop.api.build import build_engine, warm_up
from hotloop.config import EngineConfig


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
