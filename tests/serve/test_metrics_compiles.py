"""/metrics exposes Triton compile counts by phase, read from the executor at scrape time."""

from __future__ import annotations

import types

from hotloop.engine.block_manager import BlockManager
from hotloop.serve.metrics import ServerMetrics


def _engine(executor: object | None) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        block_manager=BlockManager(num_blocks=4, block_size=2),
        scheduler=types.SimpleNamespace(num_running=0, num_waiting=0),
        num_free_blocks=4,
        num_total_blocks=4,
        executor=executor,
    )


def test_compile_counts_by_phase() -> None:
    stats = [(3, 1.5, 0, 0.0)]
    executor = types.SimpleNamespace(compile_stats=lambda: stats[0])
    m = ServerMetrics(_engine(executor))
    text = m.render().decode()
    assert 'hotloop:kernel_compiles_total{phase="startup"} 3.0' in text
    assert 'hotloop:kernel_compiles_total{phase="serving"} 0.0' in text
    stats[0] = (3, 1.5, 2, 0.75)  # read again at the next scrape
    text = m.render().decode()
    assert 'hotloop:kernel_compiles_total{phase="serving"} 2.0' in text
    assert 'hotloop:kernel_compile_seconds_total{phase="serving"} 0.75' in text


def test_an_executor_without_counts_reads_zero() -> None:
    text = ServerMetrics(_engine(None)).render().decode()
    assert 'hotloop:kernel_compiles_total{phase="serving"} 0.0' in text
