"""Counting Triton's kernel compilations, and reporting those that happen while serving.

Triton compiles a kernel variant the first time a launch needs it: a new constexpr value, an
integer argument that is 1 or a multiple of 16, a pointer's 16-byte alignment. On the GPU host that
takes 0.1-2 s, and every request of the step waits for it; a serving run whose mixed steps each
compiled a prefill variant had a p99 time to first token of 1.3 s instead of 0.13 s. The engine's
warm-up is meant to compile every variant before serving; this module tells when it did not.

``install()`` sets Triton's ``jit_cache_hook`` (called before a compile, or before a load from
Triton's disk cache, which takes milliseconds) and ``jit_post_compile_hook`` (after it), chaining to
hooks already set, and times each. ``arm()`` marks the end of the warm-up: each later compile or
load logs a warning that names the kernel, its time and its constexprs (a load too: on a cold disk
cache it would have been a compile); ``disarm()`` (an engine starting) undoes it. ``stats()`` gives
the counts (the server exports them on /metrics). Under Triton's async compile mode the time runs to
the compile's finalization.

Installing the cache hook makes Triton serialize each compile's specialization to JSON first, so a
constexpr that JSON cannot hold (a ``JITFunction``) would fail to launch; hotloop's kernels take
ints, bools, strings and ``tl`` dtypes only.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from hotloop.utils.logging import get_logger

logger = get_logger(__name__)


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

    def record(self, name: str, seconds: float, variant: str) -> None:
        with self.lock:
            s = self.stats
            if self.armed:
                self.stats = CompileStats(s.startup, s.startup_s, s.serving + 1, s.serving_s + seconds)
            else:
                self.stats = CompileStats(s.startup + 1, s.startup_s + seconds, s.serving, s.serving_s)
        if self.armed:
            logger.warning(
                "Triton compiled (or loaded from its disk cache) %s after the warm-up (%.2f s; requests "
                "in that step waited): a kernel variant the warm-up did not cover; please report it "
                "with this line. Variant: %s",
                name,
                seconds,
                variant,
            )


_watch = _Watch()


def _ident(kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """One compile's identity: its kernel (Triton's key names only the specialization) and key."""
    fn = kwargs.get("fn")
    key = kwargs.get("key")
    try:
        hash(key)
    except TypeError:
        key = repr(key)
    return id(getattr(fn, "jit_function", fn)), key


def _variant(kwargs: dict[str, Any]) -> str:
    """The constexprs and launch options of a compile, for the report (Triton's repr is terse)."""
    info = kwargs.get("compile") or {}
    parts = [f"constants {info.get('constants')}"]
    parts += [f"{k} {info[k]}" for k in ("num_warps", "num_stages") if k in info]
    return ", ".join(parts)


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
        ident = _ident(kwargs)
        _watch.started[ident] = time.perf_counter()
        skip = before(**kwargs) if before is not None else None
        if skip:  # an earlier hook skips this compile: no post-compile call will come
            _watch.started.pop(ident, None)
        return skip

    def post_compile_hook(**kwargs: Any) -> Any:
        t0 = _watch.started.pop(_ident(kwargs), None)
        fn = kwargs.get("fn")
        name = str(getattr(fn, "name", fn))
        _watch.record(name, time.perf_counter() - t0 if t0 is not None else 0.0, _variant(kwargs))
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
