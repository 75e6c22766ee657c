"""/metrics exposes the prefix cache's query and hit counts from the block manager."""

from __future__ import annotations

import types

from hotloop.engine.block_manager import BlockManager
from hotloop.serve.metrics import ServerMetrics


def test_prefix_cache_counters_follow_the_block_manager() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    engine = types.SimpleNamespace(
        block_manager=bm,
        scheduler=types.SimpleNamespace(num_running=0, num_waiting=0),
        num_free_blocks=4,
        num_total_blocks=4,
    )
    m = ServerMetrics(engine)
    bm.prefix_queries, bm.prefix_hits = 10, 4
    text = m.render().decode()
    assert "hotloop:prefix_cache_queries_total 10.0" in text
    assert "hotloop:prefix_cache_hits_total 4.0" in text
