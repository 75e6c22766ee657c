"""AsyncEngine: the engine loop on one background thread, and one async output stream per request.

The thread sleeps on a condition while the engine has nothing to do and wakes when a request or an
abort arrives. Each step's outputs are handed to the event loop that owns each request with one
``call_soon_threadsafe`` per loop per step. If a step raises, every open stream fails with
``EngineDeadError`` and the engine reports itself dead (``is_alive`` is False): clients never hang.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from hotloop.engine.outputs import RequestOutput
from hotloop.messages import GenerationConfig, RequestError
from hotloop.utils.logging import get_logger

logger = get_logger(__name__)

# A step that makes no progress while requests wait (none fits yet) sleeps this long before retrying.
_IDLE_BACKOFF_S = 0.002


class EngineDeadError(RuntimeError):
    """The engine loop is not running (a step failed, or the engine shut down)."""


class EngineCore(Protocol):
    """What AsyncEngine needs of ``hotloop.engine.engine.Engine``."""

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: GenerationConfig,
        mm_inputs: Sequence[Any] = (),
    ) -> None: ...

    def abort_request(self, request_id: str) -> None: ...

    def step(self) -> list[RequestOutput]: ...

    def has_unfinished(self) -> bool: ...


class RequestStream:
    """The outputs of one request, in order, on the event loop that submitted it.

    Iterate with ``async for``; iteration ends after the output with ``finished`` set. ``close()``
    aborts the request unless it already finished; it is idempotent and never blocks. Timing fields
    (``time.monotonic()`` seconds) are filled in as outputs are consumed, for metrics;
    ``inter_token_latencies`` holds one gap per output with tokens after the first.
    """

    def __init__(self, owner: AsyncEngine, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self._owner = owner
        self._loop = loop
        self._queue: asyncio.Queue[tuple[RequestOutput | BaseException, float]] = asyncio.Queue()
        self.finished = False
        self.finish_reason: str | None = None
        self.arrival_time = time.monotonic()
        self.first_scheduled_time: float | None = None  # written by the engine thread
        self.first_token_time: float | None = None
        self.last_token_time: float | None = None
        self.finish_time: float | None = None
        self.inter_token_latencies: list[float] = []
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item, t = await self._queue.get()
        if isinstance(item, BaseException):
            self._end(None, t)
            raise item
        if item.new_token_ids:
            # one latency per output that carries tokens, as vLLM counts it: a multi-step round's
            # burst of n tokens is one gap, as its client sees it
            if self.first_token_time is None:
                self.first_token_time = t
            elif self.last_token_time is not None:
                self.inter_token_latencies.append(t - self.last_token_time)
            self.last_token_time = t
        self.num_prompt_tokens = item.num_prompt_tokens
        self.num_generated_tokens = item.num_generated_tokens
        if item.finished:
            self._end(item.finish_reason, t)
        return item

    def _end(self, reason: str | None, t: float) -> None:
        if not self.finished:
            self.finished = True
            self.finish_reason = reason
            self.finish_time = t
            self._owner._forget(self.request_id)

    def close(self) -> None:
        """Abort the request if it has not finished; its KV blocks return to the pool."""
        if not self.finished:
            self._end("abort", time.monotonic())
            self._owner.abort(self.request_id)


class AsyncEngine:
    """Runs ``engine.step()`` on a background thread and streams outputs to asyncio callers."""

    def __init__(self, engine: Any, start: bool = True) -> None:
        self.engine = engine
        self._cond = threading.Condition()
        self._lock = threading.Lock()  # guards _streams (read by the engine thread)
        self._streams: dict[str, RequestStream] = {}
        self._stopping = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    # -- lifetime ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="hotloop-engine", daemon=True)
        self._thread.start()

    @property
    def is_alive(self) -> bool:
        """True while the loop thread runs and no step has failed."""
        t = self._thread
        return t is not None and t.is_alive() and self._error is None and not self._stopping

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def num_open_streams(self) -> int:
        return len(self._streams)

    def shutdown(self, timeout: float | None = 30.0) -> None:
        """Stop the loop after its current step and fail every open stream; idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
            if t.is_alive():
                logger.warning("the engine thread did not stop within %.0f s", timeout or 0)
        self._fail_all(EngineDeadError("the engine is shutting down"))

    # -- requests (event loop thread) ------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: GenerationConfig,
        mm_inputs: Sequence[Any] = (),
    ) -> RequestStream:
        """Submit a request; returns its stream at once. Raises ``RequestError`` for a bad request
        and ``EngineDeadError`` when the loop is not running. Call from a running event loop.
        ``mm_inputs``: the prompt's images (``hotloop.vl.ImageInput``)."""
        if not self.is_alive:
            raise self._dead_error()
        stream = RequestStream(self, request_id, asyncio.get_running_loop())
        with self._lock:
            if request_id in self._streams:
                raise RequestError(f"request id {request_id!r} is already in use", param="request_id")
            self._streams[request_id] = stream
        try:
            if mm_inputs:
                self.engine.add_request(request_id, prompt_token_ids, params, mm_inputs=mm_inputs)
            else:
                self.engine.add_request(request_id, prompt_token_ids, params)
        except BaseException:
            self._forget(request_id)
            raise
        with self._cond:
            self._cond.notify()
        return stream

    async def generate(
        self, prompt_token_ids: list[int], params: GenerationConfig, request_id: str
    ) -> AsyncIterator[RequestOutput]:
        """Yield the request's outputs; stopping early (break, cancel, disconnect) aborts it."""
        stream = self.add_request(request_id, prompt_token_ids, params)
        try:
            async for out in stream:
                yield out
        finally:
            stream.close()

    def abort(self, request_id: str, final_output: bool = False) -> None:
        """Abort a request from any thread. Its stream gets no more outputs (the caller closes it),
        or with ``final_output`` one last output, finish_reason ``abort``, which ends it."""
        if not final_output:
            self._forget(request_id)
        self.engine.abort_request(request_id)
        with self._cond:
            self._cond.notify()

    def _forget(self, request_id: str) -> None:
        with self._lock:
            self._streams.pop(request_id, None)

    def _dead_error(self) -> EngineDeadError:
        if self._error is not None and not isinstance(self._error, EngineDeadError):
            return EngineDeadError(f"the engine loop failed: {self._error!r}")
        return EngineDeadError("the engine is not running")

    # -- the loop (engine thread) ----------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                with self._cond:
                    while not self._stopping and not engine.has_unfinished():
                        self._cond.wait()
                    if self._stopping:
                        return
                steps = getattr(engine, "num_steps", None)
                t0 = time.monotonic()
                outputs = engine.step()
                if outputs:
                    self._dispatch(outputs, t0)
                elif steps is not None and getattr(engine, "num_steps", None) == steps:
                    with self._cond:  # nothing could be scheduled: wait for a change, don't spin
                        self._cond.wait(_IDLE_BACKOFF_S)
        except BaseException as e:  # noqa: BLE001 - any failure must reach the clients
            logger.exception("the engine loop failed; failing every open request")
            self._error = e
            self._fail_all(EngineDeadError(f"the engine loop failed: {e!r}"))

    def _dispatch(self, outputs: list[RequestOutput], step_start: float) -> None:
        now = time.monotonic()
        requests = getattr(self.engine, "requests", {})
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestStream, RequestOutput]]] = {}
        with self._lock:
            for o in outputs:
                s = self._streams.get(o.request_id)
                if s is None:
                    continue  # aborted by its consumer
                if s.first_scheduled_time is None:
                    req = requests.get(o.request_id)
                    t = getattr(req, "first_scheduled_time", None)
                    s.first_scheduled_time = t if t is not None else step_start
                by_loop.setdefault(s._loop, []).append((s, o))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver, items, now)
            except RuntimeError:  # the loop closed: nobody is listening
                pass

    def _fail_all(self, error: BaseException) -> None:
        now = time.monotonic()
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for s in streams:
            try:
                s._loop.call_soon_threadsafe(s._queue.put_nowait, (error, now))
            except RuntimeError:
                pass


def _deliver(items: list[tuple[RequestStream, RequestOutput]], t: float) -> None:
    for stream, output in items:
        stream._queue.put_nowait((output, t))
