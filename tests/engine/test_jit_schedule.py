"""Just-in-time scheduling: on a virtual clock, a request that arrives while a step runs joins the
next launch instead of the one after; outputs do not change; a missing estimate never waits."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import pytest

import hotloop.engine.engine as engine_module
from hotloop.config import CacheConfig, ModelConfig, SchedulerConfig
from hotloop.engine.engine import Engine
from hotloop.engine.outputs import SampledToken
from hotloop.engine.scheduler import SchedulerOutput
from hotloop.messages import GenerationConfig

STEP_S = 0.010


class VirtualClock:
    """``time`` for the engine: ``sleep`` advances virtual time and fires the events it passes."""

    def __init__(self) -> None:
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []

    def at(self, t: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t, len(self._events), fn))

    def perf_counter(self) -> float:
        return self.now

    monotonic = perf_counter

    def sleep(self, seconds: float) -> None:
        end = self.now + max(0.0, seconds)
        while self._events and self._events[0][0] <= end:
            t, _, fn = heapq.heappop(self._events)
            self.now = max(self.now, t)
            fn()
        self.now = end


class ByteTok:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", "replace")


class ClockedExecutor:
    """Each step takes ``STEP_S`` of virtual device time on one stream; token = (prev + 1) % 200."""

    def __init__(self, clock: VirtualClock, estimates: bool = True) -> None:
        self.clock = clock
        self.estimates = estimates
        self.free_at = 0.0
        self.launches: list[tuple[float, list[str]]] = []  # (device start, request ids) per step

    def launch(self, out: SchedulerOutput) -> tuple[float, list[int]]:
        start = max(self.clock.now, self.free_at)  # when the device gets to this step
        self.free_at = start + STEP_S
        self.launches.append((start, [s.request.request_id for s in out.scheduled]))
        ids = []
        for s in out.scheduled:
            if s.samples:
                r = s.request
                ids.append(
                    (len(r.prompt_token_ids) + len(r.output_token_ids) + r.num_pending_tokens) % 200 + 1
                )
        return self.free_at, ids

    def collect(self, handle: tuple[float, list[int]]) -> list[SampledToken]:
        end, ids = handle
        self.clock.sleep(end - self.clock.now)
        return [SampledToken(t) for t in ids]

    def execute(self, out: SchedulerOutput) -> list[SampledToken]:
        return self.collect(self.launch(out))

    def estimate_s(self, out: SchedulerOutput) -> float | None:
        return STEP_S if self.estimates else None


def run(
    jit: bool, monkeypatch: pytest.MonkeyPatch, estimates: bool = True
) -> tuple[Any, float, dict[str, list[int]]]:
    clock = VirtualClock()
    monkeypatch.setattr(engine_module, "time", clock)
    mc = ModelConfig("toy", "ToyForCausalLM", None, 1, 1, 8, 260, 512, "float32", (256,))
    ex = ClockedExecutor(clock, estimates)
    eng = Engine(
        ex, ByteTok(), mc, CacheConfig(16, 64), SchedulerConfig(8, 512, 512), overlap=True, jit_schedule=jit
    )
    params = GenerationConfig(max_new_tokens=12, ignore_eos=True)
    eng.add_request("a", [5, 6, 7], params)
    arrival = 0.045  # in the middle of a step
    clock.at(arrival, lambda: eng.add_request("b", [8, 9], params))
    tokens: dict[str, list[int]] = {"a": [], "b": []}
    for _ in range(200):
        for o in eng.step():
            tokens[o.request_id] += o.new_token_ids
        if not eng.has_unfinished() and tokens["b"]:
            break
        if not eng.has_unfinished():
            clock.sleep(0.001)  # idle until b arrives
    first_b = next(t for t, ids in ex.launches if "b" in ids)
    return eng, first_b - arrival, tokens


def test_late_arrival_joins_the_next_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    eng_jit, delay_jit, out_jit = run(True, monkeypatch)
    _eng, delay, out = run(False, monkeypatch)
    assert out_jit == out and len(out["a"]) == len(out["b"]) == 12  # timing only, never outputs
    # b arrives mid-step. Overlap had already launched the step after the running one, so b's step
    # starts on the device one step later than it could; just in time, it is the very next step.
    assert delay == pytest.approx(1.5 * STEP_S)
    assert delay_jit == pytest.approx(0.5 * STEP_S)
    assert eng_jit.jit_wait_s > 0


def test_no_estimate_no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    eng, delay, _ = run(True, monkeypatch, estimates=False)
    assert eng.jit_wait_s == 0.0 and delay == pytest.approx(1.5 * STEP_S)
