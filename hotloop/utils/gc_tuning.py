"""The garbage collector's settings for a long-running engine process (``hotloop serve``, ``hotloop
bench``): what exists after start-up lives until exit, and what the engine loop allocates per step is
short-lived and acyclic.

With CPython's defaults, a batch-256 decode step allocates enough containers (one sampled-token and
one output object per request, lists) to trigger a young-generation collection every step, and every
few hundred steps a full collection walks every object made at start-up (torch, transformers and
the model's modules): ``benchmarks/host_step.py --runner gpu --gc python`` measured 1.17-1.44 ms of
host time per step on average, against 0.80-0.87 ms with the settings below (2-core machine,
2026-11-30).

:func:`settle_after_startup` runs one collection, moves every surviving object to the permanent
generation (``gc.freeze``, as vLLM and SGLang do after start-up) and raises the young-generation
threshold. It is called by the CLI entry points once the engine is built, not by ``build_engine``
itself: a process that builds and drops several engines (tests, notebooks) would keep frozen
cycles alive. ``HOTLOOP_GC_FREEZE=0`` leaves the collector alone.
"""

from __future__ import annotations

import gc
import logging
import os

logger = logging.getLogger(__name__)

YOUNG_THRESHOLD = 20_000  # container allocations between young-generation collections (default 700)
OLDER_THRESHOLDS = (20, 20)  # collections of the younger generation between older ones (default 10, 10)


def settle_after_startup() -> bool:
    """Collect once, freeze what survives start-up and raise the collection thresholds; False (and
    nothing changed) when ``HOTLOOP_GC_FREEZE=0``."""
    if os.environ.get("HOTLOOP_GC_FREEZE", "1") == "0":
        return False
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    logger.debug("gc: %d start-up objects frozen, thresholds %s", gc.get_freeze_count(), gc.get_threshold())
    return True
