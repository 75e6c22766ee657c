"""utils/gc_tuning.py: the collector settings of a long-running engine process."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from hotloop.utils import gc_tuning


@pytest.fixture
def restore_gc() -> Iterator[None]:
    old = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*old)


def test_settle_freezes_survivors_and_raises_thresholds(
    restore_gc: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HOTLOOP_GC_FREEZE", raising=False)
    gc.unfreeze()
    survivor = [object()]  # a live container made before the call
    assert gc.is_tracked(survivor)
    assert gc_tuning.settle_after_startup() is True
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (gc_tuning.YOUNG_THRESHOLD, *gc_tuning.OLDER_THRESHOLDS)
    # frozen objects are not in any generation the collector walks
    assert not any(o is survivor for o in gc.get_objects())
    # cycles made afterwards are still collected
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1


def test_settle_can_be_turned_off(restore_gc: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOTLOOP_GC_FREEZE", "0")
    gc.unfreeze()
    before = gc.get_threshold()
    assert gc_tuning.settle_after_startup() is False
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
