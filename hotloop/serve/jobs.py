"""One HTTP request's generation: its engine requests, its concurrency slot, its cleanup.

``GenerationJob`` submits every (prompt, choice) pair of a request, merges their outputs into one
async stream, and on ``close()`` aborts what is unfinished, records metrics and frees the
``--max-concurrent-requests`` slot. ``close()`` is idempotent and synchronous, so it is safe from
any ``finally`` (including a response being torn down after the client disconnected).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from hotloop.engine.async_engine import RequestStream
from hotloop.engine.outputs import RequestOutput
from hotloop.messages import GenerationConfig, RequestError
from hotloop.serve.errors import from_request_error
from hotloop.serve.state import ServerState

T = TypeVar("T")


class GenerationJob:
    """The engine requests behind one HTTP request; use ``start`` to build one."""

    def __init__(
        self,
        state: ServerState,
        streams: list[RequestStream],
        release: Callable[[], None],
        choice_of: Sequence[bool] = (),
        score_only: bool = False,
    ) -> None:
        self.state = state
        self.streams = streams
        self._release = release
        self._closed = False
        # per stream: True for the second and later choices of one prompt (n > 1), whose prompt
        # tokens the metrics do not count again (usage reports them once too)
        self._repeat = list(choice_of) or [False] * len(streams)
        # a score-only request (/v1/completions with max_tokens 0) drops the one token it generates,
        # and neither its usage nor the metrics count it
        self._score_only = score_only

    @classmethod
    async def start(
        cls,
        state: ServerState,
        request_id: str,
        submissions: list[tuple[list[int], GenerationConfig]],
        native: bool = False,
        mm_inputs: Sequence[Any] = (),
        score_only: bool = False,
    ) -> GenerationJob:
        """Wait for a concurrency slot, then submit every ``(prompt_ids, params)`` at once
        (``mm_inputs``: the prompt's images, shared by every submission). JSON grammars are
        compiled off the event loop first (once per engine and schema: ~0.4 s for a 49k vocabulary)."""
        grammar = getattr(state.engine, "json_grammar", None)
        schemas = {p.json_schema for _, p in submissions if p.json_mode}
        if grammar is not None:
            try:
                for schema in schemas:
                    await asyncio.to_thread(grammar.compiled, schema)
            except RequestError as e:  # xgrammar is not installed, or the schema does not compile
                raise from_request_error(e, native) from e
        release = await _acquire_slot(state)
        streams: list[RequestStream] = []
        try:
            for i, (ids, params) in enumerate(submissions):
                rid = f"{request_id}-{i}"
                if mm_inputs:
                    streams.append(state.async_engine.add_request(rid, ids, params, mm_inputs=mm_inputs))
                else:
                    streams.append(state.async_engine.add_request(rid, ids, params))
        except BaseException as e:
            for s in streams:
                s.close()
            release()
            if isinstance(e, RequestError):
                raise from_request_error(e, native) from e
            raise
        seen: set[int] = set()
        repeat = []
        for ids, _ in submissions:  # the choices of one prompt share its id list
            repeat.append(id(ids) in seen)
            seen.add(id(ids))
        job = cls(state, streams, release, repeat, score_only)
        state.jobs.add(job)
        return job

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """``(submission index, output)`` in arrival order, until every stream finished."""
        if len(self.streams) == 1:
            async for o in self.streams[0]:
                yield 0, o
            return
        queue: asyncio.Queue[tuple[int, RequestOutput | None, BaseException | None]] = asyncio.Queue()

        async def pump(i: int, s: RequestStream) -> None:
            try:
                async for o in s:
                    queue.put_nowait((i, o, None))
            except BaseException as e:  # noqa: BLE001 - handed to the consumer
                queue.put_nowait((i, None, e))
                return
            queue.put_nowait((i, None, None))

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(self.streams)]
        try:
            remaining = len(tasks)
            while remaining:
                i, item, err = await queue.get()
                if err is not None:
                    raise err
                if item is None:
                    remaining -= 1
                else:
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.state.jobs.discard(self)
        try:
            for s, repeat in zip(self.streams, self._repeat, strict=True):
                s.close()
                self.state.metrics.observe_stream(
                    s, count_prompt=not repeat, count_generated=not self._score_only
                )
        finally:
            self._release()


async def _acquire_slot(state: ServerState) -> Callable[[], None]:
    sem = state.semaphore
    if sem is None:
        return _noop
    state.metrics.pending += 1
    try:
        await sem.acquire()
    finally:
        state.metrics.pending -= 1
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            sem.release()

    return release


def _noop() -> None:
    return None


def sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response that runs ``on_close`` however the response ends."""

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnect(request: Request, work: Awaitable[T]) -> T | Response:
    """Run ``work``; if the client disconnects first, cancel it (its ``finally`` aborts the
    engine requests) and answer nobody."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return Response(status_code=499)
    return task.result()
