"""Counting Triton's kernel compilations, and reporting those that happen while serving.

Triton compiles a kernel variant the first time a launch needs it: a new constexpr value, an
integer argument that is 1 or a multiple of 16, a pointer's 16-byte alignment. On the GPU host that
takes 0.1-2 s, and every request of the step waits for it; a serving run whose mixed steps each
compiled a prefill variant had a p99 time to first token of 1.3 s instead of 0.13 s. The engine's
warm-up is meant to compile every variant before serving; this module tells when it did not.

``install()`` sets Triton's ``jit_cache_hook`` (called before a compile, or before a load from
Triton's disk cache) and ``jit_post_compile_hook`` (after it), chaining to hooks already set, and
times each compile. ``arm()`` marks the end of the warm-up: each later compile logs a warning that
names the kernel and its time; ``disarm()`` (an engine starting) undoes it. ``stats()`` gives the counts (the server exports them on /metrics).
Compiles run in the launching thread, so a start time per key is enough.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

SLOW_S = 0.05  # a compile (not a disk-cache load) takes longer than this; shorter ones log at INFO


@dataclass(frozen=True)
class CompileStats:
    """Compiles (and disk-cache loads) seen since ``install``: before and after ``arm``."""

    startup: int = 0
    startup_s: float = 0.0
    serving: int = 0
    serving_s: float = 0.0


class _Watch:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.installed = False
        self.armed = False
        self.stats = CompileStats()
        self.started: dict[Any, float] = {}

    def record(self, name: str, seconds: float) -> None:
        with self.lock:
            s = self.stats
            if self.armed:
                self.stats = CompileStats(s.startup, s.startup_s, s.serving + 1, s.serving_s + seconds)
            else:
                self.stats = CompileStats(s.startup + 1, s.startup_s + seconds, s.serving, s.serving_s)
        if self.armed:
            log = logger.warning if seconds >= SLOW_S else logger.info
            log(
                "Triton compiled %s after the warm-up (%.2f s; requests in that step waited). "
                "A kernel variant the warm-up did not cover: please report it with this line.",
                name,
                seconds,
            )


_watch = _Watch()


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        return repr(key)
    return key


def install() -> bool:
    """Install the hooks once per process; False where this Triton has no JIT hooks."""
    try:
        from triton import knobs
    except ImportError:
        return False
    runtime = knobs.runtime
    if not hasattr(runtime, "jit_cache_hook") or not hasattr(runtime, "jit_post_compile_hook"):
        return False
    with _watch.lock:
        if _watch.installed:
            return True
        _watch.installed = True
    before, after = runtime.jit_cache_hook, runtime.jit_post_compile_hook

    def cache_hook(**kwargs: Any) -> Any:
        _watch.started[_hashable(kwargs.get("key"))] = time.perf_counter()
        return before(**kwargs) if before is not None else None

    def post_compile_hook(**kwargs: Any) -> Any:
        t0 = _watch.started.pop(_hashable(kwargs.get("key")), None)
        fn = kwargs.get("fn")
        name = str(getattr(fn, "name", fn))
        _watch.record(name, time.perf_counter() - t0 if t0 is not None else 0.0)
        return after(**kwargs) if after is not None else None

    runtime.jit_cache_hook = cache_hook
    runtime.jit_post_compile_hook = post_compile_hook
    return True


def arm() -> None:
    """The warm-up is over: compiles from now on are reported."""
    _watch.armed = True


def disarm() -> None:
    """An engine is starting (another in the same process, say): compiles count as start-up again."""
    _watch.armed = False


def stats() -> CompileStats:
    return _watch.stats
