"""``hotloop/config.py``: ``EngineConfig``'s cache size reads as on the command line."""

from __future__ import annotations

import pytest

from hotloop.config import ConfigError, EngineConfig


def test_cache_max_entry_count_one_is_all_memory() -> None:
    """``1`` (int or float) is the whole of the free memory, as the CLI and LMDeploy read it; an int
    from 2 is a block count; anything else is refused by name."""
    assert EngineConfig(cache_max_entry_count=1).cache_max_entry_count == 1.0
    assert isinstance(EngineConfig(cache_max_entry_count=1).cache_max_entry_count, float)
    assert EngineConfig(cache_max_entry_count=1.0).cache_max_entry_count == 1.0
    assert EngineConfig(cache_max_entry_count=2).cache_max_entry_count == 2
    assert isinstance(EngineConfig(cache_max_entry_count=512).cache_max_entry_count, int)
    for bad in (0, -3, 0.0, 1.5, True, "0.8"):
        with pytest.raises(ConfigError, match="cache_max_entry_count"):
            EngineConfig(cache_max_entry_count=bad)  # type: ignore[arg-type]
