"""Per-phase host timing of engine steps without a profiler: wraps a fixed set of the engine's,
scheduler's and GPU runner's methods (on the instances, nothing global but the runner module's
pinned-copy helper) with ``perf_counter`` accumulators.

cProfile inflates Python-heavy code several times over (4.6x on the 2-core CPU for a batch-256 decode
step, 2x on the GPU host), so its tables say what is called, not how long a plain step takes. The
wrappers cost well under a microsecond per call (about 20 calls a step), so the phases add up to
the plain step's time. Phases nest (``launch`` contains ``prepare``, ``graph replay`` and ``sample``),
each is reported inclusive.

    timer = PhaseTimer.attach(engine)
    ... engine.step() ...; timer.mark()   # after each step
    timer.report()                        # {phase: {"ms_p50", "ms_mean", "calls_per_step"}}
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# (owner path from the engine, method name, phase name); missing owners or methods are skipped
_TARGETS = (
    ("", "_drain_inbox", "engine.drain_inbox"),
    ("", "_may_overlap", "engine.may_overlap"),
    ("", "_round_steps", "engine.round_steps"),
    ("", "_update", "engine.update"),
    ("", "_update_steps", "engine.update_steps"),
    ("scheduler", "schedule", "scheduler.schedule"),
    ("scheduler", "advance", "scheduler.advance"),
    ("executor.runner", "launch", "runner.launch (total)"),
    ("executor.runner", "_graph_bucket", "runner.graph_bucket"),
    ("executor.runner", "_patch", "runner.patch_pending"),
    ("executor.runner", "_sample", "runner.sample (+ d2h copies, event)"),
    ("executor.runner", "_graph_steps", "runner.graph_steps"),
    ("executor.runner", "collect", "runner.collect (total, incl. wait)"),
    ("executor.runner", "collect_steps", "runner.collect_steps (total, incl. wait)"),
    ("executor.runner", "_wait", "runner.wait (GPU)"),
    ("executor.runner.buffers", "prepare", "buffers.prepare"),
    ("executor.runner.graphs", "run", "graphs.run (replay)"),
)


def _owner(root: Any, path: str) -> Any:
    obj = root
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


class PhaseTimer:
    """Accumulates each wrapped phase's time and calls; ``mark`` closes a step."""

    def __init__(self) -> None:
        self.acc: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.steps: list[dict[str, float]] = []
        self._last: dict[str, float] = {}
        self._last_calls: dict[str, int] = {}
        self.step_calls: list[dict[str, int]] = []

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        acc, calls = self.acc, self.calls
        acc.setdefault(name, 0.0)
        calls.setdefault(name, 0)
        clock = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                acc[name] += clock() - t0
                calls[name] += 1

        return timed

    @classmethod
    def attach(cls, engine: Any) -> PhaseTimer:
        timer = cls()
        for path, attr, name in _TARGETS:
            owner = _owner(engine, path)
            fn = getattr(owner, attr, None) if owner is not None else None
            if fn is None or not callable(fn):
                continue
            setattr(owner, attr, timer.wrap(name, fn))
        try:  # the runner's pinned copies are a module function
            from hotloop.executor import gpu_runner

            gpu_runner._to_pinned = timer.wrap("runner.to_pinned (alloc + copy)", gpu_runner._to_pinned)  # type: ignore[assignment]
        except ImportError:
            pass
        timer.reset()
        return timer

    def reset(self) -> None:
        self.steps.clear()
        self.step_calls.clear()
        self._last = dict(self.acc)
        self._last_calls = dict(self.calls)

    def mark(self, k: int = 1) -> None:
        """Close ``k`` decode steps (one ``engine.step()`` call that launched ``k``): each gets 1/k
        of the phases' time since the last mark."""
        now = dict(self.acc)
        ncalls = dict(self.calls)
        delta = {n: (now[n] - self._last.get(n, 0.0)) / k for n in now}
        dcalls = {n: ncalls[n] - self._last_calls.get(n, 0) for n in ncalls}
        self.steps += [delta] * k
        self.step_calls += [dcalls] * k
        self._last, self._last_calls = now, ncalls

    def report(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.acc:
            xs = [s.get(name, 0.0) * 1e3 for s in self.steps]
            if not xs or not any(xs):
                continue
            cs = [c.get(name, 0) for c in self.step_calls]
            out[name] = {
                "ms_p50": round(statistics.median(xs), 4),
                "ms_mean": round(statistics.fmean(xs), 4),
                "calls_per_step": round(statistics.fmean(cs), 3),
            }
        out["_threads"] = sorted(t.name for t in threading.enumerate())
        out["_switch_interval_s"] = sys.getswitchinterval()
        return out
