"""AsyncEngine over a real ``Engine`` with a toy executor: streams, abort on early exit, idle
waiting without spinning, failure propagation and shutdown."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from toy_engine import toy_model_config

from hotloop.config import CacheConfig, SchedulerConfig
from hotloop.engine.async_engine import AsyncEngine, EngineDeadError
from hotloop.engine.engine import Engine
from hotloop.engine.outputs import SampledToken
from hotloop.engine.scheduler import SchedulerOutput
from hotloop.messages import GenerationConfig, RequestError

EOS = 0


class Tokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(96 + t) for t in ids if t)


class Executor:
    """Next token = previous + 1 (mod 26, skipping EOS); ``gate`` lets a test hold steps back."""

    def __init__(self) -> None:
        self.calls = 0
        self.delay = 0.0
        self.fail = False
        self.gate = threading.Event()
        self.gate.set()

    def execute(self, out: SchedulerOutput) -> list[SampledToken]:
        self.gate.wait()
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("boom")
        res = []
        for s in out.scheduled:
            if s.samples:
                last = (s.request.prompt_token_ids + s.request.output_token_ids)[-1]
                res.append(SampledToken(last % 26 + 1))
        return res


def make_engine(num_blocks: int = 32) -> Engine:
    mc = toy_model_config(27, 128, EOS, head_dim=4)
    return Engine(
        Executor(),
        Tokenizer(),
        mc,
        CacheConfig(block_size=4, num_blocks=num_blocks),
        SchedulerConfig(max_batch_size=8, max_prefill_token_num=64, session_len=128),
    )


def params(n: int) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=n)


@pytest.fixture
def aengine():
    ae = AsyncEngine(make_engine())
    yield ae
    ae.shutdown(timeout=5)


def test_streams_deliver_every_token_in_order(aengine: AsyncEngine) -> None:
    async def collect(rid: str, prompt: list[int], n: int) -> tuple[list[int], str, str | None]:
        ids, text, reason = [], "", None
        async for o in aengine.generate(prompt, params(n), rid):
            ids += o.new_token_ids
            text += o.new_text
            reason = o.finish_reason
        return ids, text, reason

    async def main() -> list[tuple[list[int], str, str | None]]:
        return await asyncio.gather(collect("a", [1, 2], 5), collect("b", [10], 3), collect("c", [25], 4))

    a, b, c = asyncio.run(main())
    assert a == ([3, 4, 5, 6, 7], "cdefg", "length")
    assert b == ([11, 12, 13], "klm", "length")
    assert c == ([26, 1, 2, 3], "zabc", "length")
    assert aengine.engine.num_free_blocks == aengine.engine.num_total_blocks
    assert aengine.num_open_streams == 0


def test_stopping_early_aborts_and_frees_blocks(aengine: AsyncEngine) -> None:
    engine = aengine.engine
    engine.executor.delay = 0.002  # 100 tokens take 0.2 s: the consumers leave long before

    async def main() -> None:
        agen = aengine.generate([1, 2, 3], params(100), "r1")
        first = await agen.__anext__()
        assert first.new_token_ids == [4]
        await agen.aclose()  # the consumer goes away (what a client disconnect does)

        async def consume() -> None:
            async for _ in aengine.generate([5], params(100), "r2"):
                pass

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    deadline = time.monotonic() + 5
    while engine.num_free_blocks != engine.num_total_blocks or engine.requests:
        assert time.monotonic() < deadline, "aborted requests kept their blocks"
        time.sleep(0.005)
    assert aengine.num_open_streams == 0


def test_idle_loop_sleeps_instead_of_spinning(aengine: AsyncEngine) -> None:
    executor = aengine.engine.executor

    async def once() -> None:
        async for _ in aengine.generate([1], params(2), "x"):
            pass

    asyncio.run(once())
    calls = executor.calls
    time.sleep(0.2)
    assert executor.calls == calls
    assert aengine.is_alive


def test_bad_request_raises_at_once_and_leaves_nothing(aengine: AsyncEngine) -> None:
    async def main() -> None:
        with pytest.raises(RequestError) as e:
            aengine.add_request("bad", [1, 99], params(2))  # 99 is outside the vocabulary
        assert e.value.param == "prompt"
        with pytest.raises(RequestError):
            aengine.add_request("long", [1], params(500))  # over session_len
        s = aengine.add_request("dup", [1], params(50))
        with pytest.raises(RequestError):
            aengine.add_request("dup", [1], params(2))
        s.close()

    asyncio.run(main())
    assert aengine.num_open_streams == 0


def test_step_failure_fails_every_stream_and_marks_dead(aengine: AsyncEngine) -> None:
    executor = aengine.engine.executor

    async def main() -> None:
        executor.gate.clear()  # hold the loop inside its first step
        streams = [aengine.add_request(f"s{i}", [1], params(50)) for i in range(3)]
        executor.fail = True
        executor.gate.set()
        for s in streams:
            with pytest.raises(EngineDeadError, match="boom"):
                async for _ in s:
                    pass
        assert not aengine.is_alive and isinstance(aengine.error, RuntimeError)
        with pytest.raises(EngineDeadError):
            aengine.add_request("late", [1], params(2))

    asyncio.run(asyncio.wait_for(main(), 10))


def test_shutdown_ends_open_streams() -> None:
    ae = AsyncEngine(make_engine())
    executor = ae.engine.executor

    async def main() -> None:
        executor.gate.clear()
        s = ae.add_request("a", [1], params(100))
        threading.Timer(0.05, executor.gate.set).start()
        await asyncio.to_thread(ae.shutdown, 5)
        with pytest.raises(EngineDeadError, match="shutting down"):
            async for _ in s:
                pass

    asyncio.run(asyncio.wait_for(main(), 10))
    assert not ae.is_alive and ae._thread is not None and not ae._thread.is_alive()


def test_inter_token_latencies_count_each_output_once() -> None:
    """An output of several tokens (a multi-step round) is one inter-token gap, as vLLM counts it and
    as a streaming client sees it; an output without tokens is none."""
    from hotloop.engine.async_engine import RequestStream
    from hotloop.engine.outputs import RequestOutput

    class Owner:
        def _forget(self, request_id: str) -> None:
            pass

    async def main() -> RequestStream:
        stream = RequestStream(Owner(), "r", asyncio.get_running_loop())  # type: ignore[arg-type]
        events = [([5, 6], 10.0, False), ([7], 10.5, False), ([], 10.7, False), ([8, 9, 10, 11], 12.5, True)]
        for ids, t, done in events:
            out = RequestOutput("r", ids, "", done, "length" if done else None, 3, 0)
            stream._queue.put_nowait((out, t))
        async for _ in stream:
            pass
        return stream

    s = asyncio.run(main())
    assert s.first_token_time == 10.0 and s.last_token_time == 12.5 and s.finish_reason == "length"
    assert s.inter_token_latencies == pytest.approx([0.5, 2.0])
